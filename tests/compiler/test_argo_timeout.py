"""A stage ``timeout`` on Argo's controller: the per-attempt ``activeDeadlineSeconds`` at work.

The compiler copies ``timeout`` to each pod as ``activeDeadlineSeconds``; nothing in Argo
enforces it, the kubelet does (docs/argo-harness.md: the harness plays the kubelet as
k8s v1.35 does, SIGTERM at the deadline, then the pod ``Failed`` with reason
``DeadlineExceeded``).  docs/lowering.md promises: a timed-out attempt is retried from the
*preemption* budget (the runtime's SIGTERM exit 143), never from ``retry.attempts``, and the
stage fails once that budget is spent, as ``durapipe run`` (the same retry machine) does.
Each pod here would run for two hours; only its deadline ends it.  Skips without Go or
../shared (mandatory in CI).
"""

from __future__ import annotations

from typing import Any

import pytest

from durapipe.compiler import CompileOptions, compile_pipeline
from durapipe.compiler.plan import plan_pipeline
from durapipe.dsl.load import loads
from durapipe.dsl.model import Pipeline
from durapipe.plan import machine
from durapipe.runtime import contract
from tests.argo.argo_tools import run_scenario
from tests.compiler.test_argo_controller import node

pytestmark = [pytest.mark.slow, pytest.mark.harness]

SOURCE = '''pipeline "timeouts" {}

stage "train" {
  image   = "python:3.12"
  command = ["python", "train.py"]
  retry {
    attempts    = 1
    preemptions = 1
  }
  timeout = 10m
}
'''
TIMEOUT_MINUTES = 10
#: A pod that would run far past the deadline; the runtime's verdict when SIGTERM stops it.
LONG = {"outcome": "succeeded", "minutes": 120,
        "termMessage": contract.verdict_marker(contract.VERDICT_PREEMPTED)}
OK = {"outcome": "succeeded", "minutes": 5}
APP = {"outcome": "failed", "exitCode": 2, "minutes": 5,
       "message": contract.verdict_marker(contract.VERDICT_APP_FAILURE)}
#: The kubelet's words (k8s v1.35 pkg/kubelet/active_deadline.go).
DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"


def timeouts() -> Pipeline:
    loaded = loads(SOURCE, "timeouts.pipe")
    assert loaded.ok and loaded.pipeline is not None, loaded.diagnostics
    return loaded.pipeline


def run(attempts: list[dict[str, Any]]) -> dict[str, Any]:
    """Run the compiled pipeline; the n-th pod the controller creates gets ``attempts[n]``,
    whichever task Argo runs it in."""
    result = compile_pipeline(timeouts(), CompileOptions())
    assert result.ok
    (doc,) = result.documents
    doc["metadata"] = {"name": "timeouts"}
    report = run_scenario({"name": "timeouts", "workflow": doc, "expect": {},
                           "runs": [{"attempts": {"*": attempts}}]})
    assert not report.get("error"), report.get("error")
    run_report: dict[str, Any] = report["runs"][0]
    return run_report


def ran(attempt: dict[str, Any]) -> float:
    minutes: float = attempt["finishedMinute"] - attempt["startedMinute"]
    return minutes


def machine_steps(verdicts: list[str]) -> tuple[list[int], machine.Action]:
    """The attempt numbers and the last action of ``durapipe run``'s retry machine."""
    (plan,) = plan_pipeline(timeouts(), checkpoint_grace_seconds=300).stages
    action: machine.Action
    action, state = machine.begin(plan.rules)
    numbers: list[int] = []
    for verdict in verdicts:
        assert isinstance(action, machine.Run)
        numbers.append(action.attempt)
        action, state = machine.step(state, verdict)
    return numbers, action


def test_a_timeout_ends_each_attempt_at_its_deadline_and_spends_the_preemption_budget() -> None:
    report = run([LONG, LONG, LONG])
    assert report["phase"] == "Failed"
    attempts = report["attempts"]
    # Two attempts: the first and the one preemption retry; the application retry never runs.
    assert [a["key"] for a in attempts] == ["train-app-0", "train-app-0"]
    assert [a["pod"]["env"][contract.ENV_ATTEMPT] for a in attempts] == ["0", "1"]
    assert node(report, "train-app-1")["phase"] in ("Skipped", "Omitted")
    for a in attempts:
        pod = a["pod"]
        assert pod["activeDeadlineSeconds"] == TIMEOUT_MINUTES * 60
        assert (pod["deadlineExceeded"], pod["finalPhase"], pod["reason"], pod["message"]) == (
            True, "Failed", "DeadlineExceeded", DEADLINE_MESSAGE)
        assert (a["phase"], a["message"], a["exitCode"]) == ("Failed", DEADLINE_MESSAGE, "143")
        # Each ran its 10 minutes, not its 120: the clock stops at the deadline (30 s ticks).
        assert TIMEOUT_MINUTES <= ran(a) < TIMEOUT_MINUTES + 0.5, a
    assert node(report, "train-app-0")["message"] == "No more retries left"
    assert 2 * TIMEOUT_MINUTES <= report["simMinutes"] < 2 * TIMEOUT_MINUTES + 1
    # durapipe run's machine: the same two attempts, then the same end.
    numbers, end = machine_steps([machine.TIMEOUT, machine.TIMEOUT])
    assert numbers == [0, 1]
    assert end == machine.Fail("timed out after 10m; the preemption budget (1) is spent")


def test_a_timeout_leaves_the_application_budget_to_an_application_failure() -> None:
    # timeout (preemption budget spent), application failure (the one application retry),
    # then success: a timeout that spent `attempts` would have failed the stage here.
    report = run([LONG, APP, OK])
    assert report["phase"] == "Succeeded"
    keys = [(a["key"], a["pod"]["env"][contract.ENV_ATTEMPT]) for a in report["attempts"]]
    assert keys == [("train-app-0", "0"), ("train-app-0", "1"), ("train-app-1", "2")]
    first, failed, last = report["attempts"]
    assert first["pod"]["deadlineExceeded"] is True
    assert TIMEOUT_MINUTES <= ran(first) < TIMEOUT_MINUTES + 0.5
    assert failed["pod"].get("deadlineExceeded") is None and 5 <= ran(failed) < 5.5
    assert last["phase"] == "Succeeded" and 5 <= ran(last) < 5.5
    numbers, end = machine_steps([machine.TIMEOUT, machine.APP_FAILURE, machine.SUCCESS])
    assert numbers == [0, 1, 2] and end == machine.Done()
