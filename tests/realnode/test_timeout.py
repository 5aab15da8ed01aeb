"""A stage `timeout` on the real node: the kubelet itself enforces each attempt's
`activeDeadlineSeconds` (the pod `Failed`, reason `DeadlineExceeded`, main stopped by SIGTERM),
Argo retries the attempt from the preemption budget, never from `attempts`, and the stage fails
once that budget is spent, after about two deadlines of real time."""

from __future__ import annotations

import time

import pytest

from . import pipelines as pl
from .conftest import STORE_SECRET, Real

pytestmark = pytest.mark.realnode

NS = "realnode-timeout"
DEADLINE_S = 15
SOURCE = f'''
pipeline "slow" {{
  namespace      = "{NS}"
  storage        = "s3://acme-ml/durapipe"
  storage_secret = "{STORE_SECRET}"
}}
stage "train" {{
  image   = "ghcr.io/acme/trainer:2.3.0"
  command = ["python", "-c", "import time; print('training', flush=True); time.sleep(600)"]
  resources {{
    cpu    = 0.1
    memory = 128Mi
  }}
  retry {{
    attempts    = 1
    preemptions = 1
  }}
  timeout = {DEADLINE_S}s
}}
'''


def test_each_attempt_ends_at_its_deadline_and_spends_the_preemption_budget(real: Real,
                                                                             tmp_path) -> None:
    source = tmp_path / "slow.pipe"
    source.write_text(SOURCE)
    pl.deploy(real, source, tmp_path / "deploy")
    t0 = time.monotonic()
    name = pl.submit(real, "slow", NS)

    # `durapipe logs -f` on the first attempt's real pod: the line the program wrote, then the
    # end of the follow when the kubelet stops the container at its deadline, not before.
    while not any(c.get("state", {}).get("running") for p in pl.pods_of(real, name, NS)
                  for c in p.get("status", {}).get("containerStatuses", ())
                  if c["name"] == "main"):
        assert time.monotonic() - t0 < 120, pl.pods_of(real, name, NS)
        time.sleep(0.5)
    followed_at = time.monotonic()
    follow = pl.durapipe("logs", name, "train", "-f", "-n", NS, real=real,
                         timeout=DEADLINE_S + 60)
    followed = time.monotonic() - followed_at
    print(f"logs -f ended after {followed:.1f} s:\n{follow.stdout}")
    assert "training" in follow.stdout.splitlines(), follow.stdout
    # It ended with the container, at the attempt's deadline (counted from the pod's start,
    # a little before main started), not at once and not never.
    assert 0.5 * DEADLINE_S <= followed < DEADLINE_S + 30, followed

    wf = pl.wait_finished(real, name, NS, timeout=300)
    took = time.monotonic() - t0
    print(f"{name} {wf['status']['phase']} in {took:.0f} s")
    assert wf["status"]["phase"] == "Failed"
    pods = sorted(pl.pods_of(real, name, NS), key=lambda p: p["metadata"]["creationTimestamp"])
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]  # first attempt + 1 preemption
    for pod in pods:
        assert (pod["status"]["phase"], pod["status"].get("reason")) == \
            ("Failed", "DeadlineExceeded"), pod["status"]
        assert pod["spec"]["activeDeadlineSeconds"] == DEADLINE_S
    # Two deadlines of real time (plus pod start-up), not a simulated jump and not forever.
    assert 2 * DEADLINE_S <= took < 2 * DEADLINE_S + 120, took
    displays = {n["displayName"]: n["phase"] for n in wf["status"]["nodes"].values()}
    assert displays.get("train-app-1") in (None, "Omitted", "Skipped"), displays  # never ran
    status = pl.durapipe("status", name, "-n", NS, real=real, check=False).stdout
    print(status)
    (row,) = [line for line in status.splitlines() if line.startswith("train ")]
    # Both attempts read as preemptions (the second ended the stage: the budget of one was
    # spent), none as an application failure.
    assert "0/2" in row.split(), row
    assert status.count("preempted (exit 143): Pod was active on the node longer than the "
                        "specified deadline") == 2, status
