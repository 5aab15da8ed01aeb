"""Helpers shared by the runtime tests: running Python children with the repo importable.

Imported by name (pytest puts this directory on ``sys.path``); the name is unique to avoid
clashing with other test directories' helpers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from durapipe.runtime import contract

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


def start_with_setting(reader: str, variable: str, value: str,
                       tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The SDK (``runtime.context()``, then prints "ran") or the upload agent started with
    ``variable=value`` in its environment, run to its end."""
    store = (tmp_path / "store").as_uri()
    if reader == "sdk":
        command = [sys.executable, "-c",
                   "from durapipe import runtime\nruntime.context()\nprint('ran')"]
    else:
        command = runtime_cmd("agent", "--spool", str(tmp_path / "spool"), "--uri", store)
    env = child_env(**{variable: value, contract.ENV_CHECKPOINT_URI: store})
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=30,
                          check=False)


def preempt_after_line(command: list[str], *, env: dict[str, str], termination_log: Path,
                       line: str, timeout: float, stderr: int | None = None) -> str:
    """Run ``command`` under the runtime wrapper and SIGTERM it once it prints ``line``, as a
    node drain would; the wrapper must exit as preempted.  Returns the rest of its output."""
    wrapper = subprocess.Popen(
        runtime_cmd("exec", "--termination-log", str(termination_log), "--", *command),
        env=env, stdout=subprocess.PIPE, stderr=stderr, text=True,
    )
    assert wrapper.stdout is not None
    for printed in wrapper.stdout:
        if printed.strip() == line:
            wrapper.send_signal(signal.SIGTERM)
            break
    rest = wrapper.stdout.read()
    assert wrapper.wait(timeout=timeout) == contract.EXIT_PREEMPTED, rest
    return rest
