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
