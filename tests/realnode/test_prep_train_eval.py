"""examples/prep_train_eval.pipe, as compiled, on the real node: every container runs.

Argo's init and wait containers (argoexec v4.1.2, built here), the runtime's preflight init
container and its zipapp from the runtime ConfigMap, the upload sidecar of the checkpointing
train stage, and the example's own programs (examples/churn) in the image the example names.
What is asserted is what happened: the bytes the wait containers uploaded, what the consumers
computed from the bytes they downloaded, the content hashes the runtime reported, and on a
second submission the cache hits that create no pod."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from durapipe.runtime.hashing import hash_path

from e2e.cluster import ARGO_NAMESPACE

from . import pipelines as pl
from .conftest import BUCKET, Real

pytestmark = pytest.mark.realnode

NS = "ml-training"  # the example's own namespace
TEMPLATE = "churn-model"


def node_by_name(wf: dict[str, Any], display: str) -> dict[str, Any]:
    (node,) = [n for n in wf["status"]["nodes"].values() if n.get("displayName") == display]
    return node


def artifact_bytes(real: Real, wf: dict[str, Any], stage: str, name: str) -> dict[str, bytes]:
    """The files of a stage's output artifact as the wait container of its succeeded pod
    uploaded it (a .tgz in the artifact repository)."""
    (node,) = [n for n in wf["status"]["nodes"].values()
               if n.get("templateName") == f"{stage}-pod" and n.get("type") == "Pod"
               and n.get("phase") == "Succeeded"]
    (art,) = [a for a in node["outputs"]["artifacts"] if a["name"] == name]
    key = art["s3"]["key"]
    body = real.s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read()
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile():
                extracted = tar.extractfile(member)
                assert extracted is not None
                files[member.name.split("/", 1)[-1]] = extracted.read()
    return files


def run_locally(tmp: Path, module: str, *args: str) -> None:
    subprocess.run([sys.executable, "-m", module, *args], check=True, capture_output=True,
                   cwd=tmp, env={"PYTHONPATH": str(pl.EXAMPLES), "PATH": "/usr/bin:/bin"})


def test_prep_train_eval_runs_every_container_and_a_resubmission_hits_the_cache(
        real: Real, tmp_path: Path) -> None:
    module = pl.overlay(tmp_path, "prep_train_eval.pipe", cpu=100, memory=256 * 2**20)
    first, wf, _ = pl.run_to_end(real, module, tmp_path, TEMPLATE, NS, "snapshot=2026-11-02",
                                 "max_depth=3", timeout=600)
    pl.assert_succeeded(wf)

    # prep's table as the wait container uploaded it is the table churn.prep makes for this
    # snapshot: the bytes moved unchanged.
    local = tmp_path / "local"
    local.mkdir()
    run_locally(local, "churn.prep", "--snapshot", "2026-11-02", "--out", str(local / "data"))
    uploaded = artifact_bytes(real, wf, "prep", "data")
    expected = {p.relative_to(local / "data").as_posix(): p.read_bytes()
                for p in (local / "data").rglob("*") if p.is_file()}
    assert uploaded == expected
    # The runtime's content hash of prep's output, as Argo passed it on, is the hash of those
    # bytes.
    prep_hash = node_by_name(wf, "prep")["outputs"]["parameters"]
    (data_hash,) = [p["value"] for p in prep_hash if p["name"] == "data-hash"]
    # (the image has no blake3 module: the runtime hashes with sha256 there, and says so)
    algorithm = data_hash.split(":", 1)[0]
    assert data_hash == hash_path(local / "data", algorithm)
    # train fitted on what it downloaded: the same model as a local fit of the same table.
    run_locally(local, "churn.train", "--data", str(local / "data"), "--max-depth", "3",
                "--out", str(local / "model"))
    model = artifact_bytes(real, wf, "train", "model")
    assert model == {"model.json": (local / "model" / "model.json").read_bytes()}
    report = artifact_bytes(real, wf, "eval", "report")
    assert report, "eval uploaded no report"

    # Every container of every pod ran for real, the runtime from its ConfigMap mount.
    pods = pl.pods_of(real, first, NS)
    containers = {(p["metadata"]["labels"].get("durapipe.dev/stage"), c["name"],
                   c["state"].get("terminated", {}).get("exitCode"))
                  for p in pods for c in [*p["status"].get("initContainerStatuses", []),
                                          *p["status"]["containerStatuses"]]}
    for stage in ("prep", "train", "eval"):
        for container in ("init", "durapipe-preflight", "wait", "main"):
            assert (stage, container, 0) in containers, sorted(containers, key=str)
    assert ("train", "durapipe-uploader", 0) in containers, sorted(containers, key=str)
    assert all(p["spec"]["nodeName"] == real.node.name for p in pods)

    # The same inputs again: prep and train are cache hits and create no pod; eval runs.
    t1 = time.monotonic()
    second = pl.submit(real, TEMPLATE, NS, "snapshot=2026-11-02", "max_depth=3")
    wf2 = pl.wait_finished(real, second, NS, timeout=300)
    print(f"second run {wf2['status']['phase']} in {time.monotonic() - t1:.0f} s")
    assert wf2["status"]["phase"] == "Succeeded"
    stages = {p["metadata"]["labels"].get("durapipe.dev/stage") for p in pl.pods_of(real, second, NS)}
    assert stages == {"eval"}
    for stage in ("prep", "train"):
        assert node_by_name(wf2, stage).get("memoizationStatus", {}).get("hit") is True, stage
    # Argo v4.1.2 keeps the memoization cache in the controller's namespace, not the
    # workflow's, and the narrow Role there (tests/e2e/cluster.py) is all it needed.
    # Its entries are spread by their keys' first hex digit over durapipe-cache-churn-model-<d>.
    found = json.loads(real.cluster.kubectl("get", "configmaps", "-A", "-o", "json").stdout)
    where = {(cm["metadata"]["namespace"], cm["metadata"]["name"]) for cm in found["items"]
             if cm["metadata"]["name"].startswith("durapipe-cache-churn-model-")}
    keys = {key for cm in found["items"] if cm["metadata"]["name"].startswith(
        "durapipe-cache-churn-model-") for key in cm.get("data") or {}}
    assert where == {(ARGO_NAMESPACE, f"durapipe-cache-churn-model-{k[0]}") for k in keys}, where
    assert len(keys) == 2, keys  # prep's and train's
    status = pl.durapipe("status", second, "-n", NS, real=real).stdout
    print(status)
    assert "hit" in status
