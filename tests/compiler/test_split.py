"""Pipelines beyond Argo's limits split into WorkflowTemplates called through templateRef."""

from __future__ import annotations

import json
from typing import Any

import pytest

from durapipe.compiler import CompileOptions, compile_pipeline
from tests.compiler.models import Cache, Param, Pipeline, Ref, Stage


def chain(n: int) -> Pipeline:
    stages = []
    for i in range(n):
        ups = [f"s{j}" for j in (i - 1, i // 2) if 0 <= j < i]
        command: list[Any] = ["python", "step.py", "--epochs", Ref(path=("params", "epochs"))]
        command += [Ref(path=(u, "outputs", "out")) for u in ups[:1]]
        stages.append(Stage(name=f"s{i}", image="img:1", command=tuple(command), needs=tuple(ups[1:]),
                            outputs={"out": "/out"}, cache=Cache() if i % 3 == 0 else None))
    return Pipeline(name="big", params=(Param(name="epochs", type="int", default=1),),
                    stages=tuple(stages))


def test_small_limits_split_into_parts_with_cross_part_data() -> None:
    result = compile_pipeline(chain(13), CompileOptions(max_templates=5, max_tasks=5))
    assert result.ok
    *parts, main = result.documents
    assert [p["metadata"]["name"] for p in parts] == [f"big-part-{i}" for i in range(len(parts))]
    assert all(len(p["spec"]["templates"]) <= 5 for p in parts)
    tasks = main["spec"]["templates"][0]["dag"]["tasks"]
    assert tasks[0] == {"name": "part-0", "templateRef": {"name": "big-part-0", "template": "part"}}
    assert tasks[1]["depends"] == "part-0"
    # s3 reads s2's output and s2 lives in the previous part: the artifact crosses the cut.
    # (A cached stage is two templates, its memoized DAG and its pod, so parts hold 3 stages.)
    (s2_art,) = [a for a in tasks[1]["arguments"]["artifacts"] if a["name"] == "in-s2-out"]
    assert s2_art["from"] == "{{tasks.part-0.outputs.artifacts.s2-out}}"
    part0 = parts[0]["spec"]["templates"][0]
    assert {"name": "s2-out", "from": "{{tasks.s2.outputs.artifacts.out}}"} in part0["outputs"][
        "artifacts"]
    # s12 (part 4) is cached and reads s11 (part 3): the content hash crosses as a parameter.
    part4 = parts[4]["spec"]["templates"][0]
    assert part4["inputs"]["parameters"] == [{"name": "s11-out-hash"}]
    assert {"name": "s11-out-hash", "valueFrom": {
        "parameter": "{{tasks.s11.outputs.parameters.out-hash}}"}} in parts[3]["spec"]["templates"][
        0]["outputs"]["parameters"]
    assert tasks[4]["arguments"]["parameters"] == [{
        "name": "s11-out-hash", "value": "{{tasks.part-3.outputs.parameters.s11-out-hash}}"}]


@pytest.mark.slow
def test_two_thousand_stages_fit_argo_limits_and_pass_the_strict_validator(validator: Any) -> None:
    result = compile_pipeline(chain(2000), CompileOptions())
    assert result.ok
    assert len(result.documents) > 10
    for doc in result.documents:
        assert len(doc["spec"]["templates"]) <= 200
        for t in doc["spec"]["templates"]:
            assert len(t.get("dag", {}).get("tasks", [])) <= 200
        assert len(json.dumps(doc)) < 1024 * 1024
        assert validator.validate(doc) == []


def test_too_many_parts_is_diagnosed() -> None:
    result = compile_pipeline(chain(12), CompileOptions(max_templates=3, max_tasks=3))
    assert [d.code for d in result.diagnostics] == ["P0403"]
    assert result.documents == []
