"""Every example compiles; the output is snapshotted, byte-identical for builder twins, valid
against Argo v4.1.2's strict CRD schema, and loads into hera without losing a known field."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from syrupy.assertion import SnapshotAssertion

from durapipe.compiler import CompileOptions, compile_pipeline, header, to_yaml
from durapipe.dsl import load_path
from durapipe.dsl.diagnostics import render
from tests.compiler.models import prep_train_eval, unbalanced_expression_tags

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.pipe"))
PINNED_ARCHIVE = b"the runtime zipapp, pinned for the snapshots"


def compile_example(path: Path, **options: Any) -> tuple[str, list[dict[str, Any]]]:
    loaded = load_path(path)
    assert loaded.pipeline is not None, render(loaded.diagnostics)
    shown = path.relative_to(REPO).as_posix()
    # The runtime's bytes are pinned: the snapshots review the lowering, and an edit to the
    # runtime would otherwise rename every pod's ConfigMap volume.
    options.setdefault("runtime_archive", PINNED_ARCHIVE)
    result = compile_pipeline(loaded.pipeline, CompileOptions(
        source_map=loaded.source_map, source_path=shown, **options))
    assert result.ok, render(result.diagnostics)
    return to_yaml(result.documents, header(shown)), result.documents


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_snapshot(path: Path, snapshot_yaml: SnapshotAssertion) -> None:
    text, _ = compile_example(path)
    assert text == snapshot_yaml


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_builder_twin_compiles_byte_identically(path: Path) -> None:
    twin = path.with_suffix(".py")
    if not twin.exists():
        pytest.fail(f"{path.name} has no builder twin")
    assert compile_example(twin)[0] == compile_example(path)[0]


@pytest.mark.parametrize("kind", ["workflow", "template", "cron"])
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_compiled_object_passes_the_strict_validator(path: Path, kind: str,
                                                           validator: Any) -> None:
    loaded = load_path(path)
    assert loaded.pipeline is not None
    pipeline = loaded.pipeline
    if kind == "cron" and not pipeline.schedules:
        pipeline = dataclasses.replace(pipeline, schedules=("0 3 * * *",))
    result = compile_pipeline(pipeline, CompileOptions(kind=kind))
    assert result.ok, render(result.diagnostics)
    for doc in result.documents:
        assert validator.validate(doc) == []
        assert unbalanced_expression_tags(doc) == []


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_hera_loads_every_document_without_losing_a_known_field(path: Path) -> None:
    from argo_schema.strict import hera_roundtrip_report

    _, documents = compile_example(path)
    for doc in documents:
        report = hera_roundtrip_report(doc)
        assert report.load_error is None
        assert report.lost_known == []
        assert report.changed == []
        # hera 7.1.0 models Argo 4.0.5: only fields new in 4.1 may be unknown to it.
        assert all(p.endswith(".pendingTimeout") for p in report.lost_unknown), report.lost_unknown


def test_direct_model_snapshot(snapshot_yaml: SnapshotAssertion, validator: Any) -> None:
    result = compile_pipeline(prep_train_eval(), CompileOptions())
    assert result.ok
    for doc in result.documents:
        assert validator.validate(doc) == []
    assert to_yaml(result.documents, header("tests/compiler/models.py")) == snapshot_yaml


def test_output_is_identical_across_processes_hash_seeds_and_directories(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    example = REPO / "examples" / "prep_train_eval.pipe"
    outputs = []
    for seed, cwd in (("1", REPO), ("4242", tmp_path)):
        target = os.path.relpath(example, cwd)
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(REPO))
        proc = subprocess.run([sys.executable, "-m", "durapipe", "compile", target],
                              cwd=cwd, env=env, capture_output=True, text=True, check=True)
        outputs.append(proc.stdout)
    # Only the header's source path may differ (it is relative to the working directory).
    assert outputs[0].split("\n", 1)[1] == outputs[1].split("\n", 1)[1]
    assert "examples/prep_train_eval." in outputs[0].splitlines()[0]


def test_the_prep_train_eval_workflow_stays_under_460_lines() -> None:
    """What a reviewer reads in a GitOps diff: the Workflow with its header, the runtime
    ConfigMap aside (446 lines before the stages shared one wait and one join template; 435
    before checkpoint lines were named by the stage's inputs, which each of train's two
    attempts now receives as a `checkpoint-key` argument: 8 lines; 443 before each cached
    stage recorded what its key is made of, `durapipe-cache-inputs`: 5 lines a stage; 453
    before each entry's ConfigMap was named by its key's first digit: 1 line a cached stage)."""
    text, documents = compile_example(REPO / "examples" / "prep_train_eval.pipe")
    assert [d["kind"] for d in documents] == ["Workflow"]  # the ConfigMap is a runtime object
    assert text.startswith("# Generated by durapipe")
    assert len(text.splitlines()) < 460
