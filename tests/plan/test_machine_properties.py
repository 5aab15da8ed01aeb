"""Random verdict histories through the retry machine, `durapipe run`'s engine and Argo's
controller.

The engine (``Runner._attempts``) is driven with attempts whose verdicts come from the
history (``ScriptedRunner``: the loop, the waits and the records are the real ones), and the
sequence of (rung, GPU type, attempt number, outcome) it records must be the one the
executor-neutral rules below (the table of docs/local.md, written as counters) give, and the
one the machine gives when stepped by hand.  A broken transition in the machine makes the
engine (which steps it) disagree with the reference.

The third leg (``harness``, full tier) compiles the same stage and runs it in Argo v4.1.2's
controller (tools/argo-sim): the n-th pod the controller creates ends as the n-th verdict of
the history says, whichever task of the grid Argo runs it in, and the (rung, GPU type,
attempt number) each pod was given (its ``DURAPIPE_*`` environment) must be the machine's.  A
broken transition in the lowering makes Argo run another task, or another number, or stop
elsewhere.
"""

from __future__ import annotations

from pathlib import Path

from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from durapipe.compiler import CompileOptions, compile_pipeline
from durapipe.compiler.plan import StagePlan, plan_pipeline
from durapipe.dsl.model import Gpu, GpuChoice, OnOom, Resources, Retry, Stage
from durapipe.plan import machine
from durapipe.plan.rules import Rules
from durapipe.runner.engine import Runner, RunOptions
from durapipe.runner.records import AttemptRecord, StageRecord
from durapipe.runtime import contract
from tests.compiler.models import GI, pipeline, stage

LOCAL_VERDICTS = (machine.SUCCESS, machine.PREEMPTED, machine.HOST_OOM, machine.GPU_OOM,
                  machine.APP_FAILURE, machine.TIMEOUT)
Step = tuple[int, int, int, str]


def reference(retry: Retry, rungs: int, history: list[str]) -> tuple[list[Step], str]:
    """The rules as counters: separate budgets, one preemption count for the stage (a
    timeout draws on it, as Argo's SIGTERM at activeDeadlineSeconds does), the OOM ladder."""
    rung = failures = preempted = 0
    steps: list[Step] = []
    for verdict in history:
        steps.append((rung, 0, rung + failures + preempted, verdict))
        if verdict == machine.SUCCESS:
            return steps, "succeeded"
        if verdict in (machine.PREEMPTED, machine.TIMEOUT):
            if preempted == retry.preemptions:
                return steps, "failed"
            preempted += 1
        elif verdict == machine.HOST_OOM and rungs > 1:
            if rung + 1 == rungs:
                return steps, "failed"
            rung += 1
        elif verdict == machine.GPU_OOM and retry.gpu_oom == "fail":
            return steps, "failed"
        elif failures == retry.attempts:
            return steps, "failed"
        else:
            failures += 1
    return steps, "unfinished"


class ScriptedRunner(Runner):
    """The real engine; each attempt ends with the next verdict of a history."""

    history: list[str]

    def _attempt(self, plan: StagePlan, run: machine.Run, stage_dir: Path,
                 outputs: dict[str, str], record: StageRecord) -> AttemptRecord:
        verdict = self.history.pop(0) if self.history else machine.SUCCESS
        return AttemptRecord(number=run.attempt, rung=run.rung, memory=str(run.gpu_type),
                             verdict=verdict, exit_code=0, seconds=0.0, message="",
                             resumed_from="", log="", fault="", tail="")


retries = st.builds(
    Retry, attempts=st.integers(0, 3), preemptions=st.integers(0, 3),
    backoff=st.sampled_from([None, 1]), gpu_oom=st.sampled_from(["fail", "retry"]),
    on_oom=st.sampled_from([None, OnOom(memory=(GI, 2 * GI)), OnOom(memory=(GI, 2 * GI, 4 * GI))]))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(retry=retries, history=st.lists(st.sampled_from(LOCAL_VERDICTS), min_size=1,
                                       max_size=12))
