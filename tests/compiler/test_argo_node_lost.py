"""A node lost abruptly, on compiled pipelines in Argo's controller, for every kind of task.

When a node goes away at once (its kubelet and containerd killed, the Node deleted, its pods
garbage-collected), Argo's wait container never reports: the pod is gone with no
``WorkflowTaskResult`` and no outputs.  Each case routes a stage through its grid to one task
(by the outcome each predecessor link needs: an OOM kill, an application failure, a pending
timeout, a probe's preemption), loses that task's first pod, and lets the next pod succeed.
The loss comes in the ways Argo can see it (``LOSSES``): the pod object gone at once, or
marked ``Failed`` by pod GC first (as the kubelet last reported it: main still running, or
already ended with an exit code), then deleted.  The run must not hang: every case is bounded
in controller steps and wall-clock seconds, and must end where ``durapipe run``'s machine ends,
with the same attempts, the loss spending one preemption (``machine.PREEMPTED``, what the
local runner's ``--kill`` gives).  Skips without Go or ../shared (mandatory in CI).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import pytest

from durapipe.compiler import CompileOptions, compile_pipeline
from durapipe.compiler.plan import StagePlan, TaskPlan, plan_pipeline
from durapipe.dsl.model import Stage
from durapipe.plan import machine
from durapipe.runtime import contract
from tests.compiler.models import GI, Gpu, GpuChoice, OnOom, Resources, Retry, pipeline, stage

pytestmark = [pytest.mark.slow, pytest.mark.harness]

#: The ways a lost node's pod ends, as Argo's controller sees it; none writes a task result.
LOSSES: dict[str, dict[str, Any]] = {
    # The pod object deleted while Running: all the controller sees is its absence.
    "deleted": {"outcome": "deleted", "minutes": 5},
    # Pod GC marks the orphaned pod Failed first (main still running), then deletes it.
    "gc": {"outcome": "lost", "minutes": 5},
    # The kubelet had reported main's end (an application failure, an OOM kill) just before.
    "gc-after-exit": {"outcome": "lost", "exitCode": 2, "minutes": 5,
                      "message": "durapipe-verdict:app_failure"},
    "gc-after-oom": {"outcome": "lost", "exitCode": 137, "minutes": 5},
    # Not a lost node, the same want: main ended, its wait container failed and wrote no task
    # result (the control plane issue 21 saw, whose executor reported nothing for failed pods).
    "no-result": {"outcome": "failed", "exitCode": 2, "noResult": True, "minutes": 5,
                  "message": "durapipe-verdict:app_failure"},
    "no-result-oom": {"outcome": "oomkilled", "noResult": True, "minutes": 5},
}
#: The verdict of the lost attempt: a preemption, unless main had ended and the kubelet had
#: reported its exit (then the runtime's verdict stands, and only the count is lost).
VERDICT = {"deleted": machine.PREEMPTED, "gc": machine.PREEMPTED,
           "gc-after-exit": machine.APP_FAILURE, "gc-after-oom": machine.HOST_OOM,
           "no-result": machine.APP_FAILURE, "no-result-oom": machine.HOST_OOM}
OK = {"outcome": "succeeded", "minutes": 5}
EXHAUSTED = {"outcome": "failed", "exitCode": 1, "minutes": 1,
             "message": "durapipe: stage train ran out of memory"}
#: The outcome that takes a stage along each kind of link, and the verdict the machine reads.
ROUTE: dict[str, tuple[dict[str, Any], str]] = {
    "oom": ({"outcome": "oomkilled", "minutes": 5}, machine.HOST_OOM),
    "app_failure": ({"outcome": "failed", "exitCode": 2, "minutes": 5,
                     "message": "durapipe-verdict:app_failure"}, machine.APP_FAILURE),
    "fallback": ({"outcome": "pending"}, machine.PENDING_TIMEOUT),
    "preempted": ({"outcome": "disrupted", "message": "durapipe-verdict:preempted",
                   "minutes": 5}, machine.PREEMPTED),
}
#: Controller steps and wall-clock seconds a case may take: a run whose DAG cannot resolve
#: an argument requeues for ever, and ends these still Running.
MAX_STEPS = 300
WALL_SECONDS = 180.0

TYPES = (GpuChoice(type="H100", count=8), GpuChoice(type="A100", count=8))
STAGES: dict[str, Stage] = {
    # Every kind of a grid at once: probes, a probe's retrying task, application attempts
    # after a backoff, the next rung, the next type, tasks several links lead to.
    "grid": stage(interruptible=True, resources=Resources(gpu=Gpu(count=8, types=TYPES,
                                                                   fallback_after=1800)),
                  retry=Retry(attempts=1, preemptions=2, backoff=60,
                              on_oom=OnOom(memory=(GI, 2 * GI)))),
    # Three types: a probe that follows a probe; one preemption, the last attempt on demand.
    "three-types": stage(interruptible=True, last_attempt_on_demand=True, resources=Resources(
        gpu=Gpu(count=8, types=(GpuChoice(type="H200", count=8), *TYPES), fallback_after=600)),
        retry=Retry(attempts=1, preemptions=1)),
    # Application attempts and rungs without a backoff (the condition reads the exit code).
    "ladder": stage(retry=Retry(attempts=1, preemptions=1, on_oom=OnOom(memory=(GI, 2 * GI)))),
    # One task: a pod stage retrying preemptions itself.
    "pod": stage(retry=Retry(preemptions=1)),
}


@dataclass(frozen=True)
class Case:
    stage: str
    #: The task whose first pod the lost node takes.
    task: str
    loss: str = "deleted"

    @property
    def id(self) -> str:
        return f"{self.stage}:{self.task}:{self.loss}"


def route(plan: StagePlan, target: TaskPlan) -> list[tuple[TaskPlan, str]]:
    """The tasks from the stage's first to ``target``, each with the link it leaves by."""
    by_name = {t.name: t for t in plan.tasks}
    first = next(t for t in plan.tasks if not t.preds)
    paths: deque[list[tuple[TaskPlan, str]]] = deque([[(first, "")]])
    while paths:
        path = paths.popleft()
        if path[-1][0] == target:
            return path
        for task in plan.tasks:
            for pred in task.preds:
                if by_name[pred.task] == path[-1][0]:
                    paths.append([*path[:-1], (path[-1][0], pred.because), (task, "")])
    raise AssertionError(f"{target.name} is not reachable")


