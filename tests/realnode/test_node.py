"""The real node itself: a pod's container runs on containerd, the kernel's OOM killer is
real, an eviction sends a real SIGTERM, and the node's teardown check can see what it left.

Each case asserts what really happened and how long it took (printed: ``pytest -s``)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml

from e2e.images import PYTHON_IMAGE
from e2e.realnode import BRIDGE, GPU_RESOURCE

from .conftest import Real

pytestmark = pytest.mark.realnode

NS = "realnode-pods"


def pod(name: str, script: str, *, memory: str = "64Mi", grace: int = 30,
        gpus: int = 0) -> dict[str, Any]:
    limits: dict[str, str] = {"memory": memory}
    if gpus:
        limits[GPU_RESOURCE] = str(gpus)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": grace,
                     "containers": [{"name": "main", "image": PYTHON_IMAGE,
                                     "imagePullPolicy": "Never",
                                     "command": ["python3", "-c", script],
                                     "resources": {"requests": {"cpu": "50m", **limits},
                                                   "limits": limits}}]}}


def wait_phase(real: Real, name: str, phases: tuple[str, ...], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        got = json.loads(real.cluster.kubectl("get", "pod", name, "-n", NS, "-o", "json").stdout)
        if got.get("status", {}).get("phase") in phases:
            return got  # type: ignore[no-any-return]
        if time.monotonic() > deadline:
            raise AssertionError(f"pod {name} not {phases} after {timeout} s:\n"
                                 + yaml.safe_dump(got.get("status")))
        time.sleep(0.5)


def terminated(got: dict[str, Any]) -> dict[str, Any]:
    (status,) = got["status"]["containerStatuses"]
    return status["state"]["terminated"]  # type: ignore[no-any-return]


def test_a_pod_runs_its_container_and_the_teardown_check_sees_the_node(real: Real) -> None:
    real.namespace(NS)
    t0 = time.monotonic()
    real.cluster.apply([pod("hello", "import platform; print('hello from', platform.node())",
                            gpus=1)])
    got = wait_phase(real, "hello", ("Succeeded", "Failed"), 120)
    elapsed = time.monotonic() - t0
    print(f"pod to {got['status']['phase']} in {elapsed:.1f} s")
    assert got["status"]["phase"] == "Succeeded", yaml.safe_dump(got["status"])
    assert got["spec"]["nodeName"] == real.node.name
    assert terminated(got)["exitCode"] == 0
    logs = real.cluster.kubectl("logs", "hello", "-n", NS).stdout
    assert logs.startswith("hello from hello"), logs  # the pod's own hostname: a real sandbox
    # While the node runs, the check that guards its teardown reports it (so it can fail).
    left = real.node.leftovers()
    assert any(item == f"link {BRIDGE}" for item in left), left
    assert any(item.startswith("process ") and "containerd" in item for item in left), left


def test_the_kernel_oom_kills_a_container_over_its_memory_limit(real: Real) -> None:
    real.namespace(NS)
    t0 = time.monotonic()
    # 'x' * n is charged to the cgroup page by page (a zeroed bytearray would not be).
    real.cluster.apply([pod("hog", "x = 'x' * (200 * 1024 * 1024); print(len(x))",
                            memory="64Mi")])
    got = wait_phase(real, "hog", ("Succeeded", "Failed"), 120)
    print(f"OOM kill seen in {time.monotonic() - t0:.1f} s")
    end = terminated(got)
    assert (got["status"]["phase"], end["reason"], end["exitCode"]) == \
        ("Failed", "OOMKilled", 137), yaml.safe_dump(got["status"])


def test_an_eviction_sends_sigterm_and_honours_the_grace_period(real: Real) -> None:
    real.namespace(NS)
    script = ("import signal, sys, time\n"
              "def bye(*_):\n"
              "    print('SIGTERM', flush=True); time.sleep(3); sys.exit(143)\n"
              "signal.signal(signal.SIGTERM, bye)\n"
              "print('ready', flush=True)\n"
              "time.sleep(600)\n")
    real.cluster.apply([pod("victim", script, grace=20)])
    wait_phase(real, "victim", ("Running",), 120)
    deadline = time.monotonic() + 60
    while "ready" not in real.cluster.kubectl("logs", "victim", "-n", NS, check=False).stdout:
        assert time.monotonic() < deadline, "the program never started"
        time.sleep(0.5)
    t0 = time.monotonic()
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": "victim", "namespace": NS}}
    real.cluster.kubectl("create", "--raw",
                         f"/api/v1/namespaces/{NS}/pods/victim/eviction", "-f", "-",
                         input=json.dumps(eviction))
    logs = ""
    while time.monotonic() - t0 < 60:
        logs = real.cluster.kubectl("logs", "victim", "-n", NS, check=False).stdout
        if "SIGTERM" in logs:
            break
        time.sleep(0.2)
    took = time.monotonic() - t0
    print(f"SIGTERM {took:.1f} s after the eviction")
    assert "SIGTERM" in logs and took < 20, logs
