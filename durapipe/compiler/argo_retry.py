"""Retry classification: the ``retryStrategy.expression`` text and the DAG conditions of the
OOM ladder and GPU fallback.

Every piece of Argo expression text the compiler emits for failure handling is built here, so
the lowering document and the tests have one place to point at.  Expressions are expr-lang
(Argo >= 3.5 for ``lastRetry.message``); every variable is a string.
"""

from __future__ import annotations

from durapipe.runtime import contract

_MSG = "lastRetry.message"

#: Substrings of ``lastRetry.message`` that mean the pod was taken away, not that it failed:
#: Argo's own "pod deleted" (node drained, spot VM reclaimed, taint eviction, scheduler
#: preemption, a node lost and its pod garbage-collected), the pod of a lost node marked
#: Failed by pod GC while its containers still ran (v4.1.2 ``inferFailedReason``'s message
#: when no container ended), the kubelet's graceful node shutdown, kubelet and API evictions,
#: the DisruptionTarget condition reason, and the runtime's preempted verdict (SIGTERM).
PREEMPTION_MARKERS: tuple[str, ...] = (
    "pod deleted",
    "neither main nor wait container completed successfully",
    "imminent node shutdown",
    "Evicted",
    "evicted",
    "The node was low on resource",
    "DisruptionTarget",
    "PreemptionByScheduler",
    contract.verdict_marker(contract.VERDICT_PREEMPTED),
)
#: The kubelet's OOM kill of the main container, and the runtime's host OOM verdict.
OOM_MARKERS: tuple[str, ...] = ("OOMKilled", contract.verdict_marker(contract.VERDICT_HOST_OOM))
GPU_OOM_MARKERS: tuple[str, ...] = (contract.verdict_marker(contract.VERDICT_GPU_OOM),)


def _any_message(markers: tuple[str, ...]) -> str:
    return " || ".join(f"{_MSG} contains '{m}'" for m in markers)


def preempted() -> str:
    """True when the last attempt was preempted (wrapper exit 143 or a preemption message).

    This is every leaf's ``retryStrategy.expression``: Argo has one ``limit`` per
    retryStrategy and shows the expression only the last attempt, so one retryStrategy cannot
    keep two budgets.  Each leaf task therefore retries preemptions (its ``limit`` is the
    preemption budget) and ends on anything else; an application failure starts the next
    application attempt's task, an OOM kill the next rung's, a CUDA OOM with
    ``gpu_oom = "fail"`` nothing (``app_failure_condition``).
    """
    return f"(lastRetry.exitCode == '{contract.EXIT_PREEMPTED}' || {_any_message(PREEMPTION_MARKERS)})"


def oom() -> str:
    return f"({_any_message(OOM_MARKERS)})"


def gpu_oom() -> str:
    return f"(lastRetry.exitCode == '{contract.EXIT_GPU_OOM}' || {_any_message(GPU_OOM_MARKERS)})"


# -- DAG conditions of the variant grid --------------------------------------------------------
#
# `tasks[...]` is never read nil-safe (no `tasks?.[...]`): Argo substitutes `{{=...}}` in
# several passes, and an expression that evaluates without error in an early pass (where
# `tasks` is not yet in scope) is frozen to that value.  A strict `tasks['x']` fails to resolve
# in those passes and leaves the tag for the DAG's own pass, where every predecessor named in
# `depends` has a status.  Only the exit code may be missing there (a task that never ran has
# none), and the outputs (a pod whose task result never came), so they are read with `get()`
# and, where "none" is a case, defaulted with `??`: a static member path `tasks['x'].exitCode`
# would be a "missing variable" that requeues the workflow forever (verified on Argo's
# controller: tests/compiler/test_argo_controller.py, test_argo_node_lost.py).


def oom_condition(task: str) -> str:
    """The previous rung ended in an OOM kill (the runtime never exits 137 for app failures)."""
    t = f"tasks['{task}']"
    return f"{t}.status == 'Failed' && get({t}, 'exitCode') == '{contract.EXIT_HOST_OOM}'"


# A task that ends `Error` lost its pod: Argo gives a pod that ran `Failed` with main's exit code
# or message (v4.1.2 `inferFailedReason` ranks main first), and `Error` only where the pod
# itself went (`pod deleted`: a node lost abruptly, its pod garbage-collected with no task
# result; the wait or init container failed).  So `Error` is a preemption, whatever exit code
# main had reported before the node went: the task's own retry expression retries `pod
# deleted` while the budget lasts, and once it is spent no condition starts another task (the
# stage fails, as the machine's preemption past the budget does).  A lost pod that pod GC
# marked `Failed` first has no exit code, like a probe's pending timeout; what tells them
# apart is the node: a pending timeout's pod was never placed on one (`hostNodeName`).


def _lost(task: str) -> str:
    return f"tasks['{task}'].status == 'Error'"


def _unplaced(task: str) -> str:
    return f"(get(tasks['{task}'], 'hostNodeName') ?? '') == ''"


def fallback_condition(task: str) -> str:
    """The previous GPU type gave up without running the main container to an exit code.

    That is the pending timeout: Argo fails (``Failed``, message ``timeout``) the probe whose
    pod stayed Pending, on no node, past its ``pendingTimeout``.  A type that ran and failed
    does not fall back (its failure is the stage's failure), nor does one whose pod was lost
    (``preempted_exit_condition``).
    """
    t = f"tasks['{task}']"
    return (f"{t}.status == 'Failed' && (get({t}, 'exitCode') ?? '') in ['', '-1'] && "
            f"{_unplaced(task)}")


def _exit_code(task: str) -> str:
    return f"(get(tasks['{task}'], 'exitCode') ?? '')"


