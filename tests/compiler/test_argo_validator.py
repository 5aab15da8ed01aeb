"""Argo's own validator (`argo lint --offline`'s code, tools/argo-check) accepts what we compile:
template and variable resolution, DAG structure, every part and the run of a split pipeline (each
part's WorkflowTemplate, the run's resource templates and their manifests).

tools/argo-check builds Argo v4.1.2 from ../shared, so every object is checked exactly as
written, ``pendingTimeout`` included.  Skips without Go or ../shared (mandatory in CI).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from durapipe.compiler import CompileOptions, compile_pipeline, to_yaml
from durapipe.dsl import load_path
from tests.compiler.models import prep_train_eval
from tests.compiler.test_split import chain

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.harness]


def test_argo_validator_accepts_every_example_in_every_kind(tmp_path: Path) -> None:
    from tests.argo.argo_tools import argo_check

    written = []
    for path in sorted((REPO / "examples").glob("*.pipe")):
        pipeline = load_path(path).pipeline
        assert pipeline is not None
        for kind in ("workflow", "template", "cron"):
            # Only a CronWorkflow carries a schedule; another kind with one is P0345.
            schedules = (pipeline.schedules or ("0 3 * * *",)) if kind == "cron" else ()
            result = compile_pipeline(dataclasses.replace(pipeline, schedules=schedules),
                                      CompileOptions(kind=kind))
            assert result.ok
            out = tmp_path / f"{path.stem}-{kind}.yaml"
            out.write_text(to_yaml(result.documents))
            written.append(out)
    direct = tmp_path / "prep-train-eval-model.yaml"
    direct.write_text(to_yaml(compile_pipeline(prep_train_eval(), CompileOptions()).documents))
    written.append(direct)
    results = argo_check(written)
    # One result per Argo object: a file per example and kind, and spot_training's files hold
    # its checkpoint collector's CronWorkflow too.
    collectors = [r for r in results if r.name == "spot-training-ckpt-gc"]
    assert [r.kind for r in collectors] == ["CronWorkflow"] * 3
    assert len(results) == len(written) + len(collectors)
    assert [(r.file, r.error) for r in results if not r.ok] == []


def test_argo_validator_accepts_every_object_of_a_split_pipeline(tmp_path: Path) -> None:
    from tests.argo.argo_tools import argo_check

    result = compile_pipeline(chain(300), CompileOptions())
    assert result.ok and len(result.documents) > 2
    out = tmp_path / "big.yaml"
    out.write_text(to_yaml(result.documents))
    results = argo_check([out])
    assert [r.kind for r in results] == ["WorkflowTemplate"] * (len(result.documents) - 1) + [
        "Workflow"]
    assert [r.error for r in results if not r.ok] == []


def test_argo_validator_accepts_gitops_output_and_cluster_settings(tmp_path: Path) -> None:
    """`-o DIR/` output (WorkflowTemplates, CronWorkflows, named Workflows) and every cluster
    setting, `pod_patch` included, pass Argo's own validation."""
    from durapipe.cli import main
    from tests.argo.argo_tools import argo_check
    from tests.compiler.test_cluster_settings import SETTINGS

    settings = tmp_path / "settings.pipe"
    settings.write_text(SETTINGS)
    scheduled = tmp_path / "scheduled.pipe"
    scheduled.write_text(SETTINGS.replace('pipeline "p" {', 'pipeline "nightly" {\n'
                                          '  schedule = "0 3 * * *"'))
    sources = [*(str(p) for p in sorted((REPO / "examples").glob("*.pipe"))), str(settings),
               str(scheduled)]
    out = tmp_path / "deploy"
    assert main(["compile", *sources, "-o", f"{out}/"]) == 0
    runs = tmp_path / "runs"
    assert main(["compile", *sources[:-1], "-o", f"{runs}/", "--kind", "workflow"]) == 0
    results = argo_check([out, runs])
    assert {r.kind for r in results} == {"WorkflowTemplate", "CronWorkflow", "Workflow"}
    assert [(r.file, r.error) for r in results if not r.ok] == []
