"""One preemption budget for a whole stage, proven on compiled pipelines in Argo's controller.

A stage runs as several tasks (application attempts, OOM rungs, GPU types, a waiting type's
probe and its ``-retry`` task), each with its own ``retryStrategy``.  Each task takes the
preemptions the stage spent before it (``preempted-before``), retries what is left of
``retry.preemptions``, and reports what it spent as its ``preempted`` output, which the next
task takes (docs/lowering.md, "Retries with separate budgets").  Each case is data: a stage,
what every pod attempt does, and what must follow; ``exhausts`` cases end because the budget
is spent across tasks, which per-task budgets (the lowering before) would have let run on
(``test_per_task_budgets_would_let_the_stage_run_on`` shows it on the same compiled YAML).
Skips without Go or ../shared (mandatory in CI).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from durapipe.compiler.plan import plan_pipeline
from durapipe.dsl.model import Stage
from durapipe.plan import machine
from durapipe.runtime import contract
from tests.argo.argo_tools import INFORMER_LAGS
from tests.compiler.models import GI, Gpu, GpuChoice, OnOom, Resources, Retry, pipeline, stage
from tests.compiler.test_argo_controller import node, run

pytestmark = [pytest.mark.slow, pytest.mark.harness]

DELETED = {"outcome": "deleted", "minutes": 5}  # spot VM reclaimed: "pod deleted", no exit code
SIGTERM = {"outcome": "disrupted", "message": "durapipe-verdict:preempted", "minutes": 5}
OOM = {"outcome": "oomkilled", "minutes": 5}
APP = {"outcome": "failed", "exitCode": 2, "minutes": 5, "message": "durapipe-verdict:app_failure"}
OK = {"outcome": "succeeded", "minutes": 5}
#: The verdict `durapipe run` reaches for each outcome.
VERDICT = {"deleted": contract.VERDICT_PREEMPTED, "disrupted": contract.VERDICT_PREEMPTED,
           "oomkilled": contract.VERDICT_HOST_OOM, "failed": contract.VERDICT_APP_FAILURE,
           "succeeded": contract.VERDICT_SUCCESS}

LADDER = OnOom(memory=(GI, 2 * GI, 4 * GI))
H100_A100 = Gpu(count=8, types=(GpuChoice(type="H100", count=8), GpuChoice(type="A100", count=8)),
                fallback_after=1800)


@dataclass(frozen=True)
class Case:
    id: str
    stage: Stage
    #: What each pod attempt of each task does, in order (the harness runs a pod it has no
    #: outcome for to success, as a per-task budget would have let the stage do).
    attempts: dict[str, list[dict[str, Any]]]
    phase: str
    #: (task, DURAPIPE_ATTEMPT) of every pod, in the order they ran.
    pods: list[tuple[str, int]]
    #: Task -> the preemptions it reported (its Retry node's `preempted` output).
    reported: dict[str, str] = field(default_factory=dict)
    #: The task whose retries ran out because the stage's budget was spent.
    exhausts: str | None = None


CASES = [
    Case(
        # preempt, OOM, preempt: the 2Gi rung has one preemption left of two, so the next
        # preemption ends the stage (per-task budgets allowed two on every rung).
        "ladder-budget-spans-rungs",
        stage(interruptible=True, retry=Retry(attempts=1, preemptions=2, on_oom=LADDER)),
        {"train-mem-1gi-app-0": [DELETED, OOM],
         "train-mem-2gi-app-0": [DELETED, DELETED, OK]},
        "Failed",
        [("train-mem-1gi-app-0", 0), ("train-mem-1gi-app-0", 1),
         ("train-mem-2gi-app-0", 2), ("train-mem-2gi-app-0", 3)],
        {"train-mem-1gi-app-0": "1"},
        exhausts="train-mem-2gi-app-0",
    ),
    Case(
        # Preemptions and application failures interleave across three attempts (with the
        # backoff task between them): 1 + 1 + 1 spent, the fourth preemption ends the stage.
        "interleaved-with-application-failures",
        stage(interruptible=True, retry=Retry(attempts=2, preemptions=3, backoff=60)),
        {"train-app-0": [DELETED, APP], "train-app-1": [SIGTERM, APP],
         "train-app-2": [DELETED, DELETED, OK]},
        "Failed",
        [("train-app-0", 0), ("train-app-0", 1), ("train-app-1", 2), ("train-app-1", 3),
         ("train-app-2", 4), ("train-app-2", 5)],
        {"train-app-0": "1", "train-app-1": "2"},
        exhausts="train-app-2",
    ),
    Case(
        # The same history with the third preemption the last: exactly the budget, so the
        # stage goes on and succeeds.
        "interleaved-budget-exactly-spent",
        stage(interruptible=True, retry=Retry(attempts=2, preemptions=3, backoff=60)),
        {"train-app-0": [DELETED, APP], "train-app-1": [SIGTERM, APP],
         "train-app-2": [DELETED, OK]},
        "Succeeded",
        [("train-app-0", 0), ("train-app-0", 1), ("train-app-1", 2), ("train-app-1", 3),
         ("train-app-2", 4), ("train-app-2", 5)],
        {"train-app-0": "1", "train-app-1": "2", "train-app-2": "3"},
    ),
    Case(
        # A waiting type's probe preempted after it ran (its SIGTERM exit): its -retry task
        # has two of three left, spends one, runs out of memory; the next rung on the same
        # type has one left.
        "gpu-probe-and-rungs-share",
        stage(interruptible=True, resources=Resources(gpu=H100_A100),
              retry=Retry(preemptions=3, on_oom=OnOom(memory=(GI, 2 * GI)))),
        {"train-h100-mem-1gi": [SIGTERM], "train-h100-mem-1gi-retry": [SIGTERM, OOM],
         "train-h100-mem-2gi-retry": [DELETED, DELETED, OK]},
        "Failed",
        [("train-h100-mem-1gi", 0), ("train-h100-mem-1gi-retry", 1),
         ("train-h100-mem-1gi-retry", 2), ("train-h100-mem-2gi-retry", 3),
         ("train-h100-mem-2gi-retry", 4)],
        {"train-h100-mem-1gi-retry": "2"},
        exhausts="train-h100-mem-2gi-retry",
    ),
    Case(
        # A type that never schedules falls back with nothing spent; on the next type the
        # budget then spans its rungs and application attempts.
        "gpu-fallback-then-rungs-and-attempts",
        stage(interruptible=True, resources=Resources(gpu=H100_A100),
              retry=Retry(attempts=1, preemptions=2, on_oom=OnOom(memory=(GI, 2 * GI)))),
        {"train-h100-mem-1gi": [{"outcome": "pending"}],
         "train-a100-mem-1gi-app-0": [DELETED, APP],
         "train-a100-mem-1gi-app-1": [OOM],
         "train-a100-mem-2gi-app-1": [DELETED, DELETED, OK]},
        "Failed",
        [("train-h100-mem-1gi", 0), ("train-a100-mem-1gi-app-0", 0),
         ("train-a100-mem-1gi-app-0", 1), ("train-a100-mem-1gi-app-1", 2),
         ("train-a100-mem-2gi-app-1", 3), ("train-a100-mem-2gi-app-1", 4)],
        {"train-a100-mem-1gi-app-0": "1", "train-a100-mem-1gi-app-1": "1"},
        exhausts="train-a100-mem-2gi-app-1",
    ),
]


def pod_attempts(report: dict[str, Any]) -> list[tuple[str, int]]:
    return [(a["key"], int(a["pod"]["env"][contract.ENV_ATTEMPT])) for a in report["attempts"]
            if "pod" in a]


# The same numbers whether the controller's informer keeps up or lags (a loaded machine).
@pytest.mark.parametrize("informer_lag", INFORMER_LAGS.values(), ids=INFORMER_LAGS.keys())
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_stage_spends_one_preemption_budget(case: Case, informer_lag: str) -> None:
    report = run(pipeline(case.stage), case.attempts, informer_lag=informer_lag)
    assert report["phase"] == case.phase, report.get("message")
    assert pod_attempts(report) == case.pods
    for task, spent in case.reported.items():
        assert node(report, task)["outputs"]["preempted"] == spent, task
    if case.exhausts is not None:
        assert node(report, case.exhausts)["message"] == "No more retries left"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_durapipe_run_spends_the_same_budget_with_the_same_numbers(case: Case) -> None:
    """The local executor's policy, fed the verdicts of the same history (without the pod
    that never scheduled: a local run never waits for capacity), stops where Argo stops and
    numbers the attempts as Argo's pods are numbered."""
    (plan,) = plan_pipeline(pipeline(case.stage), checkpoint_grace_seconds=300).stages
    queues = {task: list(outcomes) for task, outcomes in case.attempts.items()}
    action: machine.Action
    action, state = machine.begin(plan.rules)
    for task, number in case.pods:
        outcome = queues[task].pop(0)
        if outcome["outcome"] == "pending":
            continue
        assert isinstance(action, machine.Run)
        assert action.attempt == number, task
        action, state = machine.step(state, VERDICT[outcome["outcome"]])
    assert isinstance(action, machine.Done if case.phase == "Succeeded" else machine.Fail)


LIMIT = re.compile(r"\{\{=(\d+) - asInt\(inputs\.parameters\['preempted-before'\]\)\}\}")


@pytest.mark.parametrize("case", [c for c in CASES if c.exhausts],
                         ids=[c.id for c in CASES if c.exhausts])
def test_per_task_budgets_would_let_the_stage_run_on(case: Case) -> None:
    # The scenarios can fail: give every task the whole budget again (the lowering before
    # the count), and the stage that must stop runs on to the pod after.
    def per_task(text: str) -> str:
        assert LIMIT.search(text), "the compiled stage counts its preemptions"
        return LIMIT.sub(r"\1", text)

    report = run(pipeline(case.stage), case.attempts, per_task)
    assert report["phase"] == "Succeeded"
    assert len(pod_attempts(report)) > len(case.pods)
