"""Parsing piece by piece (the server, on large files) gives what parsing the whole file does."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from durapipe.dsl import fmt, load
from durapipe.dsl import syntax as st
from durapipe.dsl.diagnostics import Diagnostic
from durapipe.dsl.parser import parse as _parse
from durapipe.dsl.source import Source
from durapipe.lsp.incremental import PieceParser, pieces
from tests.conftest import REPO_ROOT
from tests.pipe_files import CASES, EXAMPLES

FILES = [*EXAMPLES, *CASES]


def _key(diags: list[Diagnostic]) -> list[tuple[object, ...]]:
    return [(d.code, d.message, d.help, d.notes, d.severity,
             tuple((lb.span.start, lb.span.end, lb.message) for lb in d.labels))
            for d in diags]


def _both(text: str, parser: PieceParser | None = None) -> tuple[load.LoadResult,
                                                                   load.LoadResult]:
    """The whole-file result and the piecewise one (every piece parsed on its own)."""
    whole = load.loads(text, "f.pipe")
    parser = parser or PieceParser(seed_from_whole=False)
    piecewise = load.from_syntax(*parser.parse(text, "f.pipe"))
    return whole, piecewise


def parser_parse(text: str) -> st.File | None:
    return _parse(Source("f.pipe", text))[0]


def _tree(file: st.File | None) -> object:
    assert file is not None
    return (fmt.syntax_shape(file), [(i.span.start, i.span.end) for i in file.items],
            [(c.span.start, c.text) for c in file.comments])


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_piecewise_diagnostics_and_model_match_the_whole_file(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    whole, piecewise = _both(text)
    assert _key(piecewise.diagnostics) == _key(whole.diagnostics)
    assert piecewise.pipeline == whole.pipeline


def test_pieces_start_at_top_level_keywords_only() -> None:
    text = ('pipeline "p" {}\n# stage "in a comment" {\nstage "a" {\n  env { X = "stage \\"" }\n'
            '  script = <<EOT\nstage "in a heredoc" {\nEOT\n}\n  stage "b" {}\n')
    starts = pieces(text)
    assert [text[s:].split("\n", 1)[0] for s in starts] == [
        'pipeline "p" {}', 'stage "a" {', '  stage "b" {}']


def test_edits_reuse_pieces_and_stay_exact() -> None:
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    from check_bench import generate

    text = generate(60)
    parser = PieceParser()
    _both(text, parser)  # the first version is parsed whole, and its pieces remembered
    parsed = len(parser.cache)
    assert parsed == 63  # pipeline, params, defaults and 60 stages
    # What was remembered is what parsing each piece gives.
    fresh = PieceParser(seed_from_whole=False)
    assert _tree(parser.parse(text, "f.pipe")[0]) == _tree(fresh.parse(text, "f.pipe")[0])
    assert _tree(parser.parse(text, "f.pipe")[0]) == _tree(parser_parse(text))
    edits = [text.replace('stage "s30" {', 'stage "s30" {\n  memroy = 1Gi', 1),
             text.replace('stage "s31" {', 'stage "s31" { image = ', 1),
             text.replace("s30.outputs.data", "s30.outputs.dta", 1),
             text.replace('stage "s40" {\n', 'stage "s40" \n', 1),
             text[:len(text) // 2]]
    for edited in edits:
        whole, piecewise = _both(edited, parser)
        assert _key(piecewise.diagnostics) == _key(whole.diagnostics)
        assert whole.diagnostics != [], edited[-300:]
    assert len(parser.cache) < parsed + 3 * len(edits)  # the other pieces came from the cache
