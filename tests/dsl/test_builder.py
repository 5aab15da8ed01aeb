"""The Python builder reports mistakes as diagnostics pointing at the caller's line."""

from __future__ import annotations

import pytest

from durapipe.dsl.builder import Gpu, Pipeline, Resources
from durapipe.dsl.diagnostics import PipelineError


def _line_of(marker: str) -> int:
    with open(__file__, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if marker in line and "_line_of" not in line:
                return number
    raise AssertionError(marker)


def test_unknown_keyword_gets_did_you_mean_at_the_callers_line() -> None:
    p = Pipeline("demo")
    p.stage("train", image="x", command=["true"], resourses=Resources(cpu=1))  # MARK-typo
    with pytest.raises(PipelineError) as info:
        p.build()
    (diag,) = info.value.diagnostics
    assert diag.code == "P0201"
    assert diag.help == "did you mean `resources`?"
    assert diag.span is not None and diag.span.line == _line_of("MARK-typo")
    assert "test_builder.py" in diag.span.source.path


def test_all_mistakes_are_collected_into_one_exception() -> None:
    p = Pipeline("demo")
    p.stage("a", image="x", command=["true"],
            resources=Resources(gpu=Gpu(count=8, types=["H10"])))  # MARK-gpu
    p.stage("b", image="x", command=["true"], needs=["nope"])
    with pytest.raises(PipelineError) as info:
        p.build()
    codes = [d.code for d in info.value.diagnostics]
    assert codes == ["P0311", "P0301"]
    assert info.value.diagnostics[0].span.line == _line_of("MARK-gpu")  # type: ignore[union-attr]
    assert "did you mean `H100`?" in str(info.value)


def test_fstring_interpolation_of_params_matches_the_text_form() -> None:
    p = Pipeline("demo")
    lr = p.param("lr", float, default=0.1)
    p.stage("train", image="x", command=["python", f"--lr={lr}", "$${HOME}"])
    stage = p.build().stages[0]
    assert str(stage.command[1]) == "--lr=${params.lr}"  # type: ignore[index]
    assert stage.command[2] == "${HOME}"  # type: ignore[index]


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_numbers_are_mistakes_not_crashes(value: float) -> None:
    """A .pipe file cannot write NaN or infinity; the builder reports them like any mistake."""
    p = Pipeline("demo")
    lr = p.param("lr", float, default=value)
    p.stage("train", image="x", command=["true", f"--lr={lr}"], resources=Resources(cpu=value))
    with pytest.raises(PipelineError) as info:
        p.build()
    assert [(d.code, d.message) for d in info.value.diagnostics] == [
        ("P0307", "default of `lr` is not a finite number"),
        ("P0205", f"`cpu`: {value!r} is not a CPU amount; write cores (8, 0.5) or \"500m\""),
    ]


@pytest.mark.parametrize("memory", [64, "64"])
def test_a_bare_number_is_not_a_memory_size_in_the_builder_either(memory: object) -> None:
    """`memory=64` would be 64 bytes on the cluster: the builder refuses it as `.pipe` does."""
    p = Pipeline("demo")
    p.stage("a", image="x", command=["true"], resources=Resources(memory=memory))
    with pytest.raises(PipelineError) as info:
        p.build()
    (diag,) = info.value.diagnostics
    assert diag.code == "P0205" and "needs a unit" in diag.message
    assert diag.help is not None and "64Gi" in diag.help
