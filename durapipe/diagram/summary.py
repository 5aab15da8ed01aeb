"""What each stage's durability settings compile to, in a few short lines.

One source for the labels of ``durapipe graph`` and the hover of a ``retry`` block in the
editor, read from the compiler's own plan: the task count is the retry machine's reachable
states as the Argo lowering unrolls them (``argo_stage.dag_size``), so a picture never
disagrees with the YAML.
"""

from __future__ import annotations

from dataclasses import dataclass

from durapipe.compiler.argo_stage import DagSize, dag_size
from durapipe.compiler.options import CompileOptions
from durapipe.compiler.plan import backoff_of, plan_variants
from durapipe.dsl import units
from durapipe.dsl.model import Stage

#: Argo's limit on tasks in one DAG (``P0403`` beyond it), as the compiler applies it.
MAX_DAG_TASKS = CompileOptions().max_tasks


@dataclass(frozen=True)
class BudgetSummary:
    """A stage's retry budgets as the compiled workflow spends them."""

    #: Tries after application failures: ``attempts + 1``, one DAG task each.
    tries: int
    #: Preemptions retried, one count for the whole stage (each task retries what is left).
    preemptions: int
    #: OOM ladder sizes, in order (empty without a ladder).
    rungs: tuple[int, ...]
    #: GPU types the stage falls back through (one entry when there is no fallback).
    gpu_types: tuple[str, ...]
    #: ``(duration, factor, cap)`` in seconds, or ``None`` without backoff.
    backoff: tuple[int, int, int] | None
    gpu_oom: str
    #: The tasks of the stage's compiled DAG.
    dag: DagSize

    @property
    def variants(self) -> int:
        return max(1, len(self.rungs)) * max(1, len(self.gpu_types))

    @property
    def tasks(self) -> int:
        """Tasks the stage compiles to (attempt tasks, backoff waits, join)."""
        return self.dag.total


def budgets(stage: Stage) -> BudgetSummary:
    variants = plan_variants(stage, stage.name)
    rungs = stage.retry.on_oom.memory if stage.retry.on_oom is not None else ()
    # GPU types are variants of their own only when the stage falls back between them.
    falls_back = len({v.type_index for v in variants}) > 1
    types: list[str] = []
    for variant in variants:
        if falls_back and variant.gpu is not None and variant.gpu.type not in types:
            types.append(variant.gpu.type)
    rule = stage.retry
    planned = backoff_of(rule)
    backoff = (planned.seconds, planned.factor, planned.cap) if planned is not None else None
    return BudgetSummary(tries=rule.attempts + 1, preemptions=rule.preemptions,
                         rungs=tuple(rungs), gpu_types=tuple(types), backoff=backoff,
                         gpu_oom=rule.gpu_oom, dag=dag_size(stage))


def budget_lines(stage: Stage) -> list[str]:
    """The budgets in words, one line each (the hover of a ``retry`` block)."""
    b = budgets(stage)
    retries = b.tries - 1
    lines = [(f"application failures: {b.tries} tr{'ies' if b.tries != 1 else 'y'} "
             f"({retries} retr{'ies' if retries != 1 else 'y'}), one DAG task each"),
             (f"preemptions: up to {b.preemptions} for the whole stage (each task retries "
             "what is left), not spent from the application budget")]
    if b.rungs:
        ladder = " -> ".join(units.format_bytes(r) for r in b.rungs)
        lines.append(f"OOM kills: climb the memory ladder {ladder} ({len(b.rungs)} rungs)")
    else:
        lines.append("OOM kills: an application failure (no `on_oom` ladder)")
    if len(b.gpu_types) > 1:
        lines.append(f"GPU capacity: falls back through {', '.join(b.gpu_types)}")
    if b.backoff is not None:
        duration, factor, cap = b.backoff
        lines.append(f"backoff: {units.format_seconds(duration)} x {factor} per retry, capped "
                     f"at {units.format_seconds(cap)}")
    else:
        lines.append("backoff: none (retries start at once)")
    lines.append("CUDA OOM: " + ("fails the stage at once" if b.gpu_oom == "fail"
                                 else "retried from the application budget"))
    d = b.dag
    parts = [f"{d.attempts} attempt task{'s' * (d.attempts != 1)}"]
    if d.waits:
        parts.append(f"{d.waits} backoff wait{'s' * (d.waits != 1)}")
    if d.extra:
        parts.append("the join" + (" and the OOM-exhausted task" if d.extra > 1 else ""))
    lines.append(f"tasks: {b.tasks} of Argo's {MAX_DAG_TASKS} per DAG ({', '.join(parts)})")
    return lines


def memory_text(stage: Stage) -> str | None:
    """``64Gi``, or the ladder ``256Gi -> 512Gi -> 1Ti``."""
    if stage.retry.on_oom is not None:
        return " -> ".join(units.format_bytes(m) for m in stage.retry.on_oom.memory)
    if stage.resources.memory is not None:
        return units.format_bytes(stage.resources.memory)
    return None


def gpu_text(stage: Stage) -> str | None:
    """``8x H100 > A100-80GB`` (fallback order), or ``None`` without GPUs."""
    gpu = stage.resources.gpu
    if gpu is None:
        return None
    if not gpu.types:
        return f"{gpu.count}x GPU"
    counts = {c.count for c in gpu.types}
    if len(counts) == 1:
        return f"{gpu.types[0].count}x " + " > ".join(c.type for c in gpu.types)
    return " > ".join(f"{c.count}x {c.type}" for c in gpu.types)


def cache_text(stage: Stage) -> str:
    if stage.cache is None:
        return "no cache"
    parts = ["cached"]
    if stage.cache.version:
        parts.append(f"v{stage.cache.version}")
    if stage.cache.max_age is not None:
        parts.append(f"max age {units.format_duration_literal(stage.cache.max_age)}")
    return " ".join(parts)
