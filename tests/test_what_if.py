"""benchmarks/what_if.py folds durapipe's compiled fleet pipeline as its docstring says. The
fold works on the compiler's template and task names: a renamed one, or a kept task still
reading one that is gone, must fail here rather than in a half-hour benchmark run. The fleet
benchmark's helpers the what-ifs run through (their workflow prefixes, its count of Argo's
operates) are checked here for the same reason."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from benchmarks.fleet_scale import FLEET_PIPELINE
from benchmarks.what_if import FOLDED_LIMIT, KEY_PARAMETER, WHAT_IFS, fold_application_budget
from durapipe.compiler import CompileOptions, compile_pipeline
from durapipe.dsl.load import loads


def fleet_workflow() -> dict[str, Any]:
    loaded = loads(FLEET_PIPELINE, "fleet.pipe")
    assert loaded.ok, loaded.diagnostics
    result = compile_pipeline(loaded.pipeline, CompileOptions())
    assert result.ok
    workflow: dict[str, Any] = next(d for d in result.documents if d["kind"] == "Workflow")
    return workflow


def dag_tasks(workflow: dict[str, Any]) -> dict[str, list[str]]:
    return {t["name"]: [task["name"] for task in t["dag"]["tasks"]]
            for t in workflow["spec"]["templates"] if "dag" in t}


def test_the_fold_keeps_one_task_per_stage_and_trains_fallback() -> None:
    workflow = fleet_workflow()
    untouched = copy.deepcopy(workflow)
    folded = fold_application_budget(workflow)
    assert workflow == untouched
    tasks = dag_tasks(folded)
    assert tasks["prep"] == ["prep-app-0"]
    assert tasks["eval"] == ["eval-app-0"]
    assert tasks["train"] == ["train-h100", "train-a100-80gb-app-0", "train-done"]


def test_every_pod_task_retries_an_application_failure_and_a_preemption() -> None:
    folded = fold_application_budget(fleet_workflow())
    templates = {t["name"]: t for t in folded["spec"]["templates"]}
    for name in ("prep-pod", "train-h100", "train-pod", "eval-pod"):
        retry = templates[name]["retryStrategy"]
        assert retry["limit"] == FOLDED_LIMIT, name
        assert retry["expression"].startswith("lastRetry.exitCode == '1' || "), name
        assert "durapipe-verdict:preempted" in retry["expression"], name


def test_no_kept_task_or_output_reads_a_task_the_fold_removed() -> None:
    workflow = fleet_workflow()
    folded = fold_application_budget(workflow)
    kept = {task for names in dag_tasks(folded).values() for task in names}
    removed = {task for names in dag_tasks(workflow).values() for task in names} - kept
    assert removed, "the fold removed no task"
    text = json.dumps(folded)
    for task in sorted(removed):
        for reference in (f"'{task}'", f"tasks.{task}.", f"{task}.Succeeded", f"{task}.Failed"):
            assert reference not in text, f"{reference} still read after the fold"


@pytest.mark.parametrize("what_if", sorted(WHAT_IFS))
def test_a_what_if_leaves_the_compiled_workflow_as_it_was(what_if: str) -> None:
    workflow = fleet_workflow()
    untouched = copy.deepcopy(workflow)
    WHAT_IFS[what_if](workflow)
    assert workflow == untouched


def test_the_floor_carries_nothing_between_tasks_and_evaluates_each_key_in_one_place() -> None:
    folded = fold_application_budget(fleet_workflow())
    floor = WHAT_IFS["floor"](fleet_workflow())
    text = json.dumps(floor)
    for carried in ("preempted-before", "'preempted'", "inputs.parameters.attempt"):
        assert carried not in text, carried
    templates = {t["name"]: t for t in floor["spec"]["templates"]}
    main = {task["name"]: task for task in templates["main"]["dag"]["tasks"]}
    assert main["eval"]["template"] == "eval-pod" and "eval" not in templates
    for stage in ("prep", "train"):
        assert "dag" in templates[stage], f"{stage} is memoized: it keeps its DAG"
        assert templates[stage]["memoize"]["key"] == f"{{{{inputs.parameters.{KEY_PARAMETER}}}}}"
        key = next(p["value"] for p in main[stage]["arguments"]["parameters"]
                   if p["name"] == KEY_PARAMETER)
        assert key.startswith("{{=sprig.sha256sum(")
    assert text.count("{{=") < json.dumps(folded).count("{{=")


def test_the_fleet_benchmark_offers_every_what_if_under_its_own_workflow_prefix(
        tmp_path: Any) -> None:
    # The fate watcher tells the forms' runs apart by generateName: two forms sharing a prefix
    # would play one form's fates on the other's pods.
    from benchmarks.fleet_scale import forms

    offered = forms(tmp_path)
    prefixes = [form.prefix for form in offered.values()]
    assert len(set(prefixes)) == len(prefixes), prefixes
    for name in WHAT_IFS:
        form = offered[f"durapipe-{name}"]
        workflow = form.workflow("s1")
        assert workflow["metadata"]["generateName"] == form.prefix
        assert {"name": "snapshot", "value": "s1"} in workflow["spec"]["arguments"]["parameters"]


def test_the_fleet_benchmark_reads_how_often_argo_operated_from_its_histogram() -> None:
    from benchmarks.fleet_scale import operation_metric

    text = "\n".join([
        "# HELP argo_workflows_operation_duration_seconds A histogram",
        "# TYPE argo_workflows_operation_duration_seconds histogram",
        'argo_workflows_operation_duration_seconds_bucket{le="5"} 600',
        "argo_workflows_operation_duration_seconds_sum 12.5",
        "argo_workflows_operation_duration_seconds_count 600",
        "argo_workflows_other_count 7",
    ])
    assert operation_metric(text, "count") == 600
    assert operation_metric(text, "sum") == 12.5
