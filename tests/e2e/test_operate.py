"""`durapipe submit --watch`, `list`, `resubmit`, `delete`, `stop` and `terminate` on the real
control plane (tests/e2e/conftest.py): Argo's own controller acts on what they send.

`durapipe logs` is tested against the fake API (tests/cluster/test_operate.py): KWOK's pods
have no logs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import E2E
from .fates import Fate

pytestmark = pytest.mark.e2e

NS = "e2e-operate"


def source(name: str) -> str:
    return f"""
pipeline "{name}" {{
  namespace = "{NS}"
  storage   = "s3://acme-ml/durapipe"
}}
params {{
  snapshot: str = "2026-11-01"
}}
stage "prep" {{
  image   = "ghcr.io/acme/churn:4.1.0"
  command = ["python", "-m", "churn.prep", "--snapshot", params.snapshot]
  resources {{ cpu = 1  memory = 1Gi }}
  cache {{ max_age = 7d }}
}}
stage "train" {{
  image   = "ghcr.io/acme/churn:4.1.0"
  command = ["python", "-m", "churn.train"]
  needs   = [prep]
  resources {{ cpu = 1  memory = 1Gi }}
}}
"""


def durapipe(*argv: str, kubeconfig: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "durapipe", *argv, "-n", NS, "--kubeconfig",
                           str(kubeconfig)], capture_output=True, text=True, timeout=300,
                          check=False)


@pytest.fixture(scope="module")
def applied(e2e: E2E, tmp_path_factory: pytest.TempPathFactory) -> E2E:
    tmp = tmp_path_factory.mktemp("operate")
    docs: list[dict[str, Any]] = []
    for name in ("ops-quick", "ops-slow"):
        (tmp / f"{name}.pipe").write_text(source(name))
        out = subprocess.run([sys.executable, "-m", "durapipe", "compile", "--kind", "template",
                              str(tmp / f"{name}.pipe"), "-o", f"{tmp}/{name}/"],
                             capture_output=True, text=True, check=False)
        assert out.returncode == 0, out.stderr
        docs += [d for f in sorted((tmp / name).glob("*.yaml"))
                 for d in yaml.safe_load_all(f.read_text()) if d]
    e2e.cluster.ensure_namespace(NS)
    e2e.cluster.apply(docs)
    e2e.fates.fates["ops-quick-"] = {"prep": Fate(seconds=1), "train": Fate(seconds=1)}
    e2e.fates.fates["ops-slow-"] = {"prep": Fate(seconds=1), "train": Fate(seconds=600)}
    return e2e


def status_of(name: str, kubeconfig: Path) -> dict[str, Any]:
    out = durapipe("status", name, "--json", kubeconfig=kubeconfig)
    assert out.returncode == 0, out.stderr
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def test_submit_watch_list_resubmit_delete(applied: E2E) -> None:
    kc = applied.cluster.kubeconfig
    sub = durapipe("submit", "--template", "ops-quick", "-p", "snapshot=2026-12-01", "--watch",
                   kubeconfig=kc)
    assert sub.returncode == 0, sub.stderr
    first = sub.stdout.strip()
    assert first.startswith("ops-quick-") and f"{first}: Succeeded" in sub.stderr

    again = durapipe("resubmit", first, kubeconfig=kc)
    assert again.returncode == 0, again.stderr
    second = again.stdout.strip()
    assert second.startswith("ops-quick-") and second != first
    watched = durapipe("watch", second, kubeconfig=kc)
    assert watched.returncode == 0, watched.stdout + watched.stderr
    report = status_of(second, kc)
    stages = {s["stage"]: s for s in report["stages"]}
    # The same parameters, so the cached stage's key is the same: a cache hit.
    assert stages["prep"]["cache_hit"] and not stages["train"]["cache_hit"]
    wf = json.loads(applied.cluster.kubectl("get", "workflow", second, "-n", NS,
                                            "-o", "json").stdout)
    assert wf["spec"]["arguments"]["parameters"] == [{"name": "snapshot",
                                                      "value": "2026-12-01"}]

    listed = durapipe("list", "ops-quick", kubeconfig=kc)
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()
    assert [r.split()[0] for r in rows[1:]] == [second, first]
    assert all(" Succeeded " in r for r in rows[1:])
    assert "2/2 succeeded, 1 cached" in rows[1] and "2/2 succeeded" in rows[2]

    gone = durapipe("delete", first, kubeconfig=kc)
    assert (gone.returncode, gone.stdout) == (0, f"{first}: deleted\n"), gone.stderr
    missing = durapipe("status", first, kubeconfig=kc)
    assert missing.returncode == 1
    listed = durapipe("list", "ops-quick", "--json", kubeconfig=kc)
    assert [r["name"] for r in json.loads(listed.stdout)] == [second]
    nope = durapipe("delete", first, kubeconfig=kc)
    assert nope.returncode == 1 and nope.stderr == (
        f"durapipe: no run {first} in namespace {NS}; `durapipe list PIPELINE -n {NS}` "
        "lists a pipeline's runs\n")


def _wait_running(name: str, stage: str, kubeconfig: Path, within_s: float = 120) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        stages = {s["stage"]: s for s in status_of(name, kubeconfig)["stages"]}
        if stages.get(stage, {}).get("phase") == "Running":
            return
        time.sleep(1)
    raise AssertionError(f"{stage} of {name} never ran")


@pytest.mark.parametrize("command,strategy", [("stop", "Stop"), ("terminate", "Terminate")])
def test_stop_and_terminate_end_a_running_run(applied: E2E, command: str,
                                              strategy: str) -> None:
    kc = applied.cluster.kubeconfig
    sub = durapipe("submit", "--template", "ops-slow", kubeconfig=kc)
    assert sub.returncode == 0, sub.stderr
    name = sub.stdout.strip()
    _wait_running(name, "train", kc)
    t0 = time.monotonic()
    ended = durapipe(command, name, kubeconfig=kc)
    assert ended.returncode == 0, ended.stderr
    assert ended.stdout.startswith(f"{name}: {command} requested")
    watched = durapipe("watch", name, kubeconfig=kc)
    elapsed = time.monotonic() - t0
    assert watched.returncode in (1, 2), watched.stdout + watched.stderr
    report = status_of(name, kc)
    assert report["phase"] in ("Failed", "Error")
    assert strategy in report["message"], report["message"]
    assert elapsed < 120  # the 600 s stage did not run to its end
    twice = durapipe(command, name, kubeconfig=kc)
    assert twice.returncode == 1 and "already ended" in twice.stderr
