"""Every example checks clean, and every builder twin builds the model of its .pipe file."""

from __future__ import annotations

from pathlib import Path

import pytest

from durapipe.dsl import load_path
from durapipe.dsl.diagnostics import render

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PIPE_FILES = sorted(EXAMPLES.glob("*.pipe"))


def test_the_seed_scenarios_are_all_there() -> None:
    names = {p.stem for p in PIPE_FILES}
    assert {"spot_training", "oom_escalation", "gpu_fallback", "prep_train_eval",
            "multinode_pretrain"} <= names


@pytest.mark.parametrize("path", PIPE_FILES, ids=lambda p: p.name)
def test_example_checks_clean(path: Path) -> None:
    result = load_path(path)
    assert result.pipeline is not None, render(result.diagnostics)
    assert result.diagnostics == [], render(result.diagnostics)


@pytest.mark.parametrize("path", PIPE_FILES, ids=lambda p: p.name)
def test_builder_twin_builds_the_same_model(path: Path) -> None:
    twin = path.with_suffix(".py")
    assert twin.exists(), f"{path.name} has no builder twin"
    text_model = load_path(path).pipeline
    builder = load_path(twin)
    assert builder.pipeline is not None, render(builder.diagnostics)
    assert builder.pipeline == text_model