def preempted_exit_condition(task: str) -> str:
    """A waiting GPU type's probe ran and was preempted (the runtime's exit 143) or lost its
    pod (``Error``, or ``Failed`` on a node with no exit code): the type's preemption retries
    continue in its ``-retry`` task."""
    t = f"tasks['{task}']"
    return (
        f"({_lost(task)}) || ({t}.status == 'Failed' && ({_exit_code(task)} == "
        f"'{contract.EXIT_PREEMPTED}' || ({_exit_code(task)} in ['', '-1'] && "
        f"!({_unplaced(task)}))))"
    )


def app_failure_condition(task: str, gpu_oom: str, *, has_ladder: bool) -> str:
    """The task ended in an application failure, so the next application attempt runs.

    Read from the exit code of a ``Failed`` task (an ``Error`` is a lost pod, never the
    program's failure), the only thing a DAG condition sees: any exit code except none (the
    pod never ran), 143 (preempted: that task's preemption budget is spent), 137 with a
    ladder (the next rung takes over; the runtime never exits 137 for an application
    failure) and 86 (CUDA OOM) with ``gpu_oom = "fail"``.
    """
    stop = ["''", "'-1'", f"'{contract.EXIT_PREEMPTED}'"]
    if has_ladder:
        stop.append(f"'{contract.EXIT_HOST_OOM}'")
    if gpu_oom == "fail":
        stop.append(f"'{contract.EXIT_GPU_OOM}'")
    return (
        f"tasks['{task}'].status == 'Failed' && "
        f"!({_exit_code(task)} in [{', '.join(stop)}])"
    )


# -- the stage-wide preemption count -----------------------------------------------------------
#
# One budget for a stage whose tasks each have their own `retryStrategy`: each task takes the
# preemptions spent before it as an input, retries what is left, and reports what it spent as
# an output that the next task takes.  The output is a `valueFrom.default` (no file is ever
# written at its path), which Argo's wait container reports whatever main's exit code
# (v4.1.2 `PostMain` runs `SaveParameters` for a failed or OOM-killed main too), resolved per
# attempt with that attempt's `retries`: the count of the Retry node's earlier children, every
# one of them a preemption, since a task's expression retries nothing else.

#: The input parameter: preemptions the stage spent before the task.
PREEMPTED_BEFORE = "preempted-before"
#: The output parameter: preemptions spent up to and including the task's last attempt.
PREEMPTED = "preempted"
_BEFORE = f"asInt(inputs.parameters['{PREEMPTED_BEFORE}'])"


def preemption_limit(budget: int) -> str:
    """A task's ``retryStrategy.limit``: what is left of the stage's budget."""
    return "{{=" + f"{budget} - {_BEFORE}" + "}}"


def spent(*, before: int | None, retried: bool) -> str:
    """Preemptions spent up to this attempt, as Argo expression text (inside ``{{=...}}``):
    ``before`` a number the plan knows, or ``None`` for the task's input."""
    terms = [_BEFORE] if before is None else ([str(before)] if before else [])
    if retried:
        terms.append("asInt(retries)")
    return " + ".join(terms) or "0"


def preempted_output(path: str, *, before: int | None, retried: bool) -> dict[str, object]:
    """The output parameter a counted task reports: ``spent`` at its attempt."""
    if before is not None and not retried:
        default = str(before)
    elif before == 0:
        default = "{{retries}}"
    else:
        default = "{{=" + spent(before=before, retried=retried) + "}}"
    return {"name": PREEMPTED, "valueFrom": {"path": path, "default": default}}


def reported(task: str, unknown: int) -> str:
    """The count ``task`` reported, as expression text; ``unknown`` where it reported none.

    A task result can be missing where a condition still starts the next task (main's exit
    reported, then the node lost; an executor that reports nothing for a failed pod): a strict
    read of the output would be a "missing variable" that requeues the workflow for ever.  So
    the read is ``get()``s under ``??``, which Argo v4.1.2 does not require to resolve
    (``getIdentifiers`` skips the members under ``??``).  That alone would resolve in a pass
    where ``tasks`` holds other tasks but not this one, and freeze ``unknown`` (seen in Argo's
    controller): the strict ``tasks['x'].status`` before it leaves the tag until the DAG's own
    pass has the task."""
    t = f"tasks['{task}']"
    path = f"get(get(get({t}, 'outputs'), 'parameters'), '{PREEMPTED}')"
    return f"({t}.status != '' ? ({path} ?? '{unknown}') : '{unknown}')"


def preempted_before_value(links: list[tuple[str, str, str | None]], unknown: int) -> str:
    """The ``preempted-before`` argument of a task: of its links (the condition under which
    that predecessor starts it, the predecessor, and the count it passes on as expression
    text, or ``None`` for the predecessor's own output), the one whose condition held.  A
    predecessor that reported no count passes ``unknown`` (the whole budget: however many it
    spent, the stage never retries more than its budget).

    At most one predecessor of a task starts it (a path through the grid moves one way at
    each step); a probe can precede the task that started it, but passes a number.  expr
    evaluates only the branch taken, and the others still resolve: Argo puts a skipped task's
    declared default into the scope (v4.1.2 ``addSkippedNodeOutputsToScope``).  The
    conditions read ``tasks['x'].status`` strictly, so an early substitution pass, where
    ``tasks`` is not in scope, leaves the whole expression for the DAG's own pass."""
    def value(task: str, count: str | None) -> str:
        return count if count is not None else reported(task, unknown)

    *earlier, (_, last_task, last_count) = links
    expr = value(last_task, last_count)
    for cond, task, count in reversed(earlier):
        expr = f"({cond}) ? {value(task, count)} : ({expr})"
    return "{{=" + expr + "}}"
