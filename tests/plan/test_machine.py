"""The retry state machine as a pure function: separate budgets, the OOM ladder, backoff."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from durapipe.dsl.model import OnOom, Retry, Stage
from durapipe.plan import machine
from durapipe.plan.rules import Rules
from durapipe.runtime import contract as c

LADDER = Retry(attempts=1, preemptions=2, on_oom=OnOom(memory=(256 * 2**30, 512 * 2**30, 2**40)))


@dataclass
class Budget:
    """The machine's state between steps (a test's handle on it)."""

    state: machine.State | None = None
    history: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Decision:
    action: str
    rung: int
    reason: str
    backoff_seconds: float = 0.0


def decide(retry: Retry, budget: Budget, verdict: str) -> Decision:
    if budget.state is None:
        stage = Stage(name="s", image="x", command=("true",), retry=retry)
        _, budget.state = machine.begin(Rules.of(stage))
    action, budget.state = machine.step(budget.state, verdict)
    if isinstance(action, machine.Run):
        return Decision("retry", action.rung, action.reason, action.backoff)
    return Decision("done" if isinstance(action, machine.Done) else "fail",
                    budget.state.rung, action.reason)


def _run(retry: Retry, verdicts: list[str]) -> list[tuple[str, int]]:
    budget = Budget()
    out = []
    for verdict in verdicts:
        decision = decide(retry, budget, verdict)
        out.append((decision.action, decision.rung))
    return out


def _waits(retry: Retry, verdicts: list[str]) -> list[float]:
    budget = Budget()
    return [decide(retry, budget, v).backoff_seconds for v in verdicts]


def test_preemptions_do_not_spend_the_failure_budget() -> None:
    steps = _run(LADDER, [c.VERDICT_PREEMPTED, c.VERDICT_PREEMPTED, c.VERDICT_APP_FAILURE,
                          c.VERDICT_SUCCESS])
    assert steps == [("retry", 0), ("retry", 0), ("retry", 0), ("done", 0)]


def test_preemption_budget_runs_out() -> None:
    assert _run(LADDER, [c.VERDICT_PREEMPTED] * 3)[-1] == ("fail", 0)


def test_oom_climbs_the_ladder_without_spending_budgets() -> None:
    budget = Budget()
    for verdict in (c.VERDICT_HOST_OOM, c.VERDICT_HOST_OOM):
        decide(LADDER, budget, verdict)
    assert budget.state is not None
    assert (budget.state.rung, budget.state.failures, budget.state.preemptions) == (2, 0, 0)
    assert decide(LADDER, budget, c.VERDICT_SUCCESS).action == "done"


def test_non_oom_failure_does_not_climb() -> None:
    assert _run(LADDER, [c.VERDICT_APP_FAILURE, c.VERDICT_APP_FAILURE]) == \
        [("retry", 0), ("fail", 0)]


def test_oom_at_every_rung_fails_with_a_clear_message() -> None:
    budget = Budget()
    decisions = [decide(LADDER, budget, c.VERDICT_HOST_OOM) for _ in range(3)]
    assert [d.action for d in decisions] == ["retry", "retry", "fail"]
    assert decisions[-1].reason == \
        "out of memory at every size of the OOM ladder (256Gi, 512Gi, 1Ti)"


def test_gpu_oom_fails_at_once_by_default_and_spends_attempts_with_retry() -> None:
    assert _run(Retry(attempts=3), [c.VERDICT_GPU_OOM]) == [("fail", 0)]
    assert _run(Retry(attempts=1, gpu_oom="retry"), [c.VERDICT_GPU_OOM, c.VERDICT_GPU_OOM]) == \
        [("retry", 0), ("fail", 0)]


def test_oom_without_a_ladder_is_an_application_failure() -> None:
    assert _run(Retry(attempts=1), [c.VERDICT_HOST_OOM, c.VERDICT_HOST_OOM]) == \
        [("retry", 0), ("fail", 0)]


def test_backoff_grows_and_is_capped() -> None:
    retry = Retry(attempts=5, backoff=10, backoff_factor=3, max_backoff=60)
    assert _waits(retry, [c.VERDICT_APP_FAILURE] * 3) == [10.0, 30.0, 60.0]


def test_backoff_spaces_application_retries_only_and_is_capped_by_default() -> None:
    # As the compiled workflow: a wait task before each application retry; a preemption
    # retries at once and an OOM climbs at once (a leaf's backoff would delay both on Argo).
    retry = Retry(attempts=12, preemptions=3, backoff=30,
                  on_oom=OnOom(memory=(2**30, 2**31)))
    waits = _waits(retry, [c.VERDICT_PREEMPTED, c.VERDICT_HOST_OOM] + [c.VERDICT_APP_FAILURE] * 6
                   + [c.VERDICT_PREEMPTED])
    assert waits == [0.0, 0.0, 30.0, 60.0, 120.0, 240.0, 480.0, 600.0, 0.0]


def test_the_preemption_budget_is_one_for_the_stage_as_on_argo() -> None:
    # Application failures and OOM climbs start new tasks on Argo; the count carries over
    # (tests/compiler/test_argo_preemption_budget.py runs the same on the controller).
    retry = Retry(attempts=1, preemptions=1)
    assert _run(retry, [c.VERDICT_PREEMPTED, c.VERDICT_APP_FAILURE, c.VERDICT_PREEMPTED]) == \
        [("retry", 0), ("retry", 0), ("fail", 0)]
    assert _run(retry, [c.VERDICT_APP_FAILURE, c.VERDICT_PREEMPTED, c.VERDICT_SUCCESS]) == \
        [("retry", 0), ("retry", 0), ("done", 0)]
    ladder = Retry(preemptions=1, on_oom=OnOom(memory=(2**30, 2**31)))
    assert _run(ladder, [c.VERDICT_PREEMPTED, c.VERDICT_HOST_OOM, c.VERDICT_PREEMPTED]) == \
        [("retry", 0), ("retry", 1), ("fail", 1)]


def test_a_ladder_of_one_size_is_no_ladder() -> None:
    # The compiled workflow has no rung to climb to: exit 137 is an application failure there.
    retry = Retry(attempts=1, on_oom=OnOom(memory=(2**30,)))
    assert _run(retry, [c.VERDICT_HOST_OOM, c.VERDICT_SUCCESS]) == [("retry", 0), ("done", 0)]


def test_the_multinode_example_restarts_max_restarts_times_locally_as_on_jobset(
        tmp_path: Path) -> None:
    # JobSet: failurePolicy.maxRestarts = distributed.max_restarts (2 in the example); a
    # preemption restarts without spending it (restart_on_maintenance, the default).
    from durapipe.dsl import load_path
    from durapipe.runner.engine import RunOptions
    from tests.plan.test_machine_properties import ScriptedRunner

    example = Path(__file__).resolve().parents[2] / "examples" / "multinode_pretrain.pipe"
    loaded = load_path(example)
    assert loaded.pipeline is not None
    runner = ScriptedRunner(loaded.pipeline, str(example),
                            RunOptions(home=tmp_path / ".durapipe"))
    runner.history = [c.VERDICT_APP_FAILURE, c.VERDICT_PREEMPTED, c.VERDICT_APP_FAILURE,
                      c.VERDICT_APP_FAILURE, c.VERDICT_SUCCESS]
    stage = runner.run().stages["pretrain"]
    assert [a.number for a in stage.attempts] == [0, 1, 2, 3]
    assert stage.status == "failed"
    assert stage.reason == "failed; distributed.max_restarts (2) is spent"
