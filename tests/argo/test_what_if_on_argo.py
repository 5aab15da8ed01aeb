"""benchmarks/what_if.py's rewritten fleet Workflows still run on Argo's controller and still
do what the docstring says they keep: a what-if that Argo rejects, or that quietly dropped
memoization or the retry, would make the benchmarks measure something else (the first floor
was rejected: a container template cannot output an expression)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.operate_cost import DURAPIPE_FATES, REPO, compiled_by
from benchmarks.what_if import WHAT_IFS
from tests.argo.argo_tools import run_scenario
from tests.compiler.test_argo_controller import strip_artifacts

pytestmark = pytest.mark.harness

#: The stages each what-if still memoizes (the stage's node carries Argo's memoization).
MEMOIZED = {name: set() if "memoization" in name or "all-three" in name else {"prep", "train"}
            for name in WHAT_IFS}


def fleet(what_if: str) -> dict[str, Any]:
    workflow = compiled_by(REPO)
    rewritten = WHAT_IFS[what_if](workflow)
    strip_artifacts(rewritten)
    return rewritten


@pytest.mark.parametrize("what_if", sorted(WHAT_IFS))
def test_a_what_if_runs_the_fleet_work_and_keeps_what_it_says(what_if: str) -> None:
    same = {"snapshot": "s0", "max_depth": "3"}
    report = run_scenario({
        "name": f"what-if-{what_if}", "workflow": fleet(what_if), "expect": {},
        # the same params twice: the second run must hit the cache where memoization is kept
        "runs": [{"parameters": same, "attempts": DURAPIPE_FATES},
                 {"parameters": same, "attempts": DURAPIPE_FATES}]})
    assert not report.get("error"), report["error"]
    first, second = report["runs"]
    assert first["phase"] == "Succeeded", first.get("message")
    assert second["phase"] == "Succeeded", second.get("message")
    # train's first pod fails with exit 1 and is retried: within its task when folded
    train_pods = [n for n in first["attempts"] if "train" in n["displayName"]]
    assert [n["phase"] for n in train_pods] == ["Failed", "Succeeded"], train_pods
    if what_if != "folded":
        assert train_pods[0]["key"] == train_pods[1]["key"], "the retry left its task"
    memoized = {n["key"]: n["memoization"] for n in first["nodes"] if n.get("memoization")}
    stages = {key.removesuffix("-pod") for key in memoized}
    assert stages == MEMOIZED[what_if]
    hits = {n["key"].removesuffix("-pod") for n in second["nodes"]
            if (n.get("memoization") or {}).get("hit")}
    assert hits == MEMOIZED[what_if]
