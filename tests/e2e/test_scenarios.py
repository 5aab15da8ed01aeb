"""End-to-end scenarios on the real control plane: one test per case file in cases/.

Cases whose ``known_fault`` names a lowering fault show that fault: they fail until the
lowering is fixed (issue 12's fix branch). Until then they live in ``cases/known-faults/``,
outside the mandatory set; ``KNOWN_FAULTS`` lists them so that none is hidden, and
docs/argo-harness.md says what each shows. Moving a file up into ``cases/`` makes it mandatory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import E2E
from .scenario import CASES as CASES_DIR
from .scenario import compile_case, load_cases, run_case

CASES = load_cases()
#: Cases that show a lowering fault of the compiler (cases/known-faults/), by the fault.
KNOWN_FAULTS = {c.name: c.known_fault for c in load_cases(CASES_DIR / "known-faults")}

@pytest.mark.e2e
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_scenario(case, e2e: E2E, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    problems = run_case(case, e2e.cluster, e2e.fates, tmp_path)
    assert not problems, "\n".join(problems)


def _compile_tier(case):  # type: ignore[no-untyped-def]
    # Compiling the 2,000-stage case takes most of a minute; tests/compiler/test_split.py
    # compiles the same shape in the fast tier, so this one runs with the e2e cases.
    return pytest.param(case, marks=pytest.mark.e2e) if case.name == "wide_2000" else case


@pytest.mark.parametrize("case", [_compile_tier(c) for c in
                                  [*CASES, *load_cases(CASES_DIR / "known-faults")]],
                         ids=lambda c: c.name)
def test_case_compiles_and_is_well_formed(case, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Without a cluster: each case's pipeline compiles and its keys are ones the runner reads."""
    from .fates import Fate

    docs = compile_case(case, tmp_path)
    assert docs, case.name
    assert set(case.spec) <= {"source", "pipeline", "kind", "fates", "submit", "known_fault",
                              "kueue"}
    assert set(case.spec.get("kueue") or {}) <= {"profile", "queue", "quota", "holders",
                                                 "priority_classes"}
    for f in (case.spec.get("fates") or {}).values():
        Fate(**f)  # unknown rule names raise
    known = {"params", "workflow_deadline", "timeout", "fire_within", "phase", "min_seconds",
             "max_seconds", "outcomes", "memory", "nodes", "cache_hits", "cache_misses",
             "restart_attempts", "nodes_distinct", "jobset", "max_workflow_bytes",
             "cache_miss_reasons", "kueue", "attempt_reasons"}
    for sub in case.spec.get("submit", []):
        assert set(sub) <= known, set(sub) - known


def test_lowering_doc_names_only_e2e_cases_and_tests_that_exist() -> None:
    """docs/lowering.md's last column names, per construct, the e2e case that shows it: each
    name must be a case file here or a test function of tests/e2e."""
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "lowering.md").read_text()
    header = "| construct | proven by | on the real control plane"
    rows = doc[doc.index(header):].split("\n\n")[0].splitlines()[2:]
    tests = "".join(p.read_text() for p in Path(__file__).parent.glob("test_*.py"))
    names = {n for row in rows for n in re.findall(r"`([a-z][a-z0-9_/-]*)`", row.rsplit(" | ", 1)[1])
             if "_" in n or "/" in n}
    assert names, rows
    for name in names:
        assert (CASES_DIR / f"{name}.toml").exists() or f"def {name}(" in tests, name
    # The real node's cases are named by their files (tests/realnode/test_*.py).
    realnode = Path(__file__).resolve().parents[1] / "realnode"
    files = {f for row in rows for f in re.findall(r"`(test_[a-z0-9_]+\.py)`",
                                                   row.rsplit(" | ", 1)[1])}
    assert files, "the last column names no real-node case"
    for file in files:
        assert (realnode / file).exists() or (Path(__file__).parent / file).exists(), file
