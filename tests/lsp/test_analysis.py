"""The analysis behind `durapipe lsp`, in-process: quick fixes fix, and no prefix breaks it."""

from __future__ import annotations

from pathlib import Path

import pytest

from durapipe.dsl import loads
from durapipe.lsp import analysis as an
from durapipe.lsp import complete as cp
from durapipe.lsp import fixes as fx
from durapipe.lsp import vocabulary as vocab
from durapipe.lsp.fixes import Fix
from tests.pipe_files import CASES, EXAMPLES


def _apply(text: str, fix: Fix) -> str:
    for edit in sorted(fix.edits, key=lambda e: e.start, reverse=True):
        text = text[:edit.start] + edit.text + text[edit.end:]
    return text


def test_every_fix_removes_its_diagnostic() -> None:
    """Across the case files: applying a quick fix makes its diagnostic go away."""
    applied = set()
    for path in CASES:
        text = path.read_text(encoding="utf-8")
        for diag in loads(text, str(path)).diagnostics:
            for fix in fx.fixes(diag, text):
                after = loads(_apply(text, fix), str(path)).diagnostics
                assert diag.code not in {d.code for d in after
                                         if d.span and abs(d.span.start - diag.span.start) < 3}, (
                    path.name, diag.message, fix)
                applied.add(diag.code)
    assert {"P0101", "P0102", "P0104", "P0105", "P0201", "P0103"} <= applied


def test_the_vocabulary_is_the_lowering_tables() -> None:
    from durapipe.dsl import tree_to_data as td

    assert set(vocab.blocks()["stage"].children) == set(td.STAGE_SCHEMA)
    assert set(vocab.blocks()["defaults"].children) == set(td.STAGE_SCHEMA) - set(
        td.NOT_IN_DEFAULTS)
    assert set(vocab.blocks()["pipeline"].children) == set(td.PIPELINE_SCHEMA)
    assert vocab.top_level_keywords() == ("pipeline", "stage", "defaults", "params")
    retry = vocab.lookup(("stage", "retry", "gpu_oom"))
    assert retry is not None and retry.choices == ("fail", "retry")
    memory = vocab.lookup(("stage", "resources", "memory"))
    assert memory is not None and memory.unit == "bytes" and memory.doc


def test_canonical_values_of_unit_literals() -> None:
    assert an.canonical("1.5Ti", "bytes") == "`1.5Ti` = 1,649,267,441,664 bytes (1536Gi)"
    assert an.canonical("1h30m", "seconds") == "`1h30m` = 5,400 seconds (1h30m)"
    assert "unknown memory unit" in (an.canonical("12Qi", "bytes") or "")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_prefix_of_an_example_is_answered(path: Path) -> None:
    """The text an editor holds while the file is typed: analysis, completion, hover,
    definition, outline and fixes all answer (no exception) at the end of each prefix."""
    text = path.read_text(encoding="utf-8")
    previous = None
    for end in range(0, len(text) + 1, 7):
        prefix = text[:end]
        result = an.analyse(prefix, "typed.pipe", previous)
        previous = result
        cp.complete(prefix, end, result)
        an.hover(result, end)
        result.occurrence_at(end)
        an.symbols(result)
        for diag in result.diagnostics:
            fx.fixes(diag, prefix)


def test_positions_count_utf16_code_units() -> None:
    from lsprotocol import types as t

    from durapipe.lsp.server import Positions

    text = 'a = "é😀x"\nb\n'
    positions = Positions(text)
    x = text.index("x")
    assert positions.position(x) == t.Position(line=0, character=8)  # 😀 is two units
    assert positions.offset(t.Position(line=0, character=8)) == x
    assert positions.offset(t.Position(line=1, character=0)) == text.index("b")
    assert positions.offset(t.Position(line=1, character=99)) == text.index("b") + 1
    assert positions.offset(t.Position(line=9, character=0)) == len(text)
    utf32 = Positions(text, t.PositionEncodingKind.Utf32)
    assert utf32.position(x) == t.Position(line=0, character=7)


