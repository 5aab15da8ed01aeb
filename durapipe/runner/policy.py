"""What happens after an attempt ends: the stage plan's retry rules, applied to one verdict.

The rules are the compiled workflow's (``durapipe/compiler/plan.py`` decides them for both
executors, ``docs/lowering.md`` says how Argo runs them).  A stage runs as a chain of tasks:
each task retries preemptions at once while the stage's ``retry.preemptions`` lasts (one budget
for the whole stage, as on Argo, where each task is given the count spent before it); an
application failure ends the task and starts the next application attempt's after the backoff
(spending ``retry.attempts``; on Argo a wait task between the two); an out-of-memory kill moves
to the same attempt one rung up the OOM ladder without spending either budget; a CUDA OOM fails
or spends ``attempts`` per ``gpu_oom``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from durapipe.compiler.plan import StagePlan
from durapipe.dsl import units
from durapipe.runtime import contract


@dataclass
class Budget:
    """What an attempt history has used up."""

    failures: int = 0
    #: Preemptions of the whole stage, across its application attempts and rungs.
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


def _preempted(plan: StagePlan, budget: Budget) -> Decision:
    limit = plan.budgets.preemptions
    if budget.preemptions < limit:
        budget.preemptions += 1
        return Decision("retry", budget.rung,
                        f"preempted; retry {budget.preemptions}/{limit} of the preemption budget")
    return Decision("fail", budget.rung,
                    f"preempted {budget.preemptions + 1} times; the preemption budget "
                    f"({limit}) is spent")


def _out_of_memory(plan: StagePlan, budget: Budget) -> Decision:
    ladder = plan.rungs
    if budget.rung + 1 < len(ladder):
        budget.rung += 1
        return Decision("retry", budget.rung,
                        f"out of memory at {units.format_bytes(ladder[budget.rung - 1] or 0)}; "
                        f"next rung {units.format_bytes(ladder[budget.rung] or 0)}")
    sizes = ", ".join(units.format_bytes(m or 0) for m in ladder)
    return Decision("fail", budget.rung, f"out of memory at every size of the OOM ladder ({sizes})")


def decide(plan: StagePlan, budget: Budget, verdict: str) -> Decision:
    """Record ``verdict`` in ``budget`` and say what to do next (mutates ``budget``)."""
    budget.attempts += 1
    budget.history.append(verdict)
    if verdict == contract.VERDICT_SUCCESS:
        return Decision("done", budget.rung, "succeeded")
    if verdict == contract.VERDICT_PREEMPTED:
        return _preempted(plan, budget)
    if verdict == contract.VERDICT_HOST_OOM and plan.has_ladder:
        return _out_of_memory(plan, budget)
    if verdict == contract.VERDICT_GPU_OOM and plan.budgets.gpu_oom == "fail":
        return Decision("fail", budget.rung, "CUDA out of memory (gpu_oom = \"fail\")")
    what = {contract.VERDICT_HOST_OOM: "out of memory (no OOM ladder)",
            contract.VERDICT_GPU_OOM: "CUDA out of memory"}.get(verdict, "failed")
    attempts = plan.budgets.attempts
    if budget.failures < attempts:
        budget.failures += 1
        backoff = plan.budgets.backoff
        return Decision("retry", budget.rung, f"{what}; retry {budget.failures}/{attempts}",
                        backoff.wait(budget.failures) if backoff is not None else 0.0)
    return Decision("fail", budget.rung,
                    f"{what}; the failure budget ({attempts}) is spent" if attempts else what)
