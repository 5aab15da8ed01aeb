"""`durapipe doctor` on the real control plane: every check passes on the e2e install, and
each prerequisite removed in turn (then restored) fails its own check, with its fix, and
exits 1."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from .cluster import ARGO_NAMESPACE, argo_manifests, jobset_crd
from .conftest import E2E

pytestmark = pytest.mark.e2e

NS = "e2e-doctor"
SOURCE = f"""
pipeline "doctor-check" {{
  namespace = "{NS}"
  storage   = "s3://acme-ml/durapipe"
}}
stage "prep" {{
  image   = "ghcr.io/acme/churn:4.1.0"
  command = ["python", "-m", "churn.prep"]
  resources {{ cpu = 1  memory = 1Gi }}
  cache {{ max_age = 7d }}
}}
"""
ROOT = Path(__file__).resolve().parents[2]


def doctor(*argv: str, kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "durapipe", "doctor", *argv, "--kubeconfig",
                           str(kubeconfig)], capture_output=True, text=True, timeout=120,
                          check=False, cwd=ROOT)


def failing(out: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in out.stdout.splitlines() if line.startswith("FAIL")]


@pytest.fixture(scope="module")
def applied(e2e: E2E, tmp_path_factory: pytest.TempPathFactory) -> tuple[E2E, Path]:
    tmp = tmp_path_factory.mktemp("doctor")
    pipe = tmp / "doctor.pipe"
    pipe.write_text(SOURCE)
    out = subprocess.run([sys.executable, "-m", "durapipe", "compile", "--gitops", str(pipe),
                          "-o", f"{tmp}/deploy/"], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    docs = [d for f in sorted((tmp / "deploy").glob("*.yaml"))
            for d in yaml.safe_load_all(f.read_text()) if d and d["kind"] != "Kustomization"]
    e2e.cluster.ensure_namespace(NS)
    e2e.cluster.apply(docs)
    return e2e, pipe


def test_doctor_passes_then_fails_each_prerequisite_removed(
        applied: tuple[E2E, Path]) -> None:
    e2e, pipe = applied
    cluster = e2e.cluster
    kc = cluster.kubeconfig
    kubectl = cluster.kubectl

    clean = doctor(str(pipe), kubeconfig=kc)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    names = [line.split(":")[0].split(None, 1)[1] for line in clean.stdout.splitlines()]
    assert names == ["Argo CRDs", "Argo version", "memoization RBAC", "artifact repository",
                     "runtime ConfigMap", "service account doctor-check-durapipe",
                     "RBAC of doctor-check-durapipe"], clean.stdout

    def removed(remove: Callable[[], Any], restore: Callable[[], Any], check: str,
                fix: str, *argv: str) -> None:
        remove()
        try:
            out = doctor(*(argv or (str(pipe),)), kubeconfig=kc)
            assert out.returncode == 1, out.stdout
            assert [f.split(":")[0] for f in failing(out)] == [f"FAIL  {check}"], out.stdout
            lines = out.stdout.splitlines()
            at = next(i for i, line in enumerate(lines) if line.startswith("FAIL"))
            assert lines[at + 1].startswith("      fix: ") and fix in lines[at + 1]
            assert "Traceback" not in out.stderr
        finally:
            restore()

    memo = kubectl("get", "rolebinding", "durapipe-memoization", "-n", ARGO_NAMESPACE,
                   "-o", "json").stdout
    removed(lambda: kubectl("delete", "rolebinding", "durapipe-memoization", "-n",
                            ARGO_NAMESPACE),
            lambda: kubectl("create", "-f", "-", input=_fresh(memo)),
            "memoization RBAC", "durapipe-memoization")

    config = json.loads(kubectl("get", "configmap", "workflow-controller-configmap", "-n",
                                ARGO_NAMESPACE, "-o", "json").stdout)
    repo = config["data"]["artifactRepository"]
    removed(lambda: kubectl("patch", "configmap", "workflow-controller-configmap", "-n",
                            ARGO_NAMESPACE, "--type=json",
                            "-p", '[{"op":"remove","path":"/data/artifactRepository"}]'),
            lambda: kubectl("patch", "configmap", "workflow-controller-configmap", "-n",
                            ARGO_NAMESPACE, "--type=merge",
                            "-p", json.dumps({"data": {"artifactRepository": repo}})),
            "artifact repository", "artifactRepository", "-n", NS)

    runtime = kubectl("get", "configmap", "-n", NS, "-l",
                      "app.kubernetes.io/component=durapipe-runtime", "-o", "json").stdout
    runtime_item = json.loads(runtime)["items"][0]
    removed(lambda: kubectl("delete", "configmap", runtime_item["metadata"]["name"], "-n", NS),
            lambda: kubectl("create", "-f", "-", input=_fresh(json.dumps(runtime_item))),
            "runtime ConfigMap", "durapipe-runtime.yaml")

    binding = kubectl("get", "rolebinding", "doctor-check-durapipe", "-n", NS,
                      "-o", "json").stdout
    removed(lambda: kubectl("delete", "rolebinding", "doctor-check-durapipe", "-n", NS),
            lambda: kubectl("create", "-f", "-", input=_fresh(binding)),
            "RBAC of doctor-check-durapipe", "Role and RoleBinding")

    account = kubectl("get", "serviceaccount", "doctor-check-durapipe", "-n", NS,
                      "-o", "json").stdout
    # Without the account its RBAC check still passes: a binding names the account, whether or
    # not it exists, so only the account's own check fails.
    removed(lambda: kubectl("delete", "serviceaccount", "doctor-check-durapipe", "-n", NS),
            lambda: kubectl("create", "-f", "-", input=_fresh(account)),
            "service account doctor-check-durapipe",
            "kubectl create serviceaccount doctor-check-durapipe")

    crd = argo_manifests() / "base" / "crds" / "full" / "argoproj.io_cronworkflows.yaml"
    removed(lambda: kubectl("delete", "crd", "cronworkflows.argoproj.io"),
            lambda: _restore_crd(kubectl, crd, "cronworkflows.argoproj.io"),
            "Argo CRDs", "install Argo Workflows")

    after = doctor(str(pipe), kubeconfig=kc)
    assert after.returncode == 0, after.stdout


def test_doctor_checks_jobset_where_a_stage_is_multi_node(applied: tuple[E2E, Path]) -> None:
    e2e, _ = applied
    kc = e2e.cluster.kubeconfig
    example = str(ROOT / "examples" / "multinode_pretrain.pipe")
    installed = doctor(example, "-n", NS, kubeconfig=kc)
    assert any(line.startswith("ok    JobSet CRD: installed")
               for line in installed.stdout.splitlines()), installed.stdout
    without = doctor(str(applied[1]), kubeconfig=kc)
    assert "JobSet CRD" not in without.stdout
    e2e.cluster.kubectl("delete", "crd", "jobsets.jobset.x-k8s.io")
    try:
        gone = doctor(example, "-n", NS, kubeconfig=kc)
        assert gone.returncode == 1
        assert "FAIL  JobSet CRD: missing (a multi-node stage runs as a JobSet)" in gone.stdout
        assert "fix: install JobSet" in gone.stdout
    finally:
        _restore_crd(e2e.cluster.kubectl, jobset_crd(), "jobsets.jobset.x-k8s.io")


def _restore_crd(kubectl: Callable[..., Any], path: Path, name: str) -> None:
    """Apply the CRD again and wait until it is served (right after a create its status has
    no conditions yet, which `kubectl wait` refuses)."""
    kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=durapipe-e2e",
            "-f", str(path))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if kubectl("wait", "--for=condition=Established", "--timeout=10s", f"crd/{name}",
                   check=False).returncode == 0:
            return
        time.sleep(0.5)
    raise AssertionError(f"CRD {name} not established again within 60 s")


def _fresh(text: str) -> str:
    """An object read back, made creatable again: without what the server set."""
    obj = json.loads(text)
    meta = obj["metadata"]
    for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
        meta.pop(key, None)
    return json.dumps(obj)
