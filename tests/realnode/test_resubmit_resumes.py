"""#25 on the real node: a run whose trainer is evicted with no preemption budget left fails
for good; the same pipeline submitted again with the same params resumes from the failed
run's last commit (the checkpoint line is named by the stage's inputs, `scope = "inputs"`),
through moto's S3, and a run with another param starts at epoch 0."""

from __future__ import annotations

import json
import re
import time

import pytest

from . import pipelines as pl
from .conftest import Real
from .test_preemption import NS, TEMPLATE, main_log, train_pods, trained

pytestmark = pytest.mark.realnode

MiB = 2**20


def started_at(real: Real, workflow: str) -> list[int]:
    return [int(n) for pod in train_pods(real, workflow) for n in
            re.findall(r"starting at epoch (\d+)", main_log(real, pod["metadata"]["name"]))]


def test_a_run_failed_for_good_is_resubmitted_and_resumes_from_its_last_commit(
    real: Real, tmp_path,
) -> None:
    module = pl.overlay(tmp_path, "spot_training.pipe", cpu=100, memory=256 * MiB,
                        preemptions=0)
    pl.deploy(real, module, tmp_path / "deploy")
    params = ("epochs=30", "epoch_seconds=0.5")
    first = pl.submit(real, TEMPLATE, NS, *params)

    trainer, reached = trained(real, first, 4)
    pod = trainer["metadata"]["name"]
    grace = trainer["spec"]["terminationGracePeriodSeconds"]
    t0 = time.monotonic()
    real.cluster.kubectl("create", "--raw", f"/api/v1/namespaces/{NS}/pods/{pod}/eviction",
                         "-f", "-", input=json.dumps({
                             "apiVersion": "policy/v1", "kind": "Eviction",
                             "metadata": {"name": pod, "namespace": NS}}))
    log = ""
    while real.cluster.kubectl("get", "pod", pod, "-n", NS, check=False).returncode == 0:
        log = main_log(real, pod) or log
        # The trainer stops at its next epoch and the agent commits its final save: seconds.
        assert time.monotonic() - t0 < grace / 2, f"{pod} lingered after the eviction:\n{log}"
        time.sleep(0.5)
    print(f"run 1's pod gone {time.monotonic() - t0:.1f} s after the eviction:\n{log}")
    failed = pl.wait_finished(real, first, NS, timeout=300)
    phases = {n["displayName"]: n["phase"] for n in failed["status"]["nodes"].values()}
    print(f"run 1 evicted at epoch >= {reached}: {phases}")
    # Failed, or Error where Argo saw the evicted pod deleted before its containers' end.
    assert failed["status"]["phase"] in ("Failed", "Error"), phases
    # The preemption had no budget and is never an application failure: no second attempt.
    assert phases.get("train-app-1") in (None, "Omitted"), phases

    # The same inputs: a new run (a new Workflow name), the previous run's line.
    second = pl.submit(real, TEMPLATE, NS, *params)
    assert second != first
    pl.assert_succeeded(pl.wait_finished(real, second, NS, timeout=600))
    (resumed,) = started_at(real, second)
    print(f"run 2 started at epoch {resumed}")
    assert resumed >= reached, (resumed, reached)
    # `status` names the commit and the inputs-keyed line the new run resumed from.
    status = pl.durapipe("status", second, "-n", NS, real=real).stdout
    print(status)
    (said,) = [line for line in status.splitlines() if line.startswith("  train: #")]
    assert f"(epoch {resumed})" in said and "/spot-training/inputs/train/" in said, said

    # Another learning rate: another line, from epoch 0.
    third = pl.submit(real, TEMPLATE, NS, *params, "lr=0.01")
    pl.assert_succeeded(pl.wait_finished(real, third, NS, timeout=600))
    assert started_at(real, third) == [0]
