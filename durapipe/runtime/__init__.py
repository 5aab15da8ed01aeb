"""The in-pod runtime of durapipe: what runs inside every stage container.

Importing this package costs nothing beyond the standard library; storage clients and
framework integrations are imported when first used.  The public names are loaded lazily:

- :func:`context` / :class:`RuntimeContext`: the stage's identity, ``checkpoint`` and the
  ``stop_requested()`` flag and ``wait_for_stop()`` (:mod:`durapipe.runtime.sdk`);
- :class:`Checkpoint`, :func:`latest_checkpoint` (:mod:`durapipe.runtime.checkpoint`);
- :func:`run_attempt` (:mod:`durapipe.runtime.wrapper`), :func:`classify`
  (:mod:`durapipe.runtime.verdict`);
- :func:`cache_key` (:mod:`durapipe.runtime.cachekey`), :func:`hash_path`
  (:mod:`durapipe.runtime.hashing`).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "context": "durapipe.runtime.sdk",
    "RuntimeContext": "durapipe.runtime.sdk",
    "stop_requested": "durapipe.runtime.sdk",
    "wait_for_stop": "durapipe.runtime.sdk",
    "Checkpoint": "durapipe.runtime.checkpoint",
    "CheckpointError": "durapipe.runtime.checkpoint",
    "latest_checkpoint": "durapipe.runtime.checkpoint",
    "run_attempt": "durapipe.runtime.wrapper",
    "classify": "durapipe.runtime.verdict",
    "AttemptResult": "durapipe.runtime.wrapper",
    "cache_key": "durapipe.runtime.cachekey",
    "hash_path": "durapipe.runtime.hashing",
}

__all__ = [
    "AttemptResult",
    "Checkpoint",
    "CheckpointError",
    "RuntimeContext",
    "cache_key",
    "classify",
    "context",
    "hash_path",
    "latest_checkpoint",
    "run_attempt",
    "stop_requested",
    "wait_for_stop",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'durapipe.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
