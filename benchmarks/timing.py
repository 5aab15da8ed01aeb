"""Timing helpers shared by the benchmark scripts (they run as `python benchmarks/NAME.py`,
which puts this folder on sys.path)."""

from __future__ import annotations

import time
from collections.abc import Callable


def timed(action: Callable[[], object]) -> float:
    """Wall-clock seconds of one call."""
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def best_of(runs: int, action: Callable[[], object]) -> float:
    """The fastest of ``runs`` calls: the least disturbed by a noisy machine."""
    return min(timed(action) for _ in range(runs))


def ensure_bytecode() -> None:
    """Compile durapipe's modules to bytecode before timing cold processes.

    An installed durapipe runs from bytecode: pip compiles a wheel's modules at install, and
    Python caches them on the first import.  Where ``PYTHONDONTWRITEBYTECODE`` is set (these
    machines set it) an editable checkout never gets that cache, and every cold process would
    recompile durapipe from source (about 0.03 s) while hera, installed by pip, is timed
    from bytecode.  Compiling first makes both sides what a user has.
    """
    import compileall
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "durapipe"
    if not compileall.compile_dir(str(package), quiet=1):
        raise SystemExit(f"could not compile {package} to bytecode")
