"""`durapipe submit`, `watch` and `status` on the real control plane (tests/e2e/conftest.py).

The pipeline is compiled as WorkflowTemplates and server-side applied, as Argo CD would; the
commands then run as a user runs them, with the session's kubeconfig. With
``DURAPIPE_RECORD=1`` the finished Workflow is also written to
tests/cluster/recorded/live-cli-e2e.json, a recording of the real controller to add to
tests/cluster/test_run_status.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import E2E
from .fates import Fate

pytestmark = pytest.mark.e2e

NS = "e2e-cli"
SOURCE = f"""
pipeline "cli-e2e" {{
  namespace = "{NS}"
  storage   = "s3://acme-ml/durapipe"
  profile   = "eks"
}}
params {{
  shards: int = 8
}}
stage "features" {{
  image   = "ghcr.io/acme/features:1.8.2"
  command = ["python", "-m", "features.build", "--shards", params.shards]
  resources {{ cpu = 2 }}
  retry {{
    attempts = 1
    backoff  = 2s
    on_oom {{ memory = [1Gi, 2Gi, 4Gi] }}
  }}
}}
stage "train" {{
  image   = "ghcr.io/acme/trainer:2.3.0"
  command = ["python", "train.py"]
  needs   = [features]
  resources {{
    cpu    = 8
    memory = 64Gi
    gpu {{ count = 1  types = ["A10G"] }}
  }}
  interruptible = true
  retry {{
    attempts    = 1
    preemptions = 3
    backoff     = 2s
  }}
  checkpoint = true
}}
"""
RECORDED = Path(__file__).resolve().parents[1] / "cluster" / "recorded"


def durapipe(*argv: str, kubeconfig: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "durapipe", *argv, "--kubeconfig",
                           str(kubeconfig)], capture_output=True, text=True, timeout=300,
                          check=False)


@pytest.fixture(scope="module")
def applied(e2e: E2E, tmp_path_factory: pytest.TempPathFactory) -> E2E:
    tmp = tmp_path_factory.mktemp("cli")
    (tmp / "cli.pipe").write_text(SOURCE)
    out = subprocess.run([sys.executable, "-m", "durapipe", "compile", "--kind", "template",
                          str(tmp / "cli.pipe"), "-o", f"{tmp}/manifests/"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    docs = [d for f in sorted((tmp / "manifests").glob("*.yaml"))
            for d in yaml.safe_load_all(f.read_text()) if d]
    e2e.cluster.ensure_namespace(NS)
    e2e.cluster.apply(docs)
    e2e.fates.fates["cli-e2e-"] = {"features": Fate(need_memory="3Gi"),
                                   "train": Fate(reclaim_spot=1, fail_first=1)}
    return e2e


def test_submit_watch_status(applied: E2E) -> None:
    kc = applied.cluster.kubeconfig
    sub = durapipe("submit", "--template", "cli-e2e", "-p", "shards=16", "-n", NS,
                   kubeconfig=kc)
    assert sub.returncode == 0, sub.stderr
    name = sub.stdout.strip()
    assert name.startswith("cli-e2e-") and "\n" not in name

    watch = durapipe("watch", name, "-n", NS, kubeconfig=kc)
    assert watch.returncode == 0, watch.stdout + watch.stderr
    lines = watch.stdout.splitlines()
    assert lines[0].startswith(f"{name}: ") and f"{name}: Succeeded" in watch.stdout
    assert any(line.startswith("features: ") for line in lines)

    status = durapipe("status", name, "-n", NS, "--json", kubeconfig=kc)
    assert status.returncode == 0, status.stderr
    report: dict[str, Any] = json.loads(status.stdout)
    assert report["phase"] == "Succeeded"
    stages = {s["stage"]: s for s in report["stages"]}
    assert list(stages) == ["features", "train"]
    features, train = stages["features"], stages["train"]
    # The stage needs 3Gi: 1Gi and 2Gi are OOM-killed, 4Gi runs; no application failure.
    assert [(a["memory"], a["verdict"]) for a in features["attempts"]] == [
        ("1Gi", "host_oom"), ("2Gi", "host_oom"), ("4Gi", "success")]
    assert (features["oom"]["used"], features["rungs"], features["memory"]) == (2, 3, "4Gi")
    assert features["failures"] == {"used": 0, "limit": 2}
    # One spot reclaim (preemption budget, not attempts), one application failure, success.
    assert [a["verdict"] for a in train["attempts"]] == ["preempted", "app_failure", "success"]
    assert train["preemptions"] == {"used": 1, "limit": 3}
    assert train["failures"] == {"used": 1, "limit": 2}
    assert train["gpu_type"] == "A10G" and not train["cache_hit"]

    human = durapipe("status", name, "-n", NS, kubeconfig=kc)
    assert human.returncode == 0 and "Failed attempts:" in human.stdout
    if os.environ.get("DURAPIPE_RECORD"):
        wf = json.loads(applied.cluster.kubectl("get", "workflow", name, "-n", NS,
                                                "-o", "json").stdout)
        (RECORDED / "live-cli-e2e.json").write_text(json.dumps(wf, indent=1, sort_keys=True)
                                                    + "\n")


def test_template_not_found_and_unknown_parameter(applied: E2E) -> None:
    kc = applied.cluster.kubeconfig
    missing = durapipe("submit", "--template", "no-such", "-n", NS, kubeconfig=kc)
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr.startswith("durapipe: cannot get WorkflowTemplate no-such: not found "
                                     f"in namespace {NS}")
    unknown = durapipe("submit", "--template", "cli-e2e", "-p", "shard=3", "-n", NS,
                       kubeconfig=kc)
    assert unknown.returncode == 1
    assert "unknown parameter 'shard' for WorkflowTemplate cli-e2e" in unknown.stderr
    assert "shards" in unknown.stderr and "Traceback" not in unknown.stderr


def test_rbac_forbidden(applied: E2E, tmp_path: Path) -> None:
    """A service account that may read templates but not create workflows."""
    cluster = applied.cluster
    cluster.apply([
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "reader", "namespace": NS}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "template-reader", "namespace": NS},
         "rules": [{"apiGroups": ["argoproj.io"], "resources": ["workflowtemplates"],
                    "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "reader", "namespace": NS},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "template-reader"},
         "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": NS}]},
    ])
    token = cluster.kubectl("create", "token", "reader", "-n", NS).stdout.strip()
    kc = tmp_path / "reader.kubeconfig"
    kc.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "r",
        "clusters": [{"name": "r", "cluster": {"server": cluster.server,
                                                "insecure-skip-tls-verify": True}}],
        "users": [{"name": "r", "user": {"token": token}}],
        "contexts": [{"name": "r", "context": {"cluster": "r", "user": "r", "namespace": NS}}],
    }))
    denied = durapipe("submit", "--template", "cli-e2e", kubeconfig=kc)
    assert denied.returncode == 1, denied.stdout
    assert denied.stderr.startswith("durapipe: not allowed to create Workflow cli-e2e-* (RBAC): ")
    assert 'cannot create resource "workflows"' in denied.stderr
    status = durapipe("status", "anything", kubeconfig=kc)
    assert status.returncode == 1 and "not allowed to get Workflow anything (RBAC)" in status.stderr
