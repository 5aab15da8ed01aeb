"""What happens after an attempt ends: the retry policy of the language, as one pure function.

The budgets are the language's: application failures spend ``retry.attempts``; preemptions spend
``retry.preemptions`` and never the application budget; an out-of-memory kill climbs the OOM
ladder without spending either; a CUDA OOM fails or spends ``attempts`` per ``gpu_oom``.
``docs/lowering.md`` says how Argo approximates the same rules (it has one retry limit per task).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from durapipe.dsl import units
from durapipe.dsl.model import Retry
from durapipe.runtime import contract


@dataclass
class Budget:
    """What an attempt history has used up."""

    failures: int = 0
    preemptions: int = 0
    rung: int = 0
    attempts: int = 0
    history: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Decision:
    #: "done" (success), "retry" or "fail".
    action: str
    rung: int
    reason: str
    backoff_seconds: float = 0.0


def backoff(retry: Retry, failures: int) -> float:
    """Argo's backoff: ``duration * factor^(n-1)``, capped at ``max_backoff``."""
    if retry.backoff is None or failures <= 0:
        return 0.0
    wait = float(retry.backoff * retry.backoff_factor ** (failures - 1))
    if retry.max_backoff is not None:
        wait = min(wait, float(retry.max_backoff))
    return wait


def decide(retry: Retry, budget: Budget, verdict: str) -> Decision:
    """Record ``verdict`` in ``budget`` and say what to do next."""
    budget.attempts += 1
    budget.history.append(verdict)
    ladder = retry.on_oom.memory if retry.on_oom else ()
    if verdict == contract.VERDICT_SUCCESS:
        return Decision("done", budget.rung, "succeeded")
    if verdict == contract.VERDICT_PREEMPTED:
        if budget.preemptions < retry.preemptions:
            budget.preemptions += 1
            return Decision("retry", budget.rung,
                            f"preempted; retry {budget.preemptions}/{retry.preemptions} of the "
                            "preemption budget")
        return Decision("fail", budget.rung,
                        f"preempted {budget.preemptions + 1} times; the preemption budget "
                        f"({retry.preemptions}) is spent")
    if verdict == contract.VERDICT_HOST_OOM and ladder:
        if budget.rung + 1 < len(ladder):
            budget.rung += 1
            return Decision("retry", budget.rung,
                            f"out of memory at {units.format_bytes(ladder[budget.rung - 1])}; "
                            f"next rung {units.format_bytes(ladder[budget.rung])}")
        sizes = ", ".join(units.format_bytes(m) for m in ladder)
        return Decision("fail", budget.rung,
                        f"out of memory at every size of the OOM ladder ({sizes})")
    if verdict == contract.VERDICT_GPU_OOM and retry.gpu_oom == "fail":
        return Decision("fail", budget.rung, "CUDA out of memory (gpu_oom = \"fail\")")
    what = {contract.VERDICT_HOST_OOM: "out of memory (no OOM ladder)",
            contract.VERDICT_GPU_OOM: "CUDA out of memory"}.get(verdict, "failed")
    if budget.failures < retry.attempts:
        budget.failures += 1
        return Decision("retry", budget.rung,
                        f"{what}; retry {budget.failures}/{retry.attempts}",
                        backoff(retry, budget.failures))
    return Decision("fail", budget.rung,
                    f"{what}; the failure budget ({retry.attempts}) is spent"
                    if retry.attempts else what)
