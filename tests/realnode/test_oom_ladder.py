"""examples/oom_escalation.pipe on the real node: the kernel's OOM killer ends the first rung,
and the ladder climbs to a rung that succeeds; `durapipe status` tells the user so."""

from __future__ import annotations

import pytest

from . import pipelines as pl
from .conftest import Real

pytestmark = pytest.mark.realnode

NS = "ml-data"  # the example's namespace
TEMPLATE = "feature-build"
MiB = 2**20


def test_a_real_oom_kill_climbs_the_ladder_to_a_rung_that_fits(real: Real, tmp_path) -> None:
    # A shard of 3M rows holds ~100 MiB of floats: over a 64Mi rung, well under 256Mi.
    module = pl.overlay(tmp_path, "oom_escalation.pipe", cpu=100,
                        ladder=(64 * MiB, 256 * MiB))
    name, wf, _ = pl.run_to_end(real, module, tmp_path, TEMPLATE, NS, "shards=2",
                                "rows=3000000", timeout=600)
    pl.assert_succeeded(wf)

    # What the kubelet saw: the 64Mi pod's main container OOM-killed by the kernel (137), the
    # 256Mi one done.
    ends = []
    for pod in sorted(pl.pods_of(real, name, NS), key=lambda p: p["metadata"]["creationTimestamp"]):
        (main,) = [c for c in pod["spec"]["containers"] if c["name"] == "main"]
        (status,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == "main"]
        end = status["state"]["terminated"]
        ends.append((main["resources"]["limits"]["memory"], end["reason"], end["exitCode"]))
    assert ends == [("64Mi", "OOMKilled", 137), ("256Mi", "Completed", 0)], ends

    status = pl.durapipe("status", name, "-n", NS, real=real).stdout
    print(status)
    assert "OOM" in status and "256Mi" in status, status
