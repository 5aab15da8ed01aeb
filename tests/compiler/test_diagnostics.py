"""Every compilation code (P04xx) that a `.pipe` file can reach has a case under
``tests/compiler/cases/`` whose rendered diagnostics are snapshotted (the front end's own codes
are in tests/dsl/test_diagnostics.py).  P0403 (an object over Argo's limits even after
splitting) and P0405 (a bare stage name as a value; the front end reports P0301 first) are
reached only by models built directly: tests/compiler/test_split.py and test_lowering.py.
P0409 (an object a client-side apply cannot store) is the GitOps output's check, in
tests/compiler/test_gitops.py.  P0404 (Argo templating) is the front end's rule, with its case in tests/cases/errors, so that
`check`, `compile` and `run` refuse the same text."""

from __future__ import annotations

from pathlib import Path

import pytest
from syrupy.assertion import SnapshotAssertion

from durapipe.compiler import CompileOptions, compile_pipeline
from durapipe.dsl import load_path
from durapipe.dsl.codes import CODES
from durapipe.dsl.diagnostics import render

REPO = Path(__file__).resolve().parents[2]
CASES = sorted((Path(__file__).parent / "cases").glob("P04*.pipe"))
OPTIONS = {
    "P0401": {"argo_version": "3.7"},
    "P0408": {"kind": "cron"},
}
REACHED_ELSEWHERE = {"P0403", "P0404", "P0405", "P0409"}


def test_every_compilation_code_has_a_case() -> None:
    covered = {p.name[:5] for p in CASES} | REACHED_ELSEWHERE
    assert {c for c in CODES if c.startswith("P04")} <= covered


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_compilation_case(path: Path, snapshot_text: SnapshotAssertion,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    shown = path.relative_to(REPO).as_posix()
    loaded = load_path(shown)
    assert loaded.pipeline is not None, render(loaded.diagnostics)
    code = path.name[:5]
    result = compile_pipeline(loaded.pipeline, CompileOptions(
        source_map=loaded.source_map, source_path=shown, **OPTIONS.get(code, {})))  # type: ignore[arg-type]
    assert code in [d.code for d in result.diagnostics]
    assert result.documents == []
    for diag in result.diagnostics:
        assert diag.span is not None, diag  # every compilation error points at the source
    assert render(result.diagnostics) + "\n" == snapshot_text