def test_the_engine_steps_the_rules_for_any_history(tmp_path: Path, retry: Retry,
                                                    history: list[str]) -> None:
    s = stage(retry=retry, timeout=60)
    rungs = len(retry.on_oom.memory) if retry.on_oom is not None else 1
    expected, outcome = reference(retry, rungs, history)
    if outcome == "unfinished":
        history = [*history, machine.SUCCESS]
        expected, outcome = reference(retry, rungs, history)
    runner = ScriptedRunner(pipeline(s), str(tmp_path / "p.pipe"),
                            RunOptions(home=tmp_path / ".durapipe", backoff_scale=0.0))
    runner.history = list(history)
    record = runner.run()
    got = [(a.rung, int(a.memory), a.number, a.verdict) for a in record.stages["train"].attempts]
    assert (got, record.stages["train"].status) == (expected, outcome)
    # The machine stepped by hand gives the same sequence (the engine adds nothing).
    (plan,) = plan_pipeline(pipeline(s), checkpoint_grace_seconds=0).stages
    action: machine.Action
    action, state = machine.begin(plan.rules)
    by_hand: list[Step] = []
    for verdict in history:
        assert isinstance(action, machine.Run)
        by_hand.append((action.rung, action.gpu_type, action.attempt, verdict))
        action, state = machine.step(state, verdict)
        if not isinstance(action, machine.Run):
            break
    assert by_hand == expected


# -- the third leg: Argo's controller ----------------------------------------------------------

#: What each verdict looks like to Argo, as the kubelet and the runtime report it
#: (tests/argo's outcomes); a preemption takes one of several forms.  Attempts run half a
#: minute; a timed-out one would run 30 but the kubelet stops it at the stage's 1-minute
#: ``activeDeadlineSeconds``; a pending timeout stays unschedulable until the controller's
#: ``pendingTimeout`` (the 1-minute ``fallback_after``) deletes it.
def _runtime(verdict: str, code: int) -> dict[str, Any]:
    return {"outcome": "failed", "exitCode": code, "minutes": 0.5,
            "message": contract.verdict_marker(verdict)}


PREEMPTIONS: dict[str, dict[str, Any]] = {
    "sigterm": {"outcome": "disrupted", "minutes": 0.5,
                "message": contract.verdict_marker(machine.PREEMPTED)},
    "node-shutdown": {"outcome": "shutdown", "minutes": 0.5},
    "pod-deleted": {"outcome": "deleted", "minutes": 0.5},
}
OUTCOMES: dict[str, dict[str, Any]] = {
    machine.SUCCESS: {"outcome": "succeeded", "minutes": 0.5},
    machine.HOST_OOM: {"outcome": "oomkilled", "minutes": 0.5},
    machine.GPU_OOM: _runtime(machine.GPU_OOM, contract.EXIT_GPU_OOM),
    machine.APP_FAILURE: _runtime(machine.APP_FAILURE, contract.EXIT_APP_FAILURE),
    machine.TIMEOUT: {"outcome": "succeeded", "minutes": 30,
                      "termMessage": contract.verdict_marker(machine.PREEMPTED)},
    machine.PENDING_TIMEOUT: {"outcome": "pending"},
}
H100_A100 = Gpu(count=8, types=(GpuChoice(type="H100", count=8), GpuChoice(type="A100", count=8)),
                fallback_after=60)
#: The pod that reports an exhausted OOM ladder is no attempt; it exits 1 with its message.
EXHAUSTED = {"outcome": "failed", "exitCode": 1, "minutes": 0.1,
             "message": "durapipe: stage train ran out of memory"}
MAX_ATTEMPTS = 10


def walk(rules: Rules, data: st.DataObject) -> tuple[list[Step], list[dict[str, Any]], str]:
    """A random history drawn from what each state can end with (a pending timeout only on a
    waiting type's first attempt), stepped through the machine: its steps, the outcomes the
    harness plays for them, and how the stage ends."""
    action: machine.Action
    action, state = machine.begin(rules)
    steps: list[Step] = []
    outcomes: list[dict[str, Any]] = []
    while isinstance(action, machine.Run):
        if len(steps) == MAX_ATTEMPTS:
            verdict = machine.SUCCESS
        else:
            verdict = data.draw(st.sampled_from(machine.possible(state)), label="verdict")
        if verdict == machine.PREEMPTED:
            # A probe's pod deleted after it ran has no exit code, which the fallback
            # condition reads as capacity never found: not drawn there
            # (test_a_probe_lost_after_it_ran_retries_the_same_type); elsewhere every form.
            forms = ["sigterm", "node-shutdown"] if state.probe else sorted(PREEMPTIONS)
            outcomes.append(PREEMPTIONS[data.draw(st.sampled_from(forms), label="form")])
        else:
            outcomes.append(OUTCOMES[verdict])
        steps.append((action.rung, action.gpu_type, action.attempt, verdict))
        action, state = machine.step(state, verdict)
    return steps, outcomes, "succeeded" if isinstance(action, machine.Done) else "failed"


