"""Run one attempt of a stage command under supervision.

:class:`Supervisor` runs the command and gathers the facts about its ending (exit status,
SIGTERM, OOM-kill counters, the stderr tail, the SDK's failure record), has
:func:`~durapipe.runtime.verdict.classify` decide the verdict, writes the one-line verdict, and
hashes declared outputs after success.  ``python -m durapipe.runtime exec -- CMD`` is a thin
shell over :func:`run_attempt`; a local runner can call the same function in-process.  The
verdict's format is :mod:`durapipe.runtime.verdict` (re-exported here, where docs/runtime.md
names it).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from durapipe.runtime import contract
from durapipe.runtime.signalflag import SignalFlag
from durapipe.runtime.cgroup import MemoryCgroup, find_memory_cgroup, memory_limit_from_env
from durapipe.runtime.hashing import hash_path
from durapipe.runtime.verdict import (
    Classification,
    classify,
    parse_verdict_line,
    verdict_line,
    write_verdict,
)

STDERR_TAIL_BYTES = 64 * 1024
#: Working-set fraction of the limit at which the wrapper warns the stage.
MEMORY_WARN_FRACTION = 0.9
#: Below this fraction the warning is withdrawn (hysteresis, so it does not flap).
MEMORY_CLEAR_FRACTION = 0.8
DEFAULT_GRACE_SECONDS = contract.DEFAULT_GRACE_SECONDS


def parse_outputs(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    value = json.loads(text)
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(f"{contract.ENV_OUTPUTS} must be a JSON object of name -> path")
    return value


def write_output_hashes(outputs: Mapping[str, str], hash_dir: str | None) -> dict[str, str]:
    """Hash every declared output; write ``<hash_dir>/<name>.hash`` when a directory is given.

    Raises ``FileNotFoundError`` naming the first declared output that does not exist.
    """
    digests = {name: hash_path(path) for name, path in sorted(outputs.items())}
    if hash_dir:
        directory = Path(hash_dir)
        directory.mkdir(parents=True, exist_ok=True)
        for name, digest in digests.items():
            target = directory / f"{name}{contract.OUTPUT_HASH_SUFFIX}"
            temporary = target.with_suffix(".tmp")
            temporary.write_text(digest)
            os.replace(temporary, target)
    return digests


@dataclass
class AttemptResult:
    verdict: str
    exit_code: int
    reason: str
    returncode: int
    details: dict[str, Any] = field(default_factory=dict)
    output_hashes: dict[str, str] = field(default_factory=dict)
    stderr_tail: str = ""


class _StderrTee(threading.Thread):
    """Copies the child's stderr through to ours and keeps the last bytes for classification."""

    def __init__(self, source: IO[bytes], sink: IO[bytes] | None) -> None:
        super().__init__(name="durapipe-stderr", daemon=True)
        self._source = source
        self._sink = sink
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_size = 0
        #: Whether what went to the sink so far ends a line (a verdict must start one).
        self.at_line_start = True

    def run(self) -> None:
        fd = self._source.fileno()
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            if self._sink is not None:
                try:
                    self._sink.write(chunk)
                    self._sink.flush()
                    self.at_line_start = chunk.endswith(b"\n")
                except (OSError, ValueError):
                    self._sink = None
            self._tail.append(chunk)
            self._tail_size += len(chunk)
            while self._tail_size - len(self._tail[0]) >= STDERR_TAIL_BYTES:
                self._tail_size -= len(self._tail.popleft())

    def tail(self) -> str:
        data = b"".join(self._tail)[-STDERR_TAIL_BYTES:]
        return data.decode("utf-8", errors="replace")