@pytest.mark.parametrize(("source", "code", "fixed"), [
    ('pipeline "p" { timezone = "Europe/Berln" }\n', "P0320",
     'pipeline "p" { timezone = "Europe/Berlin" }\n'),
    ('pipeline "My_Pipe" {}\n', "P0305", 'pipeline "my-pipe" {}\n'),
    ('pipeline "p" {}\nstage "Train Step" { image = "i" command = ["x"] }\n', "P0305",
     'pipeline "p" {}\nstage "train-step" { image = "i" command = ["x"] }\n'),
    ('pipeline "p" {}\nstage "a" { image = "i" command = ["x"] resources { memory = 16GB } }\n',
     "P0205",
     'pipeline "p" {}\nstage "a" { image = "i" command = ["x"] resources { memory = 16Gi } }\n'),
])
def test_a_diagnostic_that_names_the_fitting_value_has_a_fix_that_writes_it(
        source: str, code: str, fixed: str) -> None:
    """#27: the time zone, the name and the unit a diagnostic suggests, as quick fixes."""
    (diag,) = [d for d in loads(source, "x.pipe").diagnostics if d.code == code]
    (fix,) = fx.fixes(diag, source)
    assert _apply(source, fix) == fixed
    assert code not in {d.code for d in loads(fixed, "x.pipe").diagnostics}


def test_every_diagnostic_of_the_cases_that_carries_a_suggestion_has_a_fix() -> None:
    missing = []
    for path in CASES:
        text = path.read_text(encoding="utf-8")
        for diag in loads(text, str(path)).diagnostics:
            if (diag.suggestion or "did you mean `" in (diag.help or "")) and not fx.fixes(
                    diag, text):
                missing.append((path.name, diag.code, diag.message))
    assert not missing


def test_hover_on_any_word_of_an_output_reference_describes_the_output() -> None:
    """#27: `prep.outputs.data`: the stage on its name, the output on `outputs` and `data`."""
    text = (EXAMPLES[0].parent / "prep_train_eval.pipe").read_text()
    analysis = an.analyse(text, "prep_train_eval.pipe")
    at = text.index("prep.outputs.data")
    on_stage = an.hover(analysis, at + 1)
    assert on_stage is not None and on_stage[0].startswith("stage `prep`")
    for offset in (at + len("prep.o"), at + len("prep.outputs.d")):
        found = an.hover(analysis, offset)
        assert found is not None, offset
        markdown, span = found
        assert markdown.startswith("output `data` of stage `prep`")
        assert "written by the stage at `/out/data`" in markdown
        assert span is not None and at <= span.start and span.end <= at + len("prep.outputs.data")


def test_needs_completion_never_offers_a_stage_that_would_make_a_cycle() -> None:
    """#27: in `prep`'s `needs`, the stages downstream of it (train, eval) would be a cycle."""
    text = (EXAMPLES[0].parent / "prep_train_eval.pipe").read_text()
    at = text.index('stage "prep" {') + len('stage "prep" {')
    text = text[:at] + "\n  needs = []" + text[at:]
    analysis = an.analyse(text, "prep_train_eval.pipe")
    assert analysis.pipeline is not None
    cursor = text.index("needs = []") + len("needs = [")
    assert [i.label for i in cp.complete(text, cursor, analysis)] == []
    at = text.index('stage "eval" {') + len('stage "eval" {')
    text = text[:at] + "\n  needs = []" + text[at:]
    analysis = an.analyse(text, "prep_train_eval.pipe")
    cursor = text.index("needs = []", at) + len("needs = [")
    assert [i.label for i in cp.complete(text, cursor, analysis)] == ["prep", "train"]


def test_hover_on_a_stage_shows_its_worst_case_at_the_pipelines_prices() -> None:
    """#24: the hover of a stage's name holds `durapipe bound`'s worst case, at the prices
    the pipeline sets; a stage without a bound says why."""
    text = (EXAMPLES[0].parent / "gpu_fallback.pipe").read_text()
    analysis = an.analyse(text, "gpu_fallback.pipe")
    found = an.hover(analysis, text.index('stage "finetune"') + len('stage "f'))
    assert found is not None
    # docs/language.md derives each number.
    assert "worst case: 97h20m, 1,541.33 GPU-h, $6,115.02 (best 24h)" in found[0]
    # The team's own H100 rate: the dearest path (every attempt on H100) costs less.
    cheaper = text.replace('pipeline "llm-finetune" {',
                           'pipeline "llm-finetune" {\n  prices { gpu { H100 = 1 } }', 1)
    assert cheaper != text
    analysis = an.analyse(cheaper, "gpu_fallback.pipe")
    found = an.hover(analysis, cheaper.index('stage "finetune"') + len('stage "f'))
    assert found is not None and "worst case: 97h20m, 1,541.33 GPU-h, $" in found[0]
    assert "$6,115.02" not in found[0]
    text = (EXAMPLES[0].parent / "prep_train_eval.pipe").read_text()
    analysis = an.analyse(text, "prep_train_eval.pipe")
    found = an.hover(analysis, text.index('stage "train"') + len('stage "t'))
    assert found is not None and "worst case: unbounded (no timeout)" in found[0]
