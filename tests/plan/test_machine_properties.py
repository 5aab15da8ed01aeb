"""Random verdict histories through the retry machine and `durapipe run`'s engine.

The engine (``Runner._attempts``) is driven with attempts whose verdicts come from the
history (``ScriptedRunner``: the loop, the waits and the records are the real ones), and the
sequence of (rung, GPU type, attempt number, outcome) it records must be the one the
executor-neutral rules below (the table of docs/local.md, written as counters) give, and the
one the machine gives when stepped by hand.  A broken transition in the machine makes the
engine (which steps it) disagree with the reference.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durapipe.compiler.plan import StagePlan, plan_pipeline
from durapipe.dsl.model import OnOom, Retry
from durapipe.plan import machine
from durapipe.runner.engine import Runner, RunOptions
from durapipe.runner.records import AttemptRecord
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
                 outputs: dict[str, str]) -> AttemptRecord:
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
