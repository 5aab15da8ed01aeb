"""What a stage's retry rules are made of, read once from the model.

Both executors and the editor read these values: the budgets (``retry``), the OOM ladder's
rungs, the GPU types the stage falls back through, the per-attempt timeout, the on-demand last
attempt and, for a multi-node stage, its restarts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from durapipe.dsl.model import GpuChoice, Retry, Stage

#: ``retry.backoff`` cap when ``max_backoff`` is not set (seconds).
DEFAULT_BACKOFF_CAP = 600


@dataclass(frozen=True)
class Backoff:
    """The wait before the n-th application retry: ``seconds * factor^(n-1)``, capped."""

    seconds: int
    factor: int
    cap: int

    def wait(self, retry: int) -> float:
        if retry <= 0:
            return 0.0
        return float(min(self.seconds * self.factor ** (retry - 1), self.cap))


def backoff_of(rule: Retry) -> Backoff | None:
    if rule.backoff is None:
        return None
    # An uncapped exponential would leave a stage waiting hours before its tenth retry: cap it.
    cap = rule.max_backoff if rule.max_backoff is not None else max(
        DEFAULT_BACKOFF_CAP, rule.backoff)
    return Backoff(rule.backoff, rule.backoff_factor, cap)


def memory_rungs(stage: Stage) -> tuple[int | None, ...]:
    """The memory of each rung: the OOM ladder, or the stage's one size."""
    ladder = stage.retry.on_oom
    if ladder is not None:
        return tuple(ladder.memory)
    return (stage.resources.memory,)


def gpu_types(stage: Stage) -> tuple[tuple[GpuChoice | None, ...], int | None]:
    """The GPU types that are variants of their own, and how long each waits for capacity
    before the next (``None``: no fallback)."""
    gpu = stage.resources.gpu
    if gpu is not None and gpu.fallback_after is not None and len(gpu.types) > 1:
        return gpu.types, gpu.fallback_after
    if gpu is not None and gpu.types and len({t.count for t in gpu.types}) > 1:
        return gpu.types, None  # diagnosed by the lowering (P0406); keeps the grid well-formed
    return (None,), None


@dataclass(frozen=True)
class Rules:
    """Everything the state machine (``machine.step``) reads about one stage."""

    attempts: int
    preemptions: int
    backoff: Backoff | None
    gpu_oom: Literal["fail", "retry"]
    #: Memory per rung of the OOM ladder (one entry without a ladder).
    rungs: tuple[int | None, ...]
    #: GPU type names in fallback order ("" where the stage names none).
    types: tuple[str, ...]
    #: Seconds a GPU type other than the last waits for capacity (``None``: no fallback).
    pending_timeout: int | None
    #: Seconds an attempt may run (``timeout``), ``None`` for ever.
    timeout: int | None
    #: The stage's last possible attempt runs on on-demand capacity.
    on_demand_last: bool
    #: Multi-node: restarts of the whole group (``distributed.max_restarts``); ``None`` for a
    #: single-pod stage.
    max_restarts: int | None = None
    #: Multi-node: preemption and host maintenance restart without spending ``max_restarts``.
    restart_on_maintenance: bool = False

    @property
    def has_ladder(self) -> bool:
        return len(self.rungs) > 1

    def waits(self, gpu_type: int) -> bool:
        """Whether an attempt on ``gpu_type`` may give way to the next type (a pending
        timeout)."""
        return self.pending_timeout is not None and gpu_type + 1 < len(self.types)

    @classmethod
    def of(cls, stage: Stage) -> Rules:
        rule, dist = stage.retry, stage.distributed
        types, wait = gpu_types(stage)
        rungs = memory_rungs(stage)
        if dist is not None:  # one variant: the first rung, the first GPU type
            rungs, types, wait = rungs[:1], types[:1], None
        return cls(
            attempts=rule.attempts, preemptions=rule.preemptions, backoff=backoff_of(rule),
            gpu_oom=rule.gpu_oom, rungs=rungs,
            types=tuple(t.type if t is not None else "" for t in types),
            pending_timeout=wait, timeout=stage.timeout,
            on_demand_last=stage.interruptible and stage.last_attempt_on_demand,
            max_restarts=dist.max_restarts if dist is not None else None,
            restart_on_maintenance=dist.restart_on_maintenance if dist is not None else False,
        )