def plan_of(name: str) -> StagePlan:
    (plan,) = plan_pipeline(pipeline(STAGES[name]), checkpoint_grace_seconds=300).stages
    return plan


CASES = [Case(name, task.name, loss) for name in STAGES for task in plan_of(name).tasks
         for loss in LOSSES]


def history(case: Case) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """What each task's pods do, and the verdicts the machine reads, in order."""
    plan = plan_of(case.stage)
    target = next(t for t in plan.tasks if t.name == case.task)
    attempts: dict[str, list[dict[str, Any]]] = {}
    verdicts: list[str] = []
    for task, because in route(plan, target)[:-1]:
        outcome, verdict = ROUTE[because]
        attempts.setdefault(task.name, []).append(outcome)
        verdicts.append(verdict)
    attempts.setdefault(target.name, []).extend([LOSSES[case.loss], OK])
    # The harness cannot run the image; it plays the "memory exhausted" task's own exit.
    attempts[f"{plan.task}-oom-exhausted"] = [EXHAUSTED]
    return attempts, [*verdicts, VERDICT[case.loss], machine.SUCCESS]


def uncounted(case: Case) -> TaskPlan | None:
    """The task that reads the lost attempt's count where none was reported (main had
    ended): it takes the whole budget as spent (``argo_retry.reported``)."""
    plan = plan_of(case.stage)
    if VERDICT[case.loss] == machine.PREEMPTED or next(
            t for t in plan.tasks if t.name == case.task).probe:
        return None  # a probe passes its count as a number
    because = "oom" if VERDICT[case.loss] == machine.HOST_OOM and plan.has_ladder \
        else "app_failure"
    following = [t for t in plan.tasks for p in t.preds if (p.task, p.because) ==
                 (case.task, because)]
    return next((t for t in following if t.preempted is None), None)


def expected(case: Case, verdicts: list[str]) -> tuple[str, list[tuple[int, int, int]]]:
    """The machine's walk: the phase it ends in and (rung, type, attempt) of every run."""
    action: machine.Action
    action, state = machine.begin(plan_of(case.stage).rules)
    runs: list[tuple[int, int, int]] = []
    for verdict in verdicts:
        assert isinstance(action, machine.Run)
        runs.append((action.rung, action.gpu_type, action.attempt))
        action, state = machine.step(state, verdict)
        if not isinstance(action, machine.Run):
            break
    phase = "Succeeded" if isinstance(action, machine.Done) else "Failed"
    reader = uncounted(case)
    if reader is not None and len(runs) == len(verdicts):
        rung, gpu_type, _ = runs[-1]
        runs[-1] = (rung, gpu_type, reader.first_attempt + reader.budget)
    return phase, runs


def run_bounded(case: Case, attempts: dict[str, list[dict[str, Any]]]) -> tuple[dict[str, Any],
                                                                                float]:
    from tests.argo.argo_tools import build_argo_sim, run_scenario

    result = compile_pipeline(pipeline(STAGES[case.stage]), CompileOptions())
    assert result.ok
    (doc,) = result.documents
    doc["metadata"] = {"name": "sim"}
    # The harness's own build (minutes on a cold machine, waiting on another worker's) is not
    # the run's time: build it before the clock starts.
    build_argo_sim()
    start = time.monotonic()
    report = run_scenario({"name": "node-lost", "workflow": doc, "maxSteps": MAX_STEPS,
                           "runs": [{"attempts": attempts}], "expect": {}},
                          timeout=WALL_SECONDS)
    elapsed = time.monotonic() - start
    assert not report.get("error"), report.get("error")
    return report["runs"][0], elapsed


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_lost_node_spends_one_preemption_and_the_run_goes_on(case: Case) -> None:
    attempts, verdicts = history(case)
    phase, runs = expected(case, verdicts)
    report, elapsed = run_bounded(case, attempts)
    assert report["phase"] != "Running", (
        f"hung after {report['steps']} steps: {report['message']}\n{report['_log'][-3000:]}"
        if "_log" in report else f"hung after {report['steps']} steps")
    assert elapsed < WALL_SECONDS
    variant = {t.name: (t.variant.rung, t.variant.type_index) for t in plan_of(case.stage).tasks}
    ran = [(*variant[a["key"]], int(a["pod"]["env"][contract.ENV_ATTEMPT]))
           for a in report["attempts"] if "pod" in a and a["key"] in variant]
    assert (report["phase"], ran) == (phase, runs), report.get("message")
