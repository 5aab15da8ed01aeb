"""The ``.pipe`` grammar, shipped as a data file."""

from __future__ import annotations

from importlib import resources


def read(name: str = "pipe.lark") -> str:
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
