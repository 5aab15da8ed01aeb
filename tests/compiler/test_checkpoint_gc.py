"""`checkpoint_gc { schedule max_age image }`: the collector's CronWorkflow, its RBAC, and what
`check` says of a block that cannot work (docs/lowering.md, "checkpoint_gc")."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from durapipe.compiler import CompileOptions, compile_pipeline, to_yaml
from durapipe.compiler import rbac
from durapipe.compiler.checkpoint_gc import cron_name, is_collector
from durapipe.compiler.naming import MAX_CRON_NAME
from durapipe.dsl import builder as b
from durapipe.dsl.load import loads
from durapipe.dsl.model import Pipeline
from durapipe.runtime import contract

REPO = Path(__file__).resolve().parents[2]

SOURCE = """
pipeline "nightly" {
  namespace      = "ml"
  storage        = "s3://acme/$(HOME)/durapipe/"
  storage_secret = "store"
  timezone       = "Europe/Berlin"
  checkpoint_gc { schedule = "30 2 * * *"  max_age = 36h }
}
stage "prep" { image = "busybox" command = ["true"] }
stage "train" {
  image = "ghcr.io/acme/trainer:2.3.0"
  command = ["python", "train.py"]
  checkpoint = true
}
"""


def _load(text: str) -> Pipeline:
    loaded = loads(text, "nightly.pipe")
    assert loaded.pipeline is not None and loaded.ok, loaded.diagnostics
    return loaded.pipeline


def _collector(pipeline: Pipeline, **options: Any) -> dict[str, Any]:
    result = compile_pipeline(pipeline, CompileOptions(**options))
    assert result.ok, result.diagnostics
    (collector,) = [d for d in result.documents if is_collector(d)]
    assert [d["kind"] for d in result.documents if not is_collector(d)] == ["Workflow"]
    return collector


def test_the_collector_runs_the_runtimes_gc_over_the_pipelines_lines_on_its_schedule() -> None:
    result = compile_pipeline(_load(SOURCE), CompileOptions())
    workflow, collector = result.documents
    assert collector["kind"] == "CronWorkflow"
    assert collector["metadata"]["name"] == "nightly-ckpt-gc"
    assert collector["metadata"]["namespace"] == "ml"
    spec = collector["spec"]
    assert spec["schedules"] == ["30 2 * * *"] and spec["timezone"] == "Europe/Berlin"
    assert spec["concurrencyPolicy"] == "Forbid"
    (template,) = spec["workflowSpec"]["templates"]
    container = template["container"]
    # The first checkpointing stage's image, which runs the runtime anyway.
    assert container["image"] == "ghcr.io/acme/trainer:2.3.0"
    # Every line of the pipeline, whatever the scope: `<storage>/<pipeline>`, with the
    # kubelet's `$(VAR)` expansion escaped as in the stages' own environment.
    assert container["command"] == [
        "python3", "/var/run/durapipe/bin/durapipe-runtime.pyz", "checkpoints", "gc",
        "s3://acme/$$(HOME)/durapipe/nightly", "--max-age", "129600s", "--apply",
        "--protect-unfinished-runs"]
    assert container["envFrom"] == [{"secretRef": {"name": "store"}}]
    # The same runtime ConfigMap as the stage pods mount, and the runtime's own object.
    stage_volumes = [v for t in workflow["spec"]["templates"] for v in t.get("volumes", [])
                     if v["name"] == "durapipe-runtime"]
    assert spec["workflowSpec"]["volumes"] == stage_volumes[:1]
    assert stage_volumes[0]["configMap"]["name"] == result.runtime_objects[0]["metadata"]["name"]


def test_the_block_image_and_the_runtime_image_are_used_where_given() -> None:
    pipeline = _load(SOURCE.replace("max_age = 36h", 'max_age = 36h  image = "python:3.12"'))
    assert _collector(pipeline)["spec"]["workflowSpec"]["templates"][0]["container"][
        "image"] == "python:3.12"
    delivered = _collector(pipeline, runtime_image="ghcr.io/acme/durapipe-runtime:1")
    container = delivered["spec"]["workflowSpec"]["templates"][0]["container"]
    assert container["image"] == "ghcr.io/acme/durapipe-runtime:1"
    assert container["command"][1] == "/opt/durapipe/durapipe-runtime.pyz"
    assert "volumeMounts" not in container and "volumes" not in delivered["spec"]["workflowSpec"]


def test_the_builder_gives_the_same_collector() -> None:
    p = b.Pipeline("nightly", namespace="ml", storage="s3://acme/$(HOME)/durapipe/",
                   storage_secret="store", timezone="Europe/Berlin",
                   checkpoint_gc=b.CheckpointGc(schedule="30 2 * * *", max_age="36h"))
    p.stage("prep", image="busybox", command=["true"])
    p.stage("train", image="ghcr.io/acme/trainer:2.3.0", command=["python", "train.py"],
            checkpoint=True)
    assert to_yaml([_collector(p.build())]) == to_yaml([_collector(_load(SOURCE))])


def test_its_account_may_list_workflows_and_only_then() -> None:
    def workflow_rules(pipeline: Pipeline) -> list[Any]:
        (role,) = [d for d in rbac.rbac_documents(pipeline) if d["kind"] == "Role"]
        return [r for r in role["rules"] if r["resources"] == ["workflows"]]

    pipeline = _load(SOURCE)
    assert workflow_rules(pipeline) == [
        {"apiGroups": ["argoproj.io"], "resources": ["workflows"], "verbs": ["list"]}]
    import dataclasses

    assert workflow_rules(dataclasses.replace(pipeline, checkpoint_gc=None)) == []
    (role,) = [d for d in rbac.rbac_documents(pipeline, creates_workflows=True)
               if d["kind"] == "Role"]
    assert [r["verbs"] for r in role["rules"] if r["resources"] == ["workflows"]] == [
        ["create", "get", "list"]]
    # With GitOps output, the collector runs as that account.
    collector = _collector(pipeline, service_account=rbac.account_name(pipeline))
    assert collector["spec"]["workflowSpec"]["serviceAccountName"] == "nightly-durapipe"


def test_long_pipeline_names_give_distinct_names_within_argos_limit() -> None:
    long_a, long_b = "a" * 44 + "-one", "a" * 44 + "-two"
    names = {cron_name(long_a), cron_name(long_b)}
    assert len(names) == 2 and all(len(n) <= MAX_CRON_NAME for n in names)
    assert all(n.endswith("-ckpt-gc") for n in names)
    assert cron_name(long_a) == cron_name(long_a)


@pytest.mark.parametrize(("change", "code", "text"), [
    (("30 2 * * *", "30 25 * * *"), "P0316", "\"30 25"),
    (('  storage        = "s3://acme/$(HOME)/durapipe/"\n', ""), "P0317", "checkpoint_gc"),
    (("  checkpoint = true\n", ""), "P0346", "checkpoint_gc"),
    (("max_age = 36h", "max_age = 30s"), "P0204", "30s"),
])
def test_a_block_that_cannot_work_is_a_diagnostic_at_its_place(
        change: tuple[str, str], code: str, text: str) -> None:
    source = SOURCE.replace(*change)
    assert source != SOURCE
    loaded = loads(source, "nightly.pipe")
    found = [d for d in loaded.diagnostics if d.code == code]
    assert found, loaded.diagnostics
    span = found[0].labels[0].span
    assert span is not None and source[span.start:span.end].startswith(text)


def test_submitting_the_compiled_file_starts_the_run_never_the_collector(tmp_path: Path) -> None:
    from durapipe.cluster.submit import load_documents

    args = argparse.Namespace()
    source = tmp_path / "nightly.pipe"
    source.write_text(SOURCE)
    from_source = load_documents(str(source), args)
    assert isinstance(from_source, list)
    assert [d["kind"] for d in from_source] == ["ConfigMap", "Workflow"]
    compiled = tmp_path / "nightly.yaml"
    result = compile_pipeline(_load(SOURCE), CompileOptions())
    compiled.write_text(to_yaml([*result.runtime_objects, *result.documents]))
    from_yaml = load_documents(str(compiled), args)
    assert isinstance(from_yaml, list)
    assert [d["kind"] for d in from_yaml] == ["ConfigMap", "Workflow"]


def test_the_runtime_and_the_compiler_agree_on_the_resume_parameter() -> None:
    from durapipe.compiler.argo_pod import RESUME_FROM_PARAM

    assert RESUME_FROM_PARAM == contract.RESUME_FROM_PARAM == "durapipe-resume-from"
