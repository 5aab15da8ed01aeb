"""How an attempt's ending is decided and said: the verdict, and what feeds it.

:func:`classify` is a pure function of the facts observed about an ending; :func:`verdict_line`
is the one line the wrapper writes to the termination log (:func:`parse_verdict_line` reads
it back); :func:`record_failure` is the record the SDK leaves for the wrapper when the
stage's own code fails.  The supervision that gathers the facts is :mod:`wrapper`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durapipe.runtime import contract

# Lines that identify accelerator out-of-memory errors (PyTorch, cuBLAS, JAX/XLA, ROCm).
GPU_OOM_PATTERNS = (
    re.compile(r"CUDA out of memory", re.IGNORECASE),
    re.compile(r"\b(torch\.)?(cuda\.)?OutOfMemoryError\b"),
    re.compile(r"CUBLAS_STATUS_ALLOC_FAILED"),
    re.compile(r"CUDA error: out of memory"),
    re.compile(r"HIP out of memory"),
    re.compile(r"RESOURCE_EXHAUSTED: Out of memory"),
)
# Host allocation failures that surface as exceptions rather than kernel kills.
HOST_OOM_PATTERNS = (
    re.compile(r"DefaultCPUAllocator: can't allocate memory"),
    re.compile(r"^MemoryError\b", re.MULTILINE),
)


@dataclass(frozen=True)
class Classification:
    verdict: str
    exit_code: int
    reason: str


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def app_failure_exit_code(returncode: int) -> int:
    """The user's own exit code where it does not collide with a reserved one."""
    code = returncode if returncode > 0 else 128 - returncode if returncode < 0 else 0
    if code == 0 or code > 255 or code in contract.RESERVED_EXIT_CODES:
        return contract.EXIT_APP_FAILURE
    return code


def classify(
    returncode: int,
    *,
    stop_requested: bool = False,
    oom_kills_delta: int | None = None,
    stderr_tail: str = "",
    memory_limited: bool = False,
    reported_verdict: str | None = None,
) -> Classification:
    """Decide the verdict of an attempt from what was observed.

    ``returncode`` follows :mod:`subprocess`: negative means killed by that signal.
    ``oom_kills_delta`` is the growth of the cgroup's ``oom_kill`` counter over the attempt
    (``None`` when the counter could not be read).  ``memory_limited`` says a memory limit was
    in force, which makes an unexplained SIGKILL an OOM kill.  ``reported_verdict`` comes from
    the SDK's failure record, written by the process itself.

    Precedence: a kernel OOM kill explains everything after it (a trainer whose data-loader
    worker was OOM-killed exits 1, but more memory is what it needs); then a requested stop; then
    success; then what the process reported or printed; then an unexplained SIGKILL under a limit.
    """
    if oom_kills_delta:
        return Classification(
            contract.VERDICT_HOST_OOM,
            contract.EXIT_HOST_OOM,
            f"oom_kill counter of the memory cgroup grew by {oom_kills_delta}",
        )
    if stop_requested:
        return Classification(
            contract.VERDICT_PREEMPTED, contract.EXIT_PREEMPTED, "stop requested (SIGTERM)"
        )
    if returncode == 0:
        return Classification(contract.VERDICT_SUCCESS, contract.EXIT_SUCCESS, "exit code 0")
    if reported_verdict == contract.VERDICT_GPU_OOM or any(
        pattern.search(stderr_tail) for pattern in GPU_OOM_PATTERNS
    ):
        return Classification(
            contract.VERDICT_GPU_OOM, contract.EXIT_GPU_OOM, "accelerator out of memory"
        )
    if reported_verdict == contract.VERDICT_HOST_OOM or any(
        pattern.search(stderr_tail) for pattern in HOST_OOM_PATTERNS
    ):
        return Classification(
            contract.VERDICT_HOST_OOM, contract.EXIT_HOST_OOM, "host memory allocation failed"
        )
    if returncode == -signal.SIGKILL and memory_limited and oom_kills_delta is None:
        return Classification(
            contract.VERDICT_HOST_OOM,
            contract.EXIT_HOST_OOM,
            "SIGKILL under a memory limit (OOM counters unreadable)",
        )
    if returncode < 0:
        reason = f"killed by {_signal_name(-returncode)}"
    else:
        reason = f"exit code {returncode}"
    return Classification(contract.VERDICT_APP_FAILURE, app_failure_exit_code(returncode), reason)