class Supervisor:
    """One run of a command under the wrapper's supervision.

    Use :meth:`start`, optionally :meth:`request_stop` (from a signal handler or another
    thread), then :meth:`wait`; or :func:`run_attempt` for all three.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        grace_seconds: float | None = None,
        termination_log: str | os.PathLike[str] | None = None,
        outputs: Mapping[str, str] | None = None,
        output_hash_dir: str | os.PathLike[str] | None = None,
        control_dir: str | os.PathLike[str] | None = None,
        stderr_sink: IO[bytes] | None = None,
        memory_cgroup: MemoryCgroup | None | bool = True,
        memory_poll_seconds: float = 1.0,
    ) -> None:
        if not command:
            raise ValueError("no command to run")
        self.command = list(command)
        base_env = dict(os.environ if env is None else env)
        self.env = base_env
        self.cwd = cwd
        # Refused, not defaulted: a grace of 0 or less would SIGKILL the stage on SIGTERM.
        self.grace_seconds = (
            contract.grace_seconds_from_env(base_env)
            if grace_seconds is None
            else contract.parse_grace_seconds(grace_seconds)
        )
        self.termination_log = (
            os.fspath(termination_log)
            if termination_log is not None
            else base_env.get(contract.ENV_TERMINATION_LOG) or contract.DEFAULT_TERMINATION_LOG
        )
        self.outputs = (
            dict(outputs)
            if outputs is not None
            else parse_outputs(base_env.get(contract.ENV_OUTPUTS))
        )
        self.output_hash_dir = (
            os.fspath(output_hash_dir)
            if output_hash_dir is not None
            else base_env.get(contract.ENV_OUTPUT_HASH_DIR)
        )
        self._own_control_dir = control_dir is None and not base_env.get(contract.ENV_CONTROL_DIR)
        self.control_dir = Path(
            control_dir
            or base_env.get(contract.ENV_CONTROL_DIR)
            or tempfile.mkdtemp(prefix="durapipe-control-")
        )
        self.stderr_sink = stderr_sink if stderr_sink is not None else _default_stderr()
        self.memory_cgroup = (
            find_memory_cgroup()
            if memory_cgroup is True
            else None
            if memory_cgroup is False
            else memory_cgroup
        )
        self.memory_poll_seconds = memory_poll_seconds
        self.memory_limit = memory_limit_from_env(base_env.get(contract.ENV_MEMORY_LIMIT, ""))
        if self.memory_limit is None and self.memory_cgroup is not None:
            self.memory_limit = self.memory_cgroup.limit_bytes()
        self._process: subprocess.Popen[bytes] | None = None
        self._tee: _StderrTee | None = None
        #: Set from the SIGTERM handler: a flag that takes no lock (``signalflag``).
        self._stop_requested = SignalFlag()
        self._killed_after_grace = False
        self._exited = threading.Event()
        self._oom_before: int | None = None
        self._peak_usage = 0
        self._memory_warnings = 0
        self._started_at = 0.0

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self.control_dir.mkdir(parents=True, exist_ok=True)
        for name in (
            contract.CONTROL_STOP_FILE,
            contract.CONTROL_MEMORY_PRESSURE_FILE,
            contract.CONTROL_FAILURE_FILE,
        ):
            (self.control_dir / name).unlink(missing_ok=True)
        child_env = with_runtime_importable(dict(self.env))
        child_env[contract.ENV_CONTROL_DIR] = str(self.control_dir)
        # The SDK bounds its waits by the grace this wrapper kills by, never by another one.
        child_env[contract.ENV_GRACE_SECONDS] = str(self.grace_seconds)
        self._oom_before = self.memory_cgroup.oom_kills() if self.memory_cgroup else None
        self._started_at = time.monotonic()
        # A new session lets a stop reach the whole tree (data-loader workers included).
        self._process = subprocess.Popen(
            self.command,
            env=child_env,
            cwd=self.cwd,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert self._process.stderr is not None
        self._tee = _StderrTee(self._process.stderr, self.stderr_sink)
        self._tee.start()
        if self.stop_requested:
            # The stop arrived while the command was being started.
            self._signal_group(signal.SIGTERM)
        if self.memory_cgroup is not None and self.memory_limit:
            threading.Thread(target=self._watch_memory, name="durapipe-memory", daemon=True).start()

    def request_stop(self) -> None:
        """Forward SIGTERM to the command and SIGKILL it if it outlives the grace period.

        A stop that comes after the command has exited changes nothing: what it did is done
        (a success stays a success rather than a preemption that would run it again)."""
        if self._stop_requested.is_set() or self._command_has_exited():
            return
        self._stop_requested.set()
        try:
            (self.control_dir / contract.CONTROL_STOP_FILE).touch()
        except OSError:
            pass
        self._signal_group(signal.SIGTERM)
        timer = threading.Timer(self.grace_seconds, self._kill_after_grace)
        timer.daemon = True
        timer.start()

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested.is_set()

    def wait(self) -> AttemptResult:
        assert self._process is not None and self._tee is not None, "start() first"
        returncode = self._process.wait()
        self._exited.set()
        # The group may outlive its leader (orphaned workers); they die with the attempt.
        self._signal_group(signal.SIGKILL)
        self._tee.join(timeout=5)
        oom_after = self.memory_cgroup.oom_kills() if self.memory_cgroup else None
        delta = (
            oom_after - self._oom_before
            if oom_after is not None and self._oom_before is not None
            else None
        )
        tail = self._tee.tail()
        reported = self._read_failure_record()
        decision = classify(
            returncode,
            stop_requested=self.stop_requested,
            oom_kills_delta=delta,
            stderr_tail=tail,
            memory_limited=self.memory_limit is not None,
            reported_verdict=reported.get("verdict") if reported else None,
        )
        details: dict[str, Any] = {
            "returncode": returncode,
            "reason": decision.reason,
            "duration_s": round(time.monotonic() - self._started_at, 3),
            "oom_kills_delta": delta,
            "memory_limit": self.memory_limit,
            "peak_usage": self._peak_usage or None,
            "memory_warnings": self._memory_warnings,
            "killed_after_grace": self._killed_after_grace,
        }
        for name, env_name in (
            ("stage", contract.ENV_STAGE),
            ("attempt", contract.ENV_ATTEMPT),
            ("rung", contract.ENV_RUNG),
        ):
            if self.env.get(env_name):
                details[name] = self.env[env_name]
        if decision.verdict == contract.VERDICT_GPU_OOM:
            details["gpu_oom_policy"] = (self.env.get(contract.ENV_GPU_OOM_POLICY)
                                          or contract.DEFAULT_GPU_OOM_POLICY)
        if reported:
            details["reported"] = {k: reported[k] for k in sorted(reported)[:8]}
        output_hashes: dict[str, str] = {}
        if decision.verdict == contract.VERDICT_SUCCESS and self.outputs:
            try:
                output_hashes = write_output_hashes(self.outputs, self.output_hash_dir)
            except (OSError, ValueError) as error:
                decision = Classification(
                    contract.VERDICT_APP_FAILURE,
                    contract.EXIT_APP_FAILURE,
                    f"declared output could not be hashed: {error}",
                )
                details["reason"] = decision.reason
        if decision.verdict != contract.VERDICT_SUCCESS:
            details["stderr_tail"] = tail[-2048:]
        line = verdict_line(decision.verdict, details)
        self._write_termination_log(line)
        if self._own_control_dir:
            _remove_tree(self.control_dir)
        return AttemptResult(
            verdict=decision.verdict,
            exit_code=decision.exit_code,
            reason=decision.reason,
            returncode=returncode,
            details=details,
            output_hashes=output_hashes,
            stderr_tail=tail,
        )

    def fail_to_start(self, error: OSError) -> AttemptResult:
        """Report a command that could not be started (shell conventions: 127 missing, 126
        not executable) with a verdict like any other ending."""
        returncode = 127 if isinstance(error, FileNotFoundError) else 126
        reason = f"cannot start {self.command[0]!r}: {error.strerror or error}"
        details: dict[str, Any] = {"returncode": returncode, "reason": reason}
        self._write_termination_log(verdict_line(contract.VERDICT_APP_FAILURE, details))
        if self._own_control_dir:
            _remove_tree(self.control_dir)
        return AttemptResult(contract.VERDICT_APP_FAILURE, returncode, reason, returncode, details)

    @property
    def pid(self) -> int | None:
        """The command's process id once started."""
        return self._process.pid if self._process is not None else None

    # -- internals -----------------------------------------------------------------------------
    def _command_has_exited(self) -> bool:
        """Whether the command has ended, asked of the kernel without reaping it (so that
        :meth:`wait` still gets its status; a stop may arrive in any thread at any time)."""
        if self._process is None:
            return False
        if self._process.returncode is not None:
            return True
        try:
            ended = os.waitid(os.P_PID, self._process.pid,
                              os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True  # already reaped by wait()
        return ended is not None

    def _signal_group(self, signum: int) -> None:
        if self._process is None:
            return
        try:
            os.killpg(self._process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def _kill_after_grace(self) -> None:
        if not self._exited.is_set() and self._process is not None and self._process.poll() is None:
            self._killed_after_grace = True
            self._signal_group(signal.SIGKILL)

    def _watch_memory(self) -> None:
        assert self.memory_cgroup is not None and self.memory_limit
        warned = False
        pressure_file = self.control_dir / contract.CONTROL_MEMORY_PRESSURE_FILE
        while not self._exited.wait(self.memory_poll_seconds):
            usage = self.memory_cgroup.usage_bytes()
            if usage is None:
                return
            self._peak_usage = max(self._peak_usage, usage)
            fraction = usage / self.memory_limit
            if not warned and fraction >= MEMORY_WARN_FRACTION:
                warned = True
                self._memory_warnings += 1
                message = (
                    f"durapipe: memory working set {usage} bytes is {fraction:.0%} of the "
                    f"{self.memory_limit}-byte limit; checkpoint now\n"
                )
                if self.stderr_sink is not None:
                    try:
                        self.stderr_sink.write(message.encode())
                        self.stderr_sink.flush()
                    except (OSError, ValueError):
                        pass
                try:
                    pressure_file.write_text(
                        json.dumps({"usage": usage, "limit": self.memory_limit})
                    )
                except OSError:
                    pass
            elif warned and fraction < MEMORY_CLEAR_FRACTION:
                warned = False
                pressure_file.unlink(missing_ok=True)

    def _read_failure_record(self) -> dict[str, Any] | None:
        try:
            value = json.loads((self.control_dir / contract.CONTROL_FAILURE_FILE).read_text())
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def _write_termination_log(self, line: str) -> None:
        # The child's stderr went to ours: a last line without its newline must not swallow
        # the verdict's start.
        after_partial_line = (
            self._tee is not None
            and not self._tee.at_line_start
            and self.stderr_sink is _default_stderr()
        )
        write_verdict(line, self.termination_log, new_line_first=after_partial_line)


def runtime_archive() -> str | None:
    """The zipapp this runtime runs from, or None when it is an ordinary installation."""
    # This module is durapipe/runtime/wrapper.py, wherever durapipe was loaded from.
    archive = Path(__file__).parents[2]
    # Inside a zipapp the package's "directory" is a path into the archive, a regular file.
    return str(archive) if archive.is_file() and zipfile.is_zipfile(archive) else None


def with_runtime_importable(env: dict[str, str]) -> dict[str, str]:
    """The child's environment, with the zipapp on its PYTHONPATH when the runtime runs from
    one, so that user code can ``from durapipe.runtime import ...`` in a pod whose image has
    nothing of durapipe installed. The user's own PYTHONPATH entries come first."""
    archive = runtime_archive()
    if archive is None:
        return env
    entries = [e for e in env.get("PYTHONPATH", "").split(os.pathsep) if e]
    if archive not in entries:
        env["PYTHONPATH"] = os.pathsep.join([*entries, archive])
    return env


def report_without_attempt(
    reason: str,
    *,
    termination_log: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> AttemptResult:
    """The verdict of a wrapper that could not even run the attempt (bad arguments or
    environment): an ``app_failure`` exiting 64, so the ending is never silent."""
    env = os.environ if env is None else env
    path = (
        os.fspath(termination_log)
        if termination_log is not None
        else env.get(contract.ENV_TERMINATION_LOG) or contract.DEFAULT_TERMINATION_LOG
    )
    details: dict[str, Any] = {"returncode": None, "reason": reason}
    write_verdict(verdict_line(contract.VERDICT_APP_FAILURE, details), path)
    return AttemptResult(
        contract.VERDICT_APP_FAILURE, contract.EXIT_USAGE, reason, contract.EXIT_USAGE, details
    )


def _default_stderr() -> IO[bytes] | None:
    try:
        return sys.stderr.buffer
    except AttributeError:
        return None


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def run_attempt(
    command: Sequence[str],
    *,
    handle_signals: bool = False,
    **options: Any,
) -> AttemptResult:
    """Run ``command`` to completion and return its classified result.

    ``options`` are :class:`Supervisor`'s keyword arguments.  With ``handle_signals`` (main thread
    only) SIGTERM and SIGINT received by this process become a stop request for the command;
    the previous handlers are restored afterwards.
    """
    try:
        attempt = Supervisor(command, **options)
    except (OSError, ValueError) as error:
        # Bad DURAPIPE_OUTPUTS, grace period, ...: reported like any other ending.
        return report_without_attempt(
            f"wrapper cannot run the attempt: {error}",
            termination_log=options.get("termination_log"),
            env=options.get("env"),
        )
    previous: dict[signal.Signals, Any] = {}
    if handle_signals:
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, lambda _s, _f: attempt.request_stop())
    try:
        try:
            attempt.start()
        except OSError as error:
            return attempt.fail_to_start(error)
        return attempt.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


__all__ = [
    "AttemptResult",
    "Classification",
    "Supervisor",
    "classify",
    "parse_verdict_line",
    "report_without_attempt",
    "run_attempt",
    "verdict_line",
]
