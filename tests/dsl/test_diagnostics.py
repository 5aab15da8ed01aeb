"""Every diagnostic code, exercised by one file under ``tests/cases/errors`` and snapshotted.

A case file is named ``CODE_what_it_shows.pipe`` and triggers exactly that code.  Its rendered
terminal output is compared with ``__snapshots__/test_diagnostics/*.txt``; after an intended
change of wording run ``python -m pytest tests/dsl/test_diagnostics.py --snapshot-update`` and
read every changed snapshot.  Paths in the output are repo-relative, so the snapshots do not
depend on where the checkout lives.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from syrupy.assertion import SnapshotAssertion

from durapipe.dsl import LoadResult, load_path
from durapipe.dsl.codes import CODES
from durapipe.dsl.diagnostics import Severity, render

REPO_ROOT = Path(__file__).resolve().parents[2]
CASES_DIR = REPO_ROOT / "tests" / "cases"
# Builder modules (.py) are cases too: P0004 is about them.
ERROR_CASES = sorted([*(CASES_DIR / "errors").glob("*.pipe"),
                      *(CASES_DIR / "errors").glob("*.py")])
MULTIPLE_CASES = sorted((CASES_DIR / "multiple").glob("*.pipe"))

#: Codes without a case file here, and why.  Everything else in ``CODES`` must have one.
EXEMPT: dict[str, str] = {
    **{code: "raised by the compiler to Argo, after the front end; tested with the compiler"
       for code in CODES if code.startswith("P04") and code != "P0404"},
    **{code: "raised after the front end accepted the file (by `durapipe bound`, and by "
             "`check`/`compile` through the compiler for `limits`); tested in "
             "tests/plan/test_bound.py"
       for code in ("P0350", "P0351", "P0352", "P0353", "P0354", "P0355")},
}


def relative(path: Path) -> str:
    return path.relative_to(REPO_ROOT).as_posix()


def load_relative(path: Path, monkeypatch: pytest.MonkeyPatch) -> LoadResult:
    """Load ``path`` by its repo-relative name, which is what the diagnostics then show."""
    monkeypatch.chdir(REPO_ROOT)
    return load_path(relative(path))


def code_of(path: Path) -> str:
    return path.name.split("_", 1)[0]


@pytest.mark.parametrize("path", ERROR_CASES, ids=[p.stem for p in ERROR_CASES])
def test_error_case(path: Path, monkeypatch: pytest.MonkeyPatch,
                    snapshot_text: SnapshotAssertion) -> None:
    code = code_of(path)
    assert code in CODES, f"{path.name}: {code} is not a registered code"
    result = load_relative(path, monkeypatch)
    codes = [d.code for d in result.diagnostics]
    assert code in codes, f"{path.name} should report {code}, got {codes}"
    if code.startswith("W"):
        assert result.ok, f"{path.name} should hold only warnings, got {codes}"
        assert result.diagnostics[0].code == code
    else:
        assert not result.ok and result.pipeline is None
        errors = [d.code for d in result.diagnostics if d.severity is Severity.ERROR]
        assert errors[0] == code
        # One mistake, one diagnostic: no cascade of other errors.
        assert set(errors) == {code}, f"{path.name}: unexpected errors {errors}"
    text = render(result.diagnostics, "human")
    assert str(REPO_ROOT) not in text
    assert snapshot_text == text + "\n"


def test_every_code_has_a_case_file() -> None:
    covered = {code_of(p) for p in ERROR_CASES}
    missing = sorted(set(CODES) - covered - set(EXEMPT))
    assert not missing, f"codes without a file in tests/cases/errors: {missing}"
    unknown = sorted(covered - set(CODES))
    assert not unknown, f"case files for codes that are not registered: {unknown}"
    assert not covered & set(EXEMPT), "an exempt code has a case file; drop the exemption"
    assert set(EXEMPT) <= set(CODES)


@pytest.mark.parametrize("code", sorted(CODES))
def test_every_code_is_explained(code: str) -> None:
    entry = CODES[code]
    assert entry.code == code
    assert entry.title.strip()
    assert entry.explanation.strip()
    assert entry.explanation == entry.explanation.strip("\n")


@pytest.mark.parametrize(("name", "expected"), [
    ("three_phases.pipe", [("P0101", 6), ("P0301", 13), ("P0201", 14)]),
    ("three_syntax.pipe", [("P0103", 5), ("P0104", 8), ("P0105", 11)]),
])
def test_three_mistakes_give_three_diagnostics(name: str, expected: list[tuple[str, int]],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    result = load_relative(CASES_DIR / "multiple" / name, monkeypatch)
    errors = [d for d in result.diagnostics if d.is_error]
    assert [(d.code, d.span.line if d.span else 0) for d in errors] == expected
    # Sorted in source order.
    assert errors == sorted(errors, key=lambda d: d.sort_key())


@pytest.mark.parametrize("path", MULTIPLE_CASES, ids=[p.stem for p in MULTIPLE_CASES])
def test_multiple_mistakes_snapshot(path: Path, monkeypatch: pytest.MonkeyPatch,
                                    snapshot_text: SnapshotAssertion) -> None:
    result = load_relative(path, monkeypatch)
    starts = [(d.span.start if d.span else -1) for d in result.diagnostics]
    assert starts == sorted(starts)
    assert snapshot_text == render(result.diagnostics, "human") + "\n"


def test_json_rendering(monkeypatch: pytest.MonkeyPatch) -> None:
    path = CASES_DIR / "multiple" / "three_phases.pipe"
    result = load_relative(path, monkeypatch)
    records = json.loads(render(result.diagnostics, "json"))
    assert isinstance(records, list) and len(records) == 3
    keys = {"file", "line", "column", "end_line", "end_column", "code", "severity", "message",
            "help", "notes", "labels"}
    for record in records:
        assert set(record) == keys
        assert record["file"] == relative(path)
        assert record["severity"] == "error"
        assert isinstance(record["line"], int) and isinstance(record["column"], int)
        assert (record["end_line"], record["end_column"]) >= (record["line"], record["column"])
        assert record["labels"][0]["line"] == record["line"]
        assert record["labels"][0]["column"] == record["column"]
    assert [(r["code"], r["line"], r["column"]) for r in records] == [
        ("P0101", 6, 8), ("P0301", 13, 46), ("P0201", 14, 15)]
    colon = records[0]
    assert (colon["end_line"], colon["end_column"]) == (6, 9)
    assert colon["help"].startswith("attributes are written `name = value`")


def test_json_rendering_without_a_span(monkeypatch: pytest.MonkeyPatch) -> None:
    path = CASES_DIR / "errors" / "P0001_input_is_a_directory.pipe"
    records = json.loads(render(load_relative(path, monkeypatch).diagnostics, "json"))
    assert [(r["code"], r["file"], r["line"], r["column"]) for r in records] == [
        ("P0001", relative(path), None, None)]


def test_short_rendering(monkeypatch: pytest.MonkeyPatch) -> None:
    result = load_relative(CASES_DIR / "multiple" / "three_phases.pipe", monkeypatch)
    assert render(result.diagnostics, "short").splitlines() == [
        ("tests/cases/multiple/three_phases.pipe:6:8: error[P0101]: "
         "expected `=` after the attribute name, found `:`"),
        ("tests/cases/multiple/three_phases.pipe:13:46: error[P0301]: "
         "unknown output `prep.outputs.dta`"),
        ("tests/cases/multiple/three_phases.pipe:14:15: error[P0201]: "
         "unknown attribute `memroy` in `resources`"),
    ]


def test_valid_cases_have_no_diagnostics(monkeypatch: pytest.MonkeyPatch) -> None:
    for path in sorted((CASES_DIR / "valid").glob("*.pipe")):
        result = load_relative(path, monkeypatch)
        assert result.ok and result.diagnostics == [], render(result.diagnostics)
