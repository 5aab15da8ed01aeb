"""The `.pipe` files that tests run every tool over: the examples and the case files."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import REPO_ROOT


def _utf8(path: Path) -> bool:
    try:
        path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, IsADirectoryError):
        return False  # the P0001 and P0002 cases: reported before anything is read as text
    return True


EXAMPLES = sorted(REPO_ROOT.glob("examples/**/*.pipe"))
#: Case files that are UTF-8 text (every one but those of P0001 and P0002).
CASES = sorted(p for p in REPO_ROOT.glob("tests/cases/**/*.pipe") if _utf8(p))
