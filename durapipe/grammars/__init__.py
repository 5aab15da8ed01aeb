"""The ``.pipe`` grammar, shipped as a data file."""

from __future__ import annotations

from pathlib import Path


def read(name: str = "pipe.lark") -> str:
    # A plain file read: importlib.resources would pull in zipfile and friends at start-up.
    return (Path(__file__).parent / name).read_text(encoding="utf-8")
