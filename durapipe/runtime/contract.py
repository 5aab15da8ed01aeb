"""The contract between the compiler and the in-pod runtime.

This module is the single source of truth for every name both sides must agree on: environment
variables the compiled pod sets, exit codes and verdicts the wrapper reports, and the paths of
the files it writes.  The compiler reads this module and nothing else of ``durapipe.runtime``;
it must therefore stay standard-library only and free of side effects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

# -- environment set on every stage container --------------------------------------------------
ENV_PIPELINE: Final = "DURAPIPE_PIPELINE"
ENV_STAGE: Final = "DURAPIPE_STAGE"
ENV_RUN_ID: Final = "DURAPIPE_RUN_ID"
#: 0-based attempt index, unique and increasing across all attempts of this stage (rungs and
#: GPU types included); not always contiguous (docs/lowering.md, "Retries").
ENV_ATTEMPT: Final = "DURAPIPE_ATTEMPT"
#: 0-based index into the OOM memory ladder that this attempt runs on.
ENV_RUNG: Final = "DURAPIPE_RUNG"
#: The GPU type this attempt was scheduled for ("" when the stage has no GPU).
ENV_GPU_TYPE: Final = "DURAPIPE_GPU_TYPE"
#: The memory limit of this attempt in bytes ("" when unlimited).
ENV_MEMORY_LIMIT: Final = "DURAPIPE_MEMORY_LIMIT_BYTES"
#: Root URI of the store (``file:///...`` or ``s3://bucket/prefix``).
ENV_STORE_URI: Final = "DURAPIPE_STORE_URI"
#: URI of this stage's checkpoint line. Keyed by the stage's inputs (or run, or pipeline) and
#: stage, never by attempt.
ENV_CHECKPOINT_URI: Final = "DURAPIPE_CHECKPOINT_URI"
#: Set by Kubernetes in every container of an Indexed Job's pod (a JobSet's nodes): the node's
#: index.  Only node 0 holds global rank 0 (the compiled torchrun gives node k the ranks from
#: ``k * procs_per_node``), so only its upload agent claims the line.
ENV_JOB_COMPLETION_INDEX: Final = "JOB_COMPLETION_INDEX"
#: JSON object ``{stage: checkpoint line URI}``: lines of an earlier run to restore from where
#: the stage's own line has no commit yet (``durapipe submit --resume-from RUN``, ``durapipe
#: run --resume RUN``); commits still go to the stage's own line.  Empty: none.
ENV_CHECKPOINT_RESUME_FROM: Final = "DURAPIPE_CHECKPOINT_RESUME_FROM"
#: The workflow parameter that carries it to the pods (``durapipe submit --resume-from`` sets
#: it; the checkpoint collector reads it to keep the lines a run still to finish resumes from).
RESUME_FROM_PARAM: Final = "durapipe-resume-from"
#: The label Argo's controller sets to "true" on a Workflow once it has finished.
WORKFLOW_COMPLETED_LABEL: Final = "workflows.argoproj.io/completed"
#: Where the runtime writes what the attempt's first restore found (``RESUME_REPORT_KEYS``, a
#: JSON object): the cluster reads it as the ``resumed-from`` output parameter for `status`.
ENV_RESUME_REPORT: Final = "DURAPIPE_RESUME_REPORT"
#: Its keys: the line's URI, and the restored commit's sequence number and its ``step`` and
#: ``epoch`` metadata, the progress a training loop records (``null`` when the line had no
#: commit, or the commit no such metadata).
RESUME_REPORT_KEYS: Final = ("line", "seq", "step", "epoch")
#: Local directory where user code writes checkpoints before they are committed.
ENV_CHECKPOINT_PATH: Final = "DURAPIPE_CHECKPOINT_PATH"
#: How many committed checkpoints to keep.
ENV_CHECKPOINT_KEEP: Final = "DURAPIPE_CHECKPOINT_KEEP"
#: Directory shared with the upload sidecar (an emptyDir in the pod).
ENV_SPOOL_DIR: Final = "DURAPIPE_SPOOL_DIR"
#: Seconds the user process gets between SIGTERM and SIGKILL (see parse_grace_seconds).
ENV_GRACE_SECONDS: Final = "DURAPIPE_GRACE_SECONDS"
#: The grace period when ``DURAPIPE_GRACE_SECONDS`` is unset or empty (Kubernetes' default).
DEFAULT_GRACE_SECONDS: Final = 30.0
#: The longest grace period accepted: beyond any pod's, and far inside what timers accept
#: (the runtime bounds a wait before a stop request by 60 grace periods).
MAX_GRACE_SECONDS: Final = 1_000_000.0
#: JSON object ``{output name: local path}`` of the stage's declared outputs.
ENV_OUTPUTS: Final = "DURAPIPE_OUTPUTS"
#: Directory where the wrapper writes one file per output holding its content hash;
#: Argo reads them as output parameters (``<dir>/<name>.hash``).
ENV_OUTPUT_HASH_DIR: Final = "DURAPIPE_OUTPUT_HASH_DIR"
#: What to do on a CUDA out-of-memory error: "retry" (same size), "fail".
ENV_GPU_OOM_POLICY: Final = "DURAPIPE_GPU_OOM_POLICY"
#: The language's default (``retry.gpu_oom``, docs/language.md), when the variable is unset.
DEFAULT_GPU_OOM_POLICY: Final = "fail"
#: Where the one-line JSON verdict is written (Kubernetes reads it as the termination message).
ENV_TERMINATION_LOG: Final = "DURAPIPE_TERMINATION_LOG"

DEFAULT_TERMINATION_LOG: Final = "/dev/termination-log"
DEFAULT_SPOOL_DIR: Final = "/var/run/durapipe/spool"
#: Where the init container installs the runtime zipapp inside the pod.
RUNTIME_INSTALL_DIR: Final = "/var/run/durapipe/bin"
RUNTIME_ZIPAPP_NAME: Final = "durapipe-runtime.pyz"
OUTPUT_HASH_SUFFIX: Final = ".hash"

# -- verdicts: how an attempt ended -----------------------------------------------------------
VERDICT_SUCCESS: Final = "success"
VERDICT_APP_FAILURE: Final = "app_failure"
VERDICT_HOST_OOM: Final = "host_oom"
VERDICT_GPU_OOM: Final = "gpu_oom"
VERDICT_PREEMPTED: Final = "preempted"
VERDICTS: Final = (
    VERDICT_SUCCESS,
    VERDICT_APP_FAILURE,
    VERDICT_HOST_OOM,
    VERDICT_GPU_OOM,
    VERDICT_PREEMPTED,
)

#: Every verdict line starts with this tag so a retry expression can match it in
#: ``lastRetry.message`` without confusing it with user text.
VERDICT_TAG: Final = "durapipe-verdict:"


def verdict_marker(verdict: str) -> str:
    """The exact substring a retry expression searches for to recognise ``verdict``."""
    return f"{VERDICT_TAG}{verdict}"


# -- exit codes of ``durapipe.runtime exec`` --------------------------------------------------
EXIT_SUCCESS: Final = 0
#: Application failures keep the user's own exit code unless it collides with a reserved one,
#: in which case the wrapper exits with this code.
EXIT_APP_FAILURE: Final = 1
#: The kernel's convention for SIGKILL; Kubernetes reports a real OOM kill the same way.
EXIT_HOST_OOM: Final = 137
EXIT_PREEMPTED: Final = 143
EXIT_GPU_OOM: Final = 86
#: The wrapper itself was misused (bad arguments, missing command).
EXIT_USAGE: Final = 64
RESERVED_EXIT_CODES: Final = frozenset({EXIT_HOST_OOM, EXIT_PREEMPTED, EXIT_GPU_OOM, EXIT_USAGE})

# -- distributed training (torchrun's environment) ---------------------------------------------
#: The process's global rank under torchrun: only rank 0 writes the stage's checkpoint line.
ENV_RANK: Final = "RANK"
#: The process's rank on its node under torchrun: each restores into a directory of its own.
ENV_LOCAL_RANK: Final = "LOCAL_RANK"


def distributed_rank(env: Mapping[str, str], name: str) -> int:
    """``RANK`` or ``LOCAL_RANK`` as torchrun sets it; 0 where unset (one process)."""
    text = env.get(name, "").strip()
    if not text:
        return 0
    try:
        rank = int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a process rank (a whole number)") from None
    if rank < 0:
        raise ValueError(f"{name}={text!r} is not a process rank (a whole number >= 0)")
    return rank


# -- files the wrapper and the in-process SDK exchange -----------------------------------------
#: Directory the wrapper creates for the user process (exported to it under this name).
ENV_CONTROL_DIR: Final = "DURAPIPE_CONTROL_DIR"
#: Created by the wrapper when a stop (SIGTERM) was requested; the SDK's stop flag checks it.
CONTROL_STOP_FILE: Final = "stop-requested"
#: Created by the wrapper while memory usage is near the limit (JSON: usage, limit bytes).
CONTROL_MEMORY_PRESSURE_FILE: Final = "memory-pressure"
#: Written by the SDK's exception hook: JSON ``{"verdict": ..., "exception": ...}``.
CONTROL_FAILURE_FILE: Final = "failure.json"
#: Termination messages longer than this are truncated by Kubernetes.
TERMINATION_MESSAGE_LIMIT: Final = 4096
#: "thread" (upload from a thread of the training process) or "sidecar" (hand over to the
#: upload agent through the spool directory).
ENV_UPLOADER: Final = "DURAPIPE_UPLOADER"
#: Which client opens a remote store: "obstore", "stdlib" (the runtime's own S3 client) or
#: unset (obstore when the image has it, else the stdlib client; docs/runtime.md).
ENV_STORE_CLIENT: Final = "DURAPIPE_STORE_CLIENT"
#: The pod's own name and namespace (downward API), for the agent's pod-status fallback.
ENV_POD_NAME: Final = "POD_NAME"
ENV_POD_NAMESPACE: Final = "POD_NAMESPACE"
#: Exit status of the agent and of the preflight check when no client can open the store.
EXIT_NO_STORE_CLIENT: Final = 65
#: The tag of the agent's and the preflight check's one-line verdicts.
AGENT_VERDICT_TAG: Final = "durapipe-agent:"
#: Forces the content-hash algorithm ("sha256" or "blake3"); trainer and agent must agree.
ENV_CONTENT_HASH: Final = "DURAPIPE_CONTENT_HASH"
#: How long a writer's lease on its checkpoint line lasts without a heartbeat, in seconds
#: (docs/runtime.md, "One writer per line"); the writer renews it every quarter of that.
ENV_LINE_LEASE: Final = "DURAPIPE_LINE_LEASE_SECONDS"
DEFAULT_LINE_LEASE_SECONDS: Final = 60.0
#: A day: a lease is how long another run waits for a killed writer, never an hour-long hold.
MAX_LINE_LEASE_SECONDS: Final = 86_400.0
#: What the upload agent reads: passed to the sidecar by these exact names, never by prefix,
#: so a user variable that happens to start with ``DURAPIPE_`` stays in the main container.
AGENT_ENV: Final = (
    ENV_PIPELINE, ENV_STAGE, ENV_RUN_ID, ENV_ATTEMPT, ENV_STORE_URI, ENV_CHECKPOINT_URI,
    ENV_CHECKPOINT_KEEP, ENV_SPOOL_DIR, ENV_GRACE_SECONDS, ENV_STORE_CLIENT, ENV_CONTENT_HASH,
    ENV_LINE_LEASE,
)


# -- the grace period ---------------------------------------------------------------------------
def parse_grace_seconds(value: str | float | None) -> float:
    """A grace period in seconds, as the wrapper, the SDK and the agent all read it.

    ``None`` or ``""`` means :data:`DEFAULT_GRACE_SECONDS`; anything but a finite number in
    (0, :data:`MAX_GRACE_SECONDS`] raises ``ValueError`` (a usage error, never replaced by the
    default): with 0 or less the wrapper would SIGKILL the stage at once on SIGTERM, before
    its handler runs, and NaN or infinity would break every deadline derived from it.
    """
    if value is None or value == "":
        return DEFAULT_GRACE_SECONDS
    return _seconds_within(value, MAX_GRACE_SECONDS, "a grace period")


def _seconds_within(value: str | float, maximum: float, what: str) -> float:
    """``value`` as seconds in (0, ``maximum``]; ``ValueError`` saying it is not ``what``."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not 0 < seconds <= maximum:  # NaN fails every comparison
        raise ValueError(
            f"{value!r} is not {what}: give a number of seconds greater than 0 "
            f"and at most {maximum:.0f}"
        )
    return seconds


