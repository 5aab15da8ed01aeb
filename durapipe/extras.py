"""How to install what an optional extra adds, in words that work: durapipe is installed from
its git repository or a wheel built from it (README, "Install"), not from PyPI, so a
requirement on ``durapipe[lsp]`` alone would find nothing there.  The extra's own packages are on PyPI and
go into the environment durapipe already runs in.  ``tests/test_gitops_tools.py`` checks these
against ``pyproject.toml`` and that no message names a ``durapipe[...]`` requirement."""

from __future__ import annotations

#: Extra -> its requirements, as ``[project.optional-dependencies]`` lists them.
EXTRAS: dict[str, tuple[str, ...]] = {
    "cluster": ("kubernetes>=31",),
    "lsp": ("pygls>=2.1,<3", "lsprotocol>=2025.0"),
}


def install_hint(extra: str) -> str:
    """``pip install ...`` of the extra's packages, quoted for a POSIX shell."""
    return "python3 -m pip install " + " ".join(f"'{r}'" for r in EXTRAS[extra])


__all__ = ["EXTRAS", "install_hint"]
