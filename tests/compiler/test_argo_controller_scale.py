"""Large compiled pipelines run to completion in Argo's controller (tools/argo-sim).

Split into parts as the compiler emits them, with the executor's part (each pod's output
hashes) played by the harness. The run creates each part's child Workflow through a resource
template, which the harness cannot play (it has no API server to create the child in), so each
part's child runs here on its own, in order, from its WorkflowTemplate's spec, with the content
hashes the earlier children published as global outputs (the e2e case ``wide_2000`` runs the
whole run on the real control plane). Argo's operator walks the
whole DAG on every reconciliation, so a chain of N stages costs about N^2: these are the sizes
that fit a CI run (docs/argo-harness.md, "Sizes"). Skips without Go or ../shared (mandatory in
CI).
"""

from __future__ import annotations

from typing import Any

import pytest

from durapipe.compiler import CompileOptions, compile_pipeline
from durapipe.compiler.argo_stage import wrapped_task_name
from tests.compiler.models import Pipeline, Stage
from tests.compiler.test_argo_controller import strip_artifacts
from tests.compiler.test_split import chain

pytestmark = [pytest.mark.slow, pytest.mark.harness]


def fan_out(n: int) -> Pipeline:
    stages = [Stage(name=f"s{i}", image="img:1", command=("python", "step.py"),
                    outputs={"out": "/out"}) for i in range(n)]
    return Pipeline(name="wide", stages=tuple(stages))


def run_split(p: Pipeline, max_steps: int) -> dict[str, Any]:
    """Each part's child Workflow in turn; one run report over all of them."""
    from tests.argo.argo_tools import run_scenario

    result = compile_pipeline(p, CompileOptions())
    assert result.ok
    *parts, _ = result.documents
    assert parts, "the pipeline should be split into parts"
    # What each pod's wait container would publish: the content hash of its output.
    # A cached stage runs its pod as a task of its own (the cache is on a DAG around it).
    outcomes = {wrapped_task_name(s.name) if s.cache else s.name:
                [{"outcome": "succeeded", "outputs": {"out-hash": f"sha-{s.name}"}}]
                for s in p.stages}
    published: dict[str, str] = {}  # the global outputs of the children so far
    merged: dict[str, Any] = {"phase": "Succeeded", "nodes": [], "podPatches": 0}
    for part in parts:
        strip_artifacts(part)
        for t in part["spec"]["templates"]:  # artifacts cross as JSON: stripped with them
            out = t.get("outputs", {})
            if "parameters" in out:
                out["parameters"] = [q for q in out["parameters"]
                                     if not q["name"].endswith("-artifact")]
        wanted = [q["name"] for q in
                  part["spec"]["templates"][0].get("inputs", {}).get("parameters", [])]
        spec = dict(part["spec"])
        spec["arguments"] = {"parameters": [*spec.get("arguments", {}).get("parameters", []),
                                            *({"name": n, "value": published[n]}
                                              for n in wanted)]}
        child = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                 "metadata": {"name": part["metadata"]["name"]}, "spec": spec}
        report = run_scenario({"name": child["metadata"]["name"], "workflow": child,
                               "runs": [{"attempts": outcomes}], "maxSteps": max_steps,
                               "recordWorkflow": True, "expect": {}}, timeout=900)
        assert not report.get("error"), report.get("error")
        run: dict[str, Any] = report["runs"][0]
        if run["phase"] != "Succeeded":
            return run
        published.update({q["name"]: q["value"] for q in
                          (run["object"]["status"].get("outputs") or {}).get("parameters", [])})
        merged["nodes"] += run["nodes"]
        merged["podPatches"] += run.get("podPatches", 0)
    merged["published"] = published
    return merged


def published_hashes(run: dict[str, Any]) -> dict[str, str]:
    return dict(run["published"])


def pod_nodes(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [n for n in run["nodes"] if n["type"] == "Pod"]


def test_a_250_stage_chain_split_into_templates_runs_to_completion() -> None:
    run = run_split(chain(250), max_steps=2000)
    assert run["phase"] == "Succeeded"
    pods = pod_nodes(run)
    assert len(pods) == 250 and {n["phase"] for n in pods} == {"Succeeded"}
    # Every stage passed its hash on: the last one ran after all 249 before it.
    assert {n["outputs"]["out-hash"] for n in pods} == {f"sha-s{i}" for i in range(250)}
    # Hashes a cached stage's key reads crossed each cut as the producing child's global output.
    assert published_hashes(run) and all(
        v == f"sha-{k.removesuffix('-out-hash')}" for k, v in published_hashes(run).items())
    # Each completed pod is labelled once. Were completed pods still in the controller's pod
    # informer (a watch that ignores its label selector), every reconciliation would label all
    # of them again: 250^2 patches, and a chain's cost would grow by another factor of N.
    assert run["podPatches"] == 250


def test_a_250_stage_fan_out_split_into_templates_runs_to_completion() -> None:
    run = run_split(fan_out(250), max_steps=400)
    assert run["phase"] == "Succeeded"
    pods = pod_nodes(run)
    assert len(pods) == 250 and {n["phase"] for n in pods} == {"Succeeded"}


def test_a_2000_stage_fan_out_split_into_templates_runs_to_completion() -> None:
    run = run_split(fan_out(2000), max_steps=400)
    assert run["phase"] == "Succeeded"
    pods = pod_nodes(run)
    assert len(pods) == 2000 and {n["phase"] for n in pods} == {"Succeeded"}


def test_a_2000_stage_chain_split_into_child_workflows_runs_to_completion() -> None:
    """In one 2,000-node Workflow this is hours of Argo's reconciliation (about N^2); as 39
    child Workflows of about 52 stages each, it is the sum of their small costs (102 s here)."""
    run = run_split(chain(2000), max_steps=4000)
    assert run["phase"] == "Succeeded"
    pods = pod_nodes(run)
    assert len(pods) == 2000 and {n["phase"] for n in pods} == {"Succeeded"}
    assert {n["outputs"]["out-hash"] for n in pods} == {f"sha-s{i}" for i in range(2000)}
    assert run["podPatches"] == 2000