def on_argo(s: Stage, outcomes: list[dict[str, Any]],
            verdicts: list[str]) -> tuple[list[Step], str]:
    """The stage compiled and run in Argo's controller, the n-th pod ending with
    ``outcomes[n]``: each pod's (rung, type, attempt) as the controller gave them to it, with
    the verdict played for it, and how the workflow ended."""
    from tests.argo.argo_tools import run_scenario

    result = compile_pipeline(pipeline(s), CompileOptions())
    assert result.ok
    (doc,) = result.documents
    doc["metadata"] = {"name": "prop"}
    report = run_scenario({"name": "property", "workflow": doc, "expect": {}, "runs": [
        {"attempts": {"*": outcomes, "train-oom-exhausted": [EXHAUSTED]}}]})
    assert not report.get("error"), report.get("error")
    (run,) = report["runs"]
    types = [t.type for t in s.resources.gpu.types] if s.resources.gpu else []
    pods = [a for a in run["attempts"] if a["key"] != "train-oom-exhausted"]
    played = [*verdicts, *["unscripted success"] * max(0, len(pods) - len(verdicts))]
    got: list[Step] = []
    for attempt, verdict in zip(pods, played):
        env = attempt["pod"]["env"]
        got.append((int(env.get(contract.ENV_RUNG, "0")),
                    types.index(env[contract.ENV_GPU_TYPE]) if types else 0,
                    int(env[contract.ENV_ATTEMPT]), verdict))
    phase = run["phase"]
    # A stage whose last attempt lost its pod ends the workflow in Error, not Failed.
    if phase == "Error" and pods and (pods[-1]["phase"], pods[-1]["message"]) == (
            "Error", "pod deleted"):
        phase = "Failed"
    return got, {"Succeeded": "succeeded", "Failed": "failed"}.get(phase, phase)


@pytest.mark.harness
@pytest.mark.slow
# Each example is a run of Argo's controller (a second or two); shrinking a failure would take
# hundreds of them, so the failing history is reported as drawn.
@settings(max_examples=100, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(retry=retries, fallback=st.booleans(), data=st.data())
def test_argos_controller_runs_the_machines_history(tmp_path: Path, retry: Retry,
                                                    fallback: bool, data: st.DataObject) -> None:
    s = stage(retry=retry, timeout=60, resources=Resources(gpu=H100_A100 if fallback else None))
    (plan,) = plan_pipeline(pipeline(s), checkpoint_grace_seconds=0).stages
    expected, outcomes, outcome = walk(plan.rules, data)
    if not fallback:  # one GPU type: the same history through the counters and the engine
        history = [step[3] for step in expected]
        rungs = len(retry.on_oom.memory) if retry.on_oom is not None else 1
        assert reference(retry, rungs, history) == (expected, outcome)
        runner = ScriptedRunner(pipeline(s), str(tmp_path / "p.pipe"),
                                RunOptions(home=tmp_path / ".durapipe", backoff_scale=0.0))
        runner.history = list(history)
        record = runner.run()
        local = [(a.rung, int(a.memory), a.number, a.verdict)
                 for a in record.stages["train"].attempts]
        assert (local, record.stages["train"].status) == (expected, outcome)
    verdicts = [step[3] for step in expected]
    assert on_argo(s, outcomes, verdicts) == (expected, outcome)


@pytest.mark.harness
def test_a_probe_lost_after_it_ran_retries_the_same_type() -> None:
    """A probe whose pod is deleted after it ran has no exit code; the fallback condition once
    took that for capacity never found and moved to the next type at attempt 0. Since the
    lowering reads a lost pod (`Error`) as a preemption of the same type (issue 21's lost-node
    fix, tests/compiler/test_argo_node_lost.py) Argo agrees with the machine."""
    s = stage(retry=Retry(attempts=0, preemptions=1), timeout=60,
              resources=Resources(gpu=H100_A100))
    (plan,) = plan_pipeline(pipeline(s), checkpoint_grace_seconds=0).stages
    action, state = machine.begin(plan.rules)
    assert state.probe
    retried, _ = machine.step(state, machine.PREEMPTED)
    assert isinstance(retried, machine.Run)
    expected = [(0, 0, 0, machine.PREEMPTED),
                (retried.rung, retried.gpu_type, retried.attempt, machine.SUCCESS)]
    assert expected[1] == (0, 0, 1, machine.SUCCESS)
    got = on_argo(s, [PREEMPTIONS["pod-deleted"], OUTCOMES[machine.SUCCESS]],
                  [machine.PREEMPTED, machine.SUCCESS])
    assert got == (expected, "succeeded")
