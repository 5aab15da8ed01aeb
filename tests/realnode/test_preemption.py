"""examples/spot_training.pipe on the real node, evicted mid-training through the API: the
kubelet's SIGTERM reaches the trainer, the runtime's final save is committed by the upload
sidecar within the grace period, and the next attempt resumes from it, spending the
preemption budget, not the application budget."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from . import pipelines as pl
from .conftest import Real

pytestmark = pytest.mark.realnode

NS = "ml-training"
TEMPLATE = "spot-training"
MiB = 2**20


def main_log(real: Real, pod: str) -> str:
    return real.cluster.kubectl("logs", pod, "-n", NS, "-c", "main", check=False).stdout


def train_pods(real: Real, workflow: str) -> list[dict[str, Any]]:
    return sorted(pl.pods_of(real, workflow, NS),
                  key=lambda p: p["metadata"]["creationTimestamp"])


def pod_node_phase(real: Real, workflow: str) -> str | None:
    wf = json.loads(real.cluster.kubectl("get", "workflow", workflow, "-n", NS, "-o",
                                         "json").stdout)
    phases = [n["phase"] for n in wf.get("status", {}).get("nodes", {}).values()
              if n.get("type") == "Pod"]
    return phases[0] if len(phases) == 1 else None


def trained(real: Real, workflow: str, epochs: int, timeout: float = 300
            ) -> tuple[dict[str, Any], int]:
    """The run's first train pod once it has trained ``epochs`` epochs and Argo sees its
    node Running, with the epochs it reached.  A pod that vanishes while its node is still
    Pending to the controller is created again under the same name, as if it never ran
    (v4.1.2 `podReconciliation`; seen here when an eviction came 3 s into the run)."""
    deadline = time.monotonic() + timeout
    first: dict[str, Any] | None = None
    reached = 0
    while reached < epochs or pod_node_phase(real, workflow) != "Running":
        assert time.monotonic() < deadline, f"the first attempt never trained {epochs} epochs"
        pods = train_pods(real, workflow)
        if pods:
            first = pods[0]
            done = re.findall(r"epoch (\d+) done", main_log(real, first["metadata"]["name"]))
            reached = int(done[-1]) if done else 0
        time.sleep(0.5)
    assert first is not None
    return first, reached


def test_an_evicted_trainer_saves_resumes_and_spends_a_preemption(real: Real, tmp_path) -> None:
    module = pl.overlay(tmp_path, "spot_training.pipe", cpu=100, memory=256 * MiB)
    pl.deploy(real, module, tmp_path / "deploy")
    name = pl.submit(real, TEMPLATE, NS, "epochs=40", "epoch_seconds=0.5")

    # Evicted once Argo has seen the attempt run (`trained`).
    first, reached = trained(real, name, 4)
    pod = first["metadata"]["name"]
    grace = first["spec"]["terminationGracePeriodSeconds"]

    t0 = time.monotonic()
    real.cluster.kubectl("create", "--raw", f"/api/v1/namespaces/{NS}/pods/{pod}/eviction",
                         "-f", "-", input=json.dumps({
                             "apiVersion": "policy/v1", "kind": "Eviction",
                             "metadata": {"name": pod, "namespace": NS}}))
    while real.cluster.kubectl("get", "pod", pod, "-n", NS, check=False).returncode == 0:
        assert time.monotonic() - t0 < grace + 30, f"{pod} outlived its grace period"
        time.sleep(0.5)
    gone = time.monotonic() - t0
    print(f"evicted at epoch >= {reached}; pod gone {gone:.1f} s later (grace {grace} s)")
    assert gone < grace

    wf = pl.wait_finished(real, name, NS, timeout=600)
    pl.assert_succeeded(wf)
    pods = train_pods(real, name)
    assert pod not in [p["metadata"]["name"] for p in pods]
    (resumed,) = pods
    started = re.findall(r"starting at epoch (\d+)", main_log(real, resumed["metadata"]["name"]))
    print(f"the next attempt started at epoch {started}")
    assert started and int(started[0]) >= reached, started

    # One preemption spent: the task retried inside its own retryStrategy (the preemption
    # budget), and no application attempt (`train-app-1`) ever started.
    nodes = wf["status"]["nodes"].values()
    displays = [n["displayName"] for n in nodes]
    later = {n["displayName"]: n["phase"] for n in nodes
             if n["displayName"].startswith(("train-app-1", "train-app-2"))}
    assert later and set(later.values()) == {"Omitted"}, later
    retried = [n for n in wf["status"]["nodes"].values()
               if n.get("type") == "Retry" and n["displayName"] == "train-app-0"]
    assert retried and len(retried[0]["children"]) == 2, displays
    status = pl.durapipe("status", name, "-n", NS, real=real).stdout
    print(status)
    (row,) = [line for line in status.splitlines() if line.startswith("train ")]
    assert "1/10" in row.split(), row  # PREEMPT: one of the ten spent
