"""Pipelines beyond Argo's limits split into parts, each run as a child Workflow.

The run's entrypoint creates each part's Workflow (from the part's WorkflowTemplate) through a
resource template and reads the data later parts need from the child's global outputs, so no
Workflow of the run holds more than one part's templates (docs/lowering.md, "Argo's limits").
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from durapipe.compiler import CompileOptions, compile_pipeline
from durapipe.compiler.argo_workflow import MAX_PART_BYTES, creates_workflows
from durapipe.compiler.rbac import rbac_documents
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


def argo_fills_in(manifest: str, values: dict[str, str]) -> dict[str, Any]:
    """The manifest as Argo hands it to the executor: each ``{{=expr}}`` replaced by the JSON
    text it evaluates to (``values``), each ``{{name}}`` by a plain string."""
    text = re.sub(r"\{\{=(.+?)\}\}", lambda m: values[m.group(1)], manifest)
    text = re.sub(r"\{\{([\w.-]+)\}\}", lambda m: values.get(m.group(1), "x"), text)
    result: dict[str, Any] = json.loads(text)
    return result


def test_small_limits_split_into_child_workflows_with_cross_part_data() -> None:
    result = compile_pipeline(chain(13), CompileOptions(max_templates=6, max_tasks=6))
    assert result.ok
    *parts, main = result.documents
    assert [p["metadata"]["name"] for p in parts] == [f"big-part-{i}" for i in range(len(parts))]
    assert [p["metadata"]["labels"]["durapipe.dev/part"] for p in parts] == [
        str(i) for i in range(len(parts))]
    assert all(len(p["spec"]["templates"]) <= 6 for p in parts)
    # Each part runs on its own: entrypoint `main` is a DAG whose one task is the part (so its
    # outputs reach the child's global outputs), with the pipeline's parameters.
    for p in parts:
        assert p["spec"]["entrypoint"] == "main"
        assert p["spec"]["arguments"] == {"parameters": [{"name": "epochs", "value": "1"}]}
        entry, dag = p["spec"]["templates"][:2]
        assert [t["template"] for t in entry["dag"]["tasks"]] == ["part"]
        assert dag["name"] == "part"
    # The run: its DAG calls one resource template per part, none through templateRef.
    templates = {t["name"]: t for t in main["spec"]["templates"]}
    tasks = templates["main"]["dag"]["tasks"]
    assert "templateRef" not in json.dumps(main)
    assert tasks[0] == {"name": "part-0", "template": "part-0"}
    assert tasks[1]["depends"] == "part-0"
    call = templates["part-1"]
    assert {k: v for k, v in call["resource"].items() if k != "manifest"} == {
        "action": "create", "setOwnerReference": True,
        "successCondition": "status.phase == Succeeded",
        "failureCondition": "status.phase in (Failed, Error)"}
    # s3 reads s2's output and s2 lives in part 0: the artifact crosses as its JSON, a global
    # output parameter of part 0's child, read back by the run and renamed to s3's input.
    # (A cached stage is two templates, its memoized DAG and its pod, so parts hold 3 stages.)
    part0 = parts[0]["spec"]["templates"][1]
    assert {"name": "in-s2-out-artifact", "globalName": "in-s2-out-artifact", "valueFrom": {
        "expression": "toJson(tasks['s2'].outputs.artifacts['out'])"}} in part0["outputs"][
        "parameters"]
    assert {"name": "in-s2-out-artifact", "valueFrom": {"jqFilter": (
        '.status.outputs.parameters[] | select(.name == "in-s2-out-artifact") | .value'
        ' | fromjson | del(.path) | .name = "in-s2-out"')}} in templates["part-0"]["outputs"][
        "parameters"]
    assert {"name": "in-s2-out-artifact",
            "value": "{{tasks.part-0.outputs.parameters.in-s2-out-artifact}}"} in tasks[1][
        "arguments"]["parameters"]
    # The child of part 1, as the executor creates it: from part 1's WorkflowTemplate, tied
    # to the run by a label, with every parameter (quotes and all) and the crossing data.
    artifact = '{"name":"in-s2-out","s3":{"key":"k/s2.tgz"}}'
    child = argo_fills_in(call["resource"]["manifest"], {
        "toJson(workflow.parameters['epochs'])": json.dumps('2 "quoted" \\ '),
        "inputs.parameters['in-s2-out-artifact']": artifact,
        "workflow.name": "big-abcde", "inputs.parameters.s2-out-hash": "sha256:2"})
    assert child["kind"] == "Workflow"
    assert child["metadata"]["generateName"] == "big-abcde-part-1-"
    assert child["metadata"]["labels"]["durapipe.dev/parent-workflow"] == "big-abcde"
    assert child["spec"] == {"workflowTemplateRef": {"name": "big-part-1"}, "arguments": {
        "parameters": [{"name": "epochs", "value": '2 "quoted" \\ '},
                       {"name": "s2-out-hash", "value": "sha256:2"}],
        "artifacts": [json.loads(artifact)]}}
    # s12 (part 4) is cached and reads s11 (part 3): the content hash crosses as a parameter.
    part4_entry, part4 = parts[4]["spec"]["templates"][:2]
    assert part4["inputs"]["parameters"] == [{"name": "s11-out-hash"}]
    assert part4_entry["inputs"] == part4["inputs"]
    assert {"name": "s11-out-hash", "globalName": "s11-out-hash", "valueFrom": {
        "parameter": "{{tasks.s11.outputs.parameters.out-hash}}"}} in parts[3]["spec"][
        "templates"][1]["outputs"]["parameters"]
    assert {"name": "s11-out-hash",
            "value": "{{tasks.part-3.outputs.parameters.s11-out-hash}}"} in tasks[4][
        "arguments"]["parameters"]


def test_a_split_pipeline_may_create_workflows_and_a_small_one_may_not() -> None:
    small = compile_pipeline(chain(3), CompileOptions())
    big = compile_pipeline(chain(13), CompileOptions(max_templates=6, max_tasks=6))
    assert not creates_workflows(small.documents) and creates_workflows(big.documents)
    rule = {"apiGroups": ["argoproj.io"], "resources": ["workflows"], "verbs": ["create", "get"]}
    assert rule in rbac_documents(chain(13), creates_workflows=True)[1]["rules"]
    assert rule not in rbac_documents(chain(13))[1]["rules"]


@pytest.mark.slow
def test_two_thousand_stages_fit_argo_limits_and_pass_the_strict_validator(validator: Any) -> None:
    result = compile_pipeline(chain(2000), CompileOptions())
    assert result.ok
    *parts, main = result.documents
    assert len(parts) > 10
    for doc in result.documents:
        assert len(doc["spec"]["templates"]) <= 200
        for t in doc["spec"]["templates"]:
            assert len(t.get("dag", {}).get("tasks", [])) <= 200
        assert len(json.dumps(doc)) < 1024 * 1024
        assert validator.validate(doc) == []
    # A running child holds its part's templates again (storedWorkflowTemplateSpec): each
    # part leaves room for that beside its node status.
    for doc in parts:
        assert len(json.dumps(doc["spec"]["templates"][2:], separators=(",", ":"))) <= (
            MAX_PART_BYTES)


def test_too_many_parts_is_diagnosed() -> None:
    result = compile_pipeline(chain(12), CompileOptions(max_templates=4, max_tasks=3))
    assert [d.code for d in result.diagnostics] == ["P0403"]
    assert result.documents == []


@pytest.mark.slow
@pytest.mark.harness
def test_the_child_conditions_are_what_argo_executor_evaluates() -> None:
    """The run's wait for a child, through Argo's own executor code (tools/argo-sim): done on
    Succeeded, failed on Failed or Error, waiting before (a child not yet started has no
    status)."""
    from tests.argo.argo_tools import resource_conditions

    *_, main = compile_pipeline(chain(13), CompileOptions(max_templates=6, max_tasks=6)).documents
    resource = next(t for t in main["spec"]["templates"] if t["name"] == "part-0")["resource"]
    phases = ["", "Pending", "Running", "Succeeded", "Failed", "Error"]
    cases = [{"name": phase or "new", "successCondition": resource["successCondition"],
              "failureCondition": resource["failureCondition"],
              "object": {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                         "metadata": {"name": "big-abcde-part-0-fghij"},
                         **({"status": {"phase": phase}} if phase else {})}}
             for phase in phases]
    verdicts = {r["name"]: (r["verdict"], r.get("error")) for r in resource_conditions(cases)}
    assert {k: v[0] for k, v in verdicts.items()} == {
        "new": "waiting", "Pending": "waiting", "Running": "waiting", "Succeeded": "succeeded",
        "Failed": "failed", "Error": "failed"}, verdicts
