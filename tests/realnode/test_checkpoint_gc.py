"""#25 on the real node: the collector `checkpoint_gc` compiles to runs as a real pod, in the
stage's image with the runtime's ConfigMap, lists the namespace's unfinished Workflows through
the API server as its emitted ServiceAccount (RBAC: `list` of workflows), and removes only the
old lines of moto's S3 that no such run uses."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from . import pipelines as pl
from .conftest import ACCESS_KEY, BUCKET, REGION, SECRET_KEY, Real
from .test_preemption import NS

pytestmark = pytest.mark.realnode

ROOT = f"s3://{BUCKET}/durapipe/spot-training"
MAX_AGE = 60
#: The lines the test writes, under ROOT, and what the collector must do to each.
OLD_UNUSED = "inputs/train/aaaa/checkpoints"  # claimed by a run that is gone
OLD_CLAIMED = "inputs/train/bbbb/checkpoints"  # claimed by a run still to finish
OLD_RESUMED = "runs/earlier/train/checkpoints"  # a run still to finish resumes from it
YOUNG = "inputs/train/cccc/checkpoints"


def _suspended_run(name: str, resume_from: dict[str, str] | None = None) -> dict[str, Any]:
    """A Workflow that has not finished (it waits at a suspend step), as a run waiting for
    its next attempt would look to the collector."""
    spec: dict[str, Any] = {"entrypoint": "wait",
                            "templates": [{"name": "wait", "suspend": {}}]}
    if resume_from is not None:
        spec["arguments"] = {"parameters": [{"name": "durapipe-resume-from",
                                             "value": json.dumps(resume_from)}]}
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


def _write_line(prefix: str, run: str, tmp: Path) -> None:
    from durapipe.runtime.checkpoint import Checkpoint
    from durapipe.runtime.claim import LineClaim
    from durapipe.runtime.store import open_store

    uri = f"{ROOT}/{prefix}"
    checkpoint = Checkpoint(uri, path=tmp / prefix, keep=2)
    checkpoint.save_sync(b"weights" * 1000, metadata={"step": 7})
    checkpoint.close()
    # The run's claim stays in the line after its attempt ends, as the runtime leaves it.
    claim = LineClaim(open_store(uri), run_id=run, lease_seconds=30)
    claim.ensure()
    claim.release()


def _restorable(prefix: str, tmp: Path) -> bool:
    from durapipe.runtime.restore import restore_newest
    from durapipe.runtime.store import open_store

    return restore_newest(open_store(f"{ROOT}/{prefix}"), tmp / "restored" / prefix) is not None


def test_the_collector_removes_old_lines_and_keeps_those_of_runs_still_to_finish(
    real: Real, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in (("AWS_ACCESS_KEY_ID", ACCESS_KEY), ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
                        ("AWS_REGION", REGION), ("AWS_ENDPOINT_URL", real.s3.endpoint)):
        monkeypatch.setenv(name, value)
    module = pl.overlay(tmp_path, "spot_training.pipe")
    # The user's overlay: collect lines a minute old rather than two weeks.
    module.write_text(module.read_text() + (
        f"\npipeline = replace(pipeline, checkpoint_gc=replace(pipeline.checkpoint_gc, "
        f"max_age={MAX_AGE}))\n"))
    docs = pl.deploy(real, module, tmp_path / "deploy")
    (cron,) = [d for d in docs if d["kind"] == "CronWorkflow"]
    assert cron["metadata"]["name"] == "spot-training-ckpt-gc"
    runs = [_suspended_run("waiting-run"),
            _suspended_run("resuming-run", {"train": f"{ROOT}/{OLD_RESUMED}"})]
    real.cluster.apply(runs)
    try:
        _write_line(OLD_UNUSED, "gone-run", tmp_path)
        _write_line(OLD_CLAIMED, "waiting-run", tmp_path)
        _write_line(OLD_RESUMED, "earlier", tmp_path)
        time.sleep(MAX_AGE + 2)  # by the store's clock too: moto dates objects as written
        _write_line(YOUNG, "gone-run", tmp_path)
        for run in runs:  # both still running (at their suspend step)
            wf = json.loads(real.cluster.kubectl("get", "workflow", run["metadata"]["name"],
                                                 "-n", NS, "-o", "json").stdout)
            assert wf["metadata"].get("labels", {}).get(
                "workflows.argoproj.io/completed") != "true"

        # What the CronWorkflow controller creates at the schedule (and `argo submit --from
        # cronwf/...` by hand): a Workflow of its workflowSpec, as compiled.
        gc = json.loads(real.cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"generateName": "spot-training-ckpt-gc-", "namespace": NS,
                         "labels": cron["metadata"]["labels"]},
            "spec": cron["spec"]["workflowSpec"]})).stdout)["metadata"]["name"]
        wf = pl.wait_finished(real, gc, NS, timeout=300)
        pl.assert_succeeded(wf)
        (pod,) = pl.pods_of(real, gc, NS)
        log = real.cluster.kubectl("logs", pod["metadata"]["name"], "-n", NS, "-c", "main",
                                   check=False).stdout
        print(log)
        said = {line.split("  ", 1)[0]: line for line in log.splitlines() if "  " in line}
        assert "removed" in said[f"{OLD_UNUSED}/"], log
        assert "kept: run waiting-run has not finished" in said[f"{OLD_CLAIMED}/"], log
        assert "kept: run resuming-run has not finished and resumes from it" in said[
            f"{OLD_RESUMED}/"], log
        assert "kept: its newest commit is" in said[f"{YOUNG}/"], log
        # The two waiting runs, and the collector's own run (which has not finished either).
        assert "keeping the lines of 3 run(s) that have not finished" in log, log

        s3 = real.s3.client()
        left = {o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket=BUCKET, Prefix="durapipe/spot-training/") for o in page.get("Contents", [])}
        assert not [k for k in left if f"/{OLD_UNUSED}/" in k], sorted(left)
        for kept in (OLD_CLAIMED, OLD_RESUMED, YOUNG):
            assert _restorable(kept, tmp_path), kept
    finally:
        for run in runs:
            real.cluster.kubectl("delete", "workflow", run["metadata"]["name"], "-n", NS,
                                 "--wait=false", check=False)
        # The lines this case wrote go, so no later case finds them in the bucket.
        s3 = real.s3.client()
        for prefix in (OLD_UNUSED, OLD_CLAIMED, OLD_RESUMED, YOUNG):
            listed = s3.list_objects_v2(Bucket=BUCKET,
                                        Prefix=f"durapipe/spot-training/{prefix}/")
            for obj in listed.get("Contents", []):
                s3.delete_object(Bucket=BUCKET, Key=obj["Key"])