def grace_seconds_from_env(env: Mapping[str, str]) -> float:
    """``DURAPIPE_GRACE_SECONDS`` of ``env`` (:func:`parse_grace_seconds`); the error names it."""
    try:
        return parse_grace_seconds(env.get(ENV_GRACE_SECONDS))
    except ValueError as error:
        raise ValueError(f"{ENV_GRACE_SECONDS}: {error}") from None


# -- the lease on a checkpoint line -------------------------------------------------------------
def line_lease_from_env(env: Mapping[str, str]) -> float:
    """``DURAPIPE_LINE_LEASE_SECONDS`` of ``env``; :data:`DEFAULT_LINE_LEASE_SECONDS` when unset
    or empty.  Anything but a number in (0, :data:`MAX_LINE_LEASE_SECONDS`] raises
    ``ValueError`` naming the variable: a zero lease would let any run take a live writer's
    line, and an infinite one would make a killed writer hold it for ever."""
    value = env.get(ENV_LINE_LEASE, "").strip()
    if not value:
        return DEFAULT_LINE_LEASE_SECONDS
    try:
        return _seconds_within(value, MAX_LINE_LEASE_SECONDS, "a lease")
    except ValueError as error:
        raise ValueError(f"{ENV_LINE_LEASE}: {error}") from None
