"""Complete pipelines shown in the docs are valid: the docs cannot drift from the language."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from durapipe.dsl import loads, render

ROOT = Path(__file__).resolve().parents[1]
_BLOCK_RE = re.compile(r"```hcl\n(.*?)```", re.DOTALL)


def _complete_pipelines() -> list[tuple[str, str]]:
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for n, block in enumerate(_BLOCK_RE.findall(doc.read_text(encoding="utf-8"))):
            if block.lstrip().startswith("pipeline ") and "stage " in block:
                found.append((f"{doc.name}#{n}", block))
    return found


PIPELINES = _complete_pipelines()


def test_docs_show_complete_pipelines() -> None:
    assert len(PIPELINES) >= 2


@pytest.mark.parametrize(("name", "text"), PIPELINES, ids=[n for n, _ in PIPELINES])
def test_documented_pipeline_checks_clean(name: str, text: str) -> None:
    result = loads(text, name)
    errors = [d for d in result.diagnostics if d.is_error]
    assert errors == [], render(errors)


def _guarantee_tests() -> list[str]:
    text = (ROOT / "docs" / "runtime.md").read_text(encoding="utf-8")
    section = text.split("## Guarantees under faults", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "`" in line]
    return [name for row in rows for name in re.findall(r"`(test_\w+\.py::test_\w+)`", row)]


def test_every_guarantee_of_the_runtime_names_a_test_that_exists() -> None:
    names = _guarantee_tests()
    assert len(names) >= 15
    for name in names:
        module, _, function = name.partition("::")
        source = (ROOT / "tests" / "runtime" / module).read_text(encoding="utf-8")
        assert f"def {function}(" in source, f"docs/runtime.md names {name}, which is not a test"


def test_ci_runs_the_quickstarts_test_command_verbatim() -> None:
    """README's Quickstart promises that its test command is what CI runs: .ci/run must run
    exactly that line, and it must be the full tier (the fast one leaves the harness out)."""
    quickstart = (ROOT / "README.md").read_text(encoding="utf-8").split("## Quickstart", 1)[1].split("```")[1]
    commands = [line for line in quickstart.splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert len(commands) == 3 and commands[0] == "sh", commands  # the fence's language, two commands
    test_command = commands[2]
    assert "pytest" in test_command and "--full" in test_command.split(), test_command
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert test_command in ci, f".ci/run does not run the Quickstart's {test_command!r}"
