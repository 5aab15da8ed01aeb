"""What training code sees: ``durapipe.runtime.context()``.

    ctx = durapipe.runtime.context()
    restored = ctx.checkpoint.load()          # None on a first attempt
    for step in ...:
        ...
        if step % 100 == 0 or ctx.stop_requested():
            ctx.checkpoint.save(state_dir, metadata={"step": step})
        if ctx.stop_requested():
            ctx.checkpoint.flush()            # the final save reaches the store
            break

The stop flag is set by SIGTERM (a flag-only handler, installed on first use of the context
in the main thread) or by the wrapper's control file, whichever comes first; signal handlers
must not do I/O, so the loop acts on the flag at its next step boundary.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from durapipe.runtime import contract
from durapipe.runtime.checkpoint import Checkpoint
from durapipe.runtime.deadline import grace_from_env, note_stop_signal
from durapipe.runtime.signalflag import SignalFlag
from durapipe.runtime.errors import LineBusy
# Re-exported: the SDK's failure record is the wrapper's verdict input (docs/runtime.md).
from durapipe.runtime.verdict import is_gpu_oom as is_gpu_oom
from durapipe.runtime.verdict import record_failure as record_failure

#: Set by the SIGTERM handler, so it must take no lock (``signalflag``).
_stop_flag = SignalFlag()
_handler_lock = threading.Lock()
_handler_installed = False


def _on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    _stop_flag.set()
    # Starts the clock of the grace period that bounds the final save's wait.
    note_stop_signal()


def install_stop_handler() -> bool:
    """Install the flag-only SIGTERM handler (main thread only); ``False`` where impossible."""
    global _handler_installed
    with _handler_lock:
        if _handler_installed:
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        signal.signal(signal.SIGTERM, _on_sigterm)
        _handler_installed = True
        return True


def _control_file(name: str) -> Path | None:
    directory = os.environ.get(contract.ENV_CONTROL_DIR)
    return Path(directory) / name if directory else None


def stop_requested() -> bool:
    """Whether this attempt has been asked to stop (preemption, eviction, Ctrl-C upstream)."""
    if _stop_flag.is_set():
        return True
    marker = _control_file(contract.CONTROL_STOP_FILE)
    if marker is not None and marker.exists():
        _stop_flag.set()
        return True
    return False


#: How often :func:`wait_for_stop` looks for the wrapper's stop file (a signal wakes it at once).
_STOP_FILE_POLL_SECONDS = 0.05


def wait_for_stop(timeout: float | None = None) -> bool:
    """Block until this attempt is asked to stop or ``timeout`` seconds pass; return whether it
    was.  For a stage with nothing to do between steps (a server, a poller, a step held at a
    known point) that must still end promptly on preemption."""
    install_stop_handler()
    deadline = None if timeout is None else time.monotonic() + timeout
    while not stop_requested():
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return False
        _stop_flag.wait(_STOP_FILE_POLL_SECONDS if left is None
                        else min(_STOP_FILE_POLL_SECONDS, left))
    return True


def memory_pressure() -> dict[str, Any] | None:
    """``{"usage": ..., "limit": ...}`` while the wrapper sees memory near the limit."""
    marker = _control_file(contract.CONTROL_MEMORY_PRESSURE_FILE)
    if marker is None:
        return None
    try:
        value = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


_previous_excepthook = sys.excepthook


def _excepthook(
    kind: type[BaseException], error: BaseException, trace: TracebackType | None
) -> None:
    record_failure(error)
    if isinstance(error, LineBusy):
        # Not a bug in the user's code: the message says what to do; a traceback would bury it.
        sys.stderr.write(f"durapipe: {error}\n")
        sys.stderr.flush()
        return
    _previous_excepthook(kind, error, trace)


def install_failure_hook() -> None:
    """Record uncaught exceptions for the wrapper (GPU OOM is recognised by exception class)."""
    if sys.excepthook is not _excepthook:
        sys.excepthook = _excepthook


@dataclass
class RuntimeContext:
    """The stage's identity and services, built from the environment the compiler sets."""

    pipeline: str = ""
    stage: str = ""
    run_id: str = ""
    attempt: int = 0
    rung: int = 0
    gpu_type: str = ""
    checkpoint: Checkpoint | None = None
    env: dict[str, str] = field(default_factory=dict, repr=False)

    @staticmethod
    def stop_requested() -> bool:
        return stop_requested()

    @staticmethod
    def wait_for_stop(timeout: float | None = None) -> bool:
        return wait_for_stop(timeout)

    @staticmethod
    def memory_pressure() -> dict[str, Any] | None:
        return memory_pressure()


_context: RuntimeContext | None = None
_context_lock = threading.Lock()


def _int(value: str | None) -> int:
    return int(value) if value and value.strip().isdigit() else 0


def _refuse_a_bad_grace_period(env: dict[str, str]) -> None:
    """A grace period (or a line lease) that is not a positive finite number is refused as
    the wrapper refuses it (one line, exit 64), never replaced by a default the pod does not
    have."""
    try:
        grace_from_env(env)
        contract.line_lease_from_env(env)
    except ValueError as error:
        sys.stderr.write(f"durapipe: {error}\n")
        sys.stderr.flush()
        raise SystemExit(contract.EXIT_USAGE) from None


def context() -> RuntimeContext:
    """The process's runtime context (created once; installs the stop and failure hooks).

    Exits the process with status 64 when ``DURAPIPE_GRACE_SECONDS`` is not a grace period."""
    global _context
    with _context_lock:
        if _context is None:
            env = dict(os.environ)
            _refuse_a_bad_grace_period(env)
            install_stop_handler()
            install_failure_hook()
            _context = RuntimeContext(
                pipeline=env.get(contract.ENV_PIPELINE, ""),
                stage=env.get(contract.ENV_STAGE, ""),
                run_id=env.get(contract.ENV_RUN_ID, ""),
                attempt=_int(env.get(contract.ENV_ATTEMPT)),
                rung=_int(env.get(contract.ENV_RUNG)),
                gpu_type=env.get(contract.ENV_GPU_TYPE, ""),
                checkpoint=Checkpoint.from_env(env),
                env=env,
            )
        return _context


__all__ = [
    "RuntimeContext",
    "context",
    "install_failure_hook",
    "install_stop_handler",
    "is_gpu_oom",
    "memory_pressure",
    "record_failure",
    "stop_requested",
    "wait_for_stop",
]
