"""End-to-end scenarios on the real control plane: one test per case file in cases/.

Cases whose ``known_fault`` names a lowering fault show that fault: they fail until the
lowering is fixed (issue 12's fix branch). ``KNOWN_FAULTS`` lists them so that none is hidden.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import E2E
from .scenario import load_cases, run_case

CASES = load_cases()
#: Cases that show a lowering fault of the compiler, by the fault they show.
KNOWN_FAULTS = {c.name: c.known_fault for c in CASES if c.known_fault}

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_scenario(case, e2e: E2E, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    problems = run_case(case, e2e.cluster, e2e.fates, tmp_path)
    assert not problems, "\n".join(problems)
