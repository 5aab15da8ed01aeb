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
