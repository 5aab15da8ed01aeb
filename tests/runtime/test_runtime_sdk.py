"""``runtime.wait_for_stop``: a stage with nothing to do between steps still ends on a stop."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from durapipe.runtime import contract
from tests.runtime.runtime_helpers import child_env

WAITER = (
    "import sys, time\n"
    "from durapipe import runtime\n"
    "from durapipe.runtime.sdk import install_stop_handler\n"
    # Before "waiting": a SIGTERM sent on that line must find the handler that wait_for_stop
    # installs, not Python's default (on a loaded machine it arrived first and killed the
    # waiter). In a pod the kubelet's SIGTERM comes long after the stage started.
    "install_stop_handler()\n"
    "started = time.monotonic()\n"
    "print('waiting', flush=True)\n"
    "stopped = runtime.wait_for_stop(float(sys.argv[1]))\n"
    "print(stopped, round(time.monotonic() - started, 3), flush=True)\n"
)


def start_waiter(timeout: float, **env: str) -> subprocess.Popen[str]:
    waiter = subprocess.Popen([sys.executable, "-c", WAITER, str(timeout)],
                              env=child_env(**env), stdout=subprocess.PIPE, text=True)
    assert waiter.stdout is not None and waiter.stdout.readline() == "waiting\n"
    return waiter


def result_of(waiter: subprocess.Popen[str]) -> tuple[str, float]:
    assert waiter.stdout is not None
    stopped, elapsed = waiter.stdout.read().split()
    assert waiter.wait(timeout=30) == 0
    return stopped, float(elapsed)


def test_sigterm_ends_the_wait() -> None:
    waiter = start_waiter(60)
    time.sleep(0.2)
    waiter.send_signal(signal.SIGTERM)
    stopped, elapsed = result_of(waiter)
    assert stopped == "True" and 0.2 <= elapsed < 30


def test_the_wrappers_stop_file_ends_the_wait(tmp_path: Path) -> None:
    waiter = start_waiter(60, **{contract.ENV_CONTROL_DIR: str(tmp_path)})
    time.sleep(0.2)
    (tmp_path / contract.CONTROL_STOP_FILE).touch()
    stopped, elapsed = result_of(waiter)
    assert stopped == "True" and 0.2 <= elapsed < 30


def test_without_a_stop_the_wait_lasts_its_timeout(tmp_path: Path) -> None:
    stopped, elapsed = result_of(start_waiter(1.5, **{contract.ENV_CONTROL_DIR: str(tmp_path)}))
    assert stopped == "False" and elapsed >= 1.5
