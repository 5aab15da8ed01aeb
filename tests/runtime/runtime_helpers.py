"""Helpers shared by the runtime tests: running Python children with the repo importable.

Imported by name (pytest puts this directory on ``sys.path``); the name is unique to avoid
clashing with other test directories' helpers.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples" / "runtime"


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child process: ours, the repo on ``PYTHONPATH``, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURAPIPE_")}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def runtime_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "durapipe.runtime", *args]