def verdict_line(verdict: str, details: Mapping[str, Any]) -> str:
    """``durapipe-verdict:<verdict> {json}``: one line, under Kubernetes' termination-message
    limit in bytes, for any details.

    The JSON is ASCII (``\\uXXXX`` escapes), so characters and bytes agree and no newline or
    other line break survives.  The stderr tail keeps the longest end that fits; should the
    other details still be too long, their longest strings are shortened.
    """
    payload: dict[str, Any] = dict(details)
    head = f"{contract.verdict_marker(verdict)} "

    def render() -> str:
        return head + json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)

    def fits() -> bool:
        return len(render()) < contract.TERMINATION_MESSAGE_LIMIT

    if fits():
        return render()
    if "stderr_tail" in payload:
        tail = str(payload["stderr_tail"])
        low, high = 0, len(tail)  # the longest suffix that fits, by bisection
        while low < high:
            middle = (low + high + 1) // 2
            payload["stderr_tail"] = tail[len(tail) - middle :]
            if fits():
                low = middle
            else:
                high = middle - 1
        payload["stderr_tail"] = tail[len(tail) - low :]
        if fits():
            return render()
    for key in sorted(payload, key=lambda k: -len(json.dumps(payload[k], default=str))):
        if key == "stderr_tail":
            continue
        payload[key] = _shortened(payload[key])
        if fits():
            return render()
    return head + json.dumps({"reason": "details too long for the termination message"})


def _shortened(value: Any, limit: int = 256) -> Any:
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit] + "..."
    if isinstance(value, Mapping):
        return {str(k): _shortened(v, limit // 2) for k, v in value.items()}
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return _shortened(str(value), limit)


def parse_verdict_line(line: str) -> tuple[str, dict[str, Any]]:
    """Inverse of :func:`verdict_line` (used by the local runner and by tests)."""
    if not line.startswith(contract.VERDICT_TAG):
        raise ValueError(f"not a verdict line: {line[:80]!r}")
    head, _, body = line[len(contract.VERDICT_TAG) :].partition(" ")
    return head, json.loads(body) if body else {}



def write_verdict(line: str, termination_log: str, *, new_line_first: bool = False) -> None:
    """Write the verdict line to the termination log and echo it to stderr."""
    try:
        with open(termination_log, "w", encoding="utf-8") as handle:
            handle.write(line + "\n")
    except OSError as error:
        # The verdict must not be lost: stderr is Kubernetes' fallback for the message.
        sys.stderr.write(f"\ndurapipe: cannot write {termination_log}: {error}\n")
        new_line_first = False
    sys.stderr.write(("\n" if new_line_first else "") + line + "\n")
    sys.stderr.flush()



def is_gpu_oom(error: BaseException) -> bool:
    """Whether ``error`` (or an exception in its chain) is an accelerator out-of-memory error."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = type(current).__name__
        text = str(current)
        if name == "OutOfMemoryError" and "torch" in type(current).__module__:
            return True
        if "CUDA out of memory" in text or "CUBLAS_STATUS_ALLOC_FAILED" in text:
            return True
        if name in ("XlaRuntimeError", "JaxRuntimeError") and "RESOURCE_EXHAUSTED" in text:
            return True
        current = current.__cause__ or current.__context__
    return False


def record_failure(error: BaseException) -> None:
    """Write the failure record the wrapper reads to classify this attempt."""
    directory = os.environ.get(contract.ENV_CONTROL_DIR)
    if not directory:
        return
    target = Path(directory) / contract.CONTROL_FAILURE_FILE
    if is_gpu_oom(error):
        verdict = contract.VERDICT_GPU_OOM
    elif isinstance(error, MemoryError):
        verdict = contract.VERDICT_HOST_OOM
    else:
        verdict = contract.VERDICT_APP_FAILURE
    record = {
        "verdict": verdict,
        "exception": f"{type(error).__module__}.{type(error).__qualname__}",
        "message": str(error)[:500],
    }
    try:
        target.write_text(json.dumps(record))
    except OSError:
        pass
