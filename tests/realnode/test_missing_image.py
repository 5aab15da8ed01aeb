"""An image that does not exist, on the real node: a GPU stage with a fallback list whose image
tag was never pushed (this machine reaches no registry, so the kubelet's pull fails the way a
missing tag does: `ErrImagePull`, then `ImagePullBackOff`).

Argo never fails a pod for that: the node stays Pending, with the container's waiting reason as
its message.  What the user must get instead of a silent hang or a silent walk down the GPU
list: `durapipe status` says, while it waits, that the attempt cannot start and why; the stage
stays on the type whose node it reached (the next type never gets a pod: the probe's wait gave
way on a node, not for want of one); and the stage ends, at its `timeout`, spending the
preemption budget, after the real time that costs."""

from __future__ import annotations

import time

import pytest

from . import pipelines as pl
from .conftest import STORE_SECRET, Real

pytestmark = pytest.mark.realnode

NS = "realnode-missing-image"
IMAGE = "ghcr.io/acme/trainer:0.0.0-never-pushed"
WAIT_S = 15
DEADLINE_S = 30
SOURCE = f'''
pipeline "missing-image" {{
  namespace      = "{NS}"
  storage        = "s3://acme-ml/durapipe"
  storage_secret = "{STORE_SECRET}"
  profile        = "eks"
}}
stage "train" {{
  image   = "{IMAGE}"
  command = ["python", "-c", "print('never runs')"]
  resources {{
    cpu    = 0.1
    memory = 128Mi
    gpu {{
      count          = 1
      types          = ["A10G", "H100"]
      fallback_after = {WAIT_S}s
    }}
  }}
  retry {{
    attempts    = 1
    preemptions = 1
  }}
  timeout = {DEADLINE_S}s
}}
'''


def test_a_missing_image_is_named_does_not_walk_the_gpu_list_and_ends_at_its_timeout(
        real: Real, tmp_path) -> None:
    source = tmp_path / "missing_image.pipe"
    source.write_text(SOURCE)
    pl.deploy(real, source, tmp_path / "deploy")
    t0 = time.monotonic()
    name = pl.submit(real, "missing-image", NS)

    # While it waits: the attempt, its type and node, the cause and the kubelet's own words.
    deadline = time.monotonic() + WAIT_S + 60
    while True:
        status = pl.durapipe("status", name, "-n", NS, real=real, check=False).stdout
        if "Cannot start" in status or time.monotonic() > deadline:
            break
        time.sleep(1)
    seen_after = time.monotonic() - t0
    print(f"status after {seen_after:.0f} s:\n{status}")
    assert "Cannot start" in status, status
    assert (f"  train train-a10g [attempt 0, A10G, node {real.node.name}]: the image cannot be "
            "pulled: check its name and tag, the registry, and the pipeline's "
            "image_pull_secrets") in status, status
    assert IMAGE in status and ("ErrImagePull" in status or "ImagePullBackOff" in status), status

    wf = pl.wait_finished(real, name, NS, timeout=WAIT_S + 2 * DEADLINE_S + 180)
    took = time.monotonic() - t0
    print(f"{name} {wf['status']['phase']} in {took:.0f} s")
    assert wf["status"]["phase"] == "Failed"
    # The probe's wait, then one attempt on the same type to its deadline: real time, not a
    # jump, and not forever.
    assert WAIT_S + DEADLINE_S <= took < WAIT_S + DEADLINE_S + 120, took

    pods = pl.pods_of(real, name, NS)
    # Every pod asked for the type whose node it reached; H100 was never tried.
    assert {p["spec"]["nodeSelector"].get("nvidia.com/gpu.product") for p in pods} == \
        {"NVIDIA-A10G"}, [p["spec"].get("nodeSelector") for p in pods]
    ran = {n["displayName"]: n["phase"] for n in wf["status"]["nodes"].values()
           if n["type"] == "Pod"}
    assert not [d for d in ran if d.startswith("train-h100")], ran

    final = pl.durapipe("status", name, "-n", NS, real=real, check=False).stdout
    print(final)
    (row,) = [line for line in final.splitlines() if line.startswith("train ")]
    # The probe that gave way on the node (its type's retry task starts with one preemption
    # spent, docs/lowering.md), then the retry that ran to its deadline and, the budget spent,
    # ended the stage: one preemption of one, no application attempt of the two spent.
    assert row.split()[3:5] == ["1/1", "0/2"], row
    assert ("on node " + real.node.name + f" but not started within {WAIT_S}s; the stage stays "
            "on this GPU type, one preemption spent") in final, final
    assert "the image cannot be pulled" in final.split("Failed attempts:")[-1], final
