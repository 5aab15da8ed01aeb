"""The bound is proven, not estimated (issue 24, item 3).

Random adversarial fates (an OOM at each rung, preemptions in each form, queue waits,
timeouts, programs that take their whole grace to exit after SIGTERM) are played to a stage,
and what the run took must stay within ``durapipe bound``'s worst case:

- through ``durapipe run``'s engine (fast tier): the real retry loop, its real backoff waits
  (each wait the engine asks for is counted in full), attempts that last what the fate says;
- through Argo v4.1.2's controller (tools/argo-sim, harness tier): the compiled stage, the
  simulated kubelet honouring ``activeDeadlineSeconds`` and the pod's
  ``terminationGracePeriodSeconds``, the controller's own ``pendingTimeout`` and backoff.

The adversary that takes the worst branch at every step (``bound.worst_verdicts``), each
attempt to the last second of its timeout and its grace, each wait to just before it gives
way, reaches the bound within one harness tick: the bound is tight, not padded.  A bound with
one term dropped (the grace, or the backoff) fails the same check.

The bound counts what the pipeline declares; the time between one pod's end and the next
one's start (the controller's and the kubelet's reaction, one simulated second per event in
the harness, an image pull on a cluster) is not declared anywhere, so each pod is allowed
``REACTION`` seconds of it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from durapipe.compiler import CompileOptions, compile_pipeline
from durapipe.compiler.plan import StagePlan
from durapipe.dsl.model import Checkpoint, Gpu, GpuChoice, OnOom, Resources, Retry, Stage
from durapipe.plan import bound, machine
from durapipe.plan.bound import stage_bound, worst_verdicts
from durapipe.plan.grace import grace_seconds
from durapipe.plan.rules import Rules
from durapipe.runner.engine import Runner, RunOptions
from durapipe.runner.records import AttemptRecord, StageRecord
from durapipe.runtime import contract
from tests.compiler.models import GI, pipeline, stage

TIMEOUT = 600
#: Seconds of the controller's and kubelet's reaction allowed per pod (see the module's text).
REACTION = 2.0
#: The harness lets simulated time pass in ticks of at most this (tools/argo-sim).
TICK = 30.0
#: How long before its ``fallback_after`` the adversary's pod is scheduled: the controller's
#: ``pendingTimeout`` and the kubelet's scheduling must not race within one simulated second.
SCHEDULED_BEFORE = 10.0
H100_A100 = Gpu(count=8, types=(GpuChoice(type="H100", count=8), GpuChoice(type="A100", count=8)),
                fallback_after=300)

retries = st.builds(
    Retry, attempts=st.integers(0, 2), preemptions=st.integers(0, 2),
    backoff=st.sampled_from([None, 60, 120]), gpu_oom=st.sampled_from(["fail", "retry"]),
    on_oom=st.sampled_from([None, OnOom(memory=(GI, 2 * GI))]))


def a_stage(retry: Retry, fallback: bool, checkpointing: bool) -> Stage:
    return stage(retry=retry, timeout=TIMEOUT, checkpoint=Checkpoint() if checkpointing else None,
                 resources=Resources(gpu=H100_A100 if fallback else None))


@dataclass(frozen=True)
class Fate:
    """How one attempt ends, and how long each part of it takes (seconds)."""

    verdict: str
    #: Unschedulable this long first (a waiting GPU type); ``None``: for ever.
    pending: float | None
    #: Running, until the fate strikes (a timeout: until the kubelet stops it).
    running: float
    #: After the kubelet's SIGTERM: the program's final save (capped by the grace).
    term: float
    #: How a preemption reaches the pod (``sigterm``, ``node-shutdown``, ``pod-deleted``).
    form: str = "sigterm"

    def harness_outcome(self) -> dict[str, Any]:
        minutes = self.running / 60
        outcome: dict[str, Any]
        if self.verdict == machine.PENDING_TIMEOUT:
            return {"outcome": "pending"}
        if self.verdict == machine.SUCCESS:
            outcome = {"outcome": "succeeded", "minutes": minutes}
        elif self.verdict == machine.PREEMPTED:
            forms: dict[str, dict[str, Any]] = {
                "sigterm": {"outcome": "disrupted", "termMinutes": self.term / 60,
                            "message": contract.verdict_marker(machine.PREEMPTED)},
                "node-shutdown": {"outcome": "shutdown"},
                "pod-deleted": {"outcome": "deleted"}}
            outcome = {**forms[self.form], "minutes": minutes}
        elif self.verdict == machine.HOST_OOM:
            outcome = {"outcome": "oomkilled", "minutes": minutes}
        elif self.verdict == machine.TIMEOUT:
            # Runs past its activeDeadlineSeconds: the kubelet stops it.
            outcome = {"outcome": "succeeded", "minutes": 2 * TIMEOUT / 60,
                       "termMinutes": self.term / 60,
                       "termMessage": contract.verdict_marker(machine.PREEMPTED)}
        else:
            code = contract.EXIT_GPU_OOM if self.verdict == machine.GPU_OOM \
                else contract.EXIT_APP_FAILURE
            outcome = {"outcome": "failed", "exitCode": code, "minutes": minutes,
                       "message": contract.verdict_marker(self.verdict)}
        if self.pending:
            return {"outcome": "pending", "minutes": self.pending / 60, "then": outcome}
        return outcome

    def local_seconds(self) -> float:
        """What the attempt lasts under ``durapipe run`` (no queue on one machine)."""
        if self.verdict == machine.TIMEOUT:
            return TIMEOUT + self.term
        return self.running + (self.term if self.verdict == machine.PREEMPTED else 0.0)


def drawn_fates(rules: Rules, grace: float, data: st.DataObject, *,
                local: bool = False) -> list[Fate]:
    """A random history the machine allows, each attempt's durations drawn adversarially."""
    fates: list[Fate] = []
    action: machine.Action
    action, state = machine.begin(rules)
    while isinstance(action, machine.Run):
        choices = [v for v in machine.possible(state)
                   if not (local and v == machine.PENDING_TIMEOUT)]
        verdict = data.draw(st.sampled_from(choices), label="verdict")
        running = data.draw(st.sampled_from([0.25, 0.5, 1.0]), label="share") * TIMEOUT
        running = min(running, TIMEOUT - 1)
        term = data.draw(st.sampled_from([0.0, 0.5, 1.0, 2.0]), label="grace") * grace
        pending: float | None = 0.0
        if state.probe and not local:
            pending = None if verdict == machine.PENDING_TIMEOUT else data.draw(
                st.sampled_from([0.0, float(rules.pending_timeout or 0) - SCHEDULED_BEFORE]),
                label="pending")
        form = "sigterm"
        if verdict == machine.PREEMPTED and not local:
            # A probe's pod deleted after it ran reads as capacity never found (see
            # test_a_probe_lost_after_it_ran_retries_the_same_type): not drawn there.
            forms = ["sigterm", "node-shutdown"] if state.probe else \
                ["sigterm", "node-shutdown", "pod-deleted"]
            form = data.draw(st.sampled_from(forms), label="form")
        fates.append(Fate(verdict, pending, running, min(term, grace), form))
        action, state = machine.step(state, verdict)
    return fates


def adversary(s: Stage, worst: bound.Figure = "max_wall") -> list[Fate]:
    """The worst branch at every step, every part of every attempt as long as it can be."""
    verdicts = worst_verdicts(s, worst)
    assert verdicts is not None
    rules = Rules.of(s)
    grace = float(grace_seconds(s.checkpoint is not None))
    fates: list[Fate] = []
    _, state = machine.begin(rules)
    for verdict in verdicts:
        pending = 0.0
        if state.probe:
            pending = float(rules.pending_timeout or 0) - SCHEDULED_BEFORE
        fates.append(Fate(verdict, None if verdict == machine.PENDING_TIMEOUT else pending,
                          TIMEOUT - 1, grace))
        _, state = machine.step(state, verdict)
    return fates


# -- durapipe run: the engine's loop and its real waits ----------------------------------------

class _CountedStop(threading.Event):
    """The engine's stop event; each backoff it waits on is counted (in full: the wait the
    engine asks for is the time that passes) and not slept, so an example takes no minutes."""

    def __init__(self) -> None:
        super().__init__()
        self.waited: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waited.append(float(timeout or 0.0))
        return self.is_set()


class FatedRunner(Runner):
    """The real engine; each attempt ends with the next fate and lasts what it says."""

    fates: list[Fate]

    def _attempt(self, plan: StagePlan, run: machine.Run, stage_dir: Path,
                 outputs: dict[str, str], record: StageRecord) -> AttemptRecord:
        fate = self.fates.pop(0)
        return AttemptRecord(number=run.attempt, rung=run.rung, memory="", verdict=fate.verdict,
                             exit_code=0, seconds=fate.local_seconds(), message="",
                             resumed_from="", log="", fault="", tail="")


def run_locally(tmp_path: Path, s: Stage, fates: list[Fate]) -> tuple[float, float, int]:
    """Wall seconds, GPU-seconds and attempts of ``durapipe run``'s engine under ``fates``."""
    runner = FatedRunner(pipeline(s), str(tmp_path / "p.pipe"),
                         RunOptions(home=tmp_path / ".durapipe"))
    stop = _CountedStop()
    runner._stop = stop
    runner.fates = list(fates)
    record = runner.run().stages["train"]
    assert not runner.fates, "the engine stopped before the machine did"
    gpus = s.resources.gpu.count if s.resources.gpu is not None else 0
    ran = sum(a.seconds for a in record.attempts)
    return ran + sum(stop.waited), ran * gpus, len(record.attempts)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(retry=retries, checkpointing=st.booleans(), data=st.data())
def test_durapipe_run_stays_within_the_bound(tmp_path: Path, retry: Retry, checkpointing: bool,
                                             data: st.DataObject) -> None:
    s = a_stage(retry, fallback=False, checkpointing=checkpointing)
    worst = stage_bound(s).worst
    assert worst is not None
    fates = drawn_fates(Rules.of(s), float(grace_seconds(checkpointing)), data, local=True)
    wall, gpu_seconds, attempts = run_locally(tmp_path, s, fates)
    assert wall <= worst.wall_seconds
    assert gpu_seconds <= worst.gpu_hours * 3600
    assert attempts <= worst.attempts


@pytest.mark.parametrize("checkpointing", [False, True])
def test_durapipe_run_reaches_the_bound_under_the_adversary(tmp_path: Path,
                                                            checkpointing: bool) -> None:
    s = a_stage(Retry(attempts=2, preemptions=1, backoff=60, on_oom=OnOom(memory=(GI, 2 * GI))),
                fallback=False, checkpointing=checkpointing)
    worst = stage_bound(s).worst
    assert worst is not None
    wall, _, attempts = run_locally(tmp_path, s, adversary(s))
    # Each attempt ends one second before its timeout: within a second per attempt.
    assert worst.wall_seconds - attempts <= wall <= worst.wall_seconds
    assert attempts == worst.attempts


# -- Argo's controller ---------------------------------------------------------------------------

@dataclass(frozen=True)
class OnArgo:
    wall: float
    gpu_seconds: float
    pods: int
    phase: str


def run_on_argo(s: Stage, fates: list[Fate]) -> OnArgo:
    """The stage compiled and run in Argo's controller, the n-th pod meeting the n-th fate."""
    from tests.argo.argo_tools import run_scenario

    result = compile_pipeline(pipeline(s), CompileOptions())
    assert result.ok
    (doc,) = result.documents
    doc["metadata"] = {"name": "bound"}
    # The pod that reports an exhausted OOM ladder is no attempt; it exits at once.
    exhausted = {"outcome": "failed", "exitCode": 1, "minutes": 0,
                 "message": "durapipe: stage train ran out of memory"}
    report = run_scenario({"name": "bound", "workflow": doc, "expect": {}, "runs": [
        {"attempts": {"*": [f.harness_outcome() for f in fates],
                      "train-oom-exhausted": [exhausted]}}]})
    assert not report.get("error"), report.get("error")
    (run,) = report["runs"]
    attempts = [a for a in run["attempts"] if a["key"] != "train-oom-exhausted"]
    assert len(attempts) == len(fates), "Argo ran another history than the machine's"
    gpu_seconds = 0.0
    for attempt, fate in zip(attempts, fates):
        if fate.pending is None:
            continue  # never scheduled: deleted by the controller's pendingTimeout
        gpus = int(attempt["pod"].get("limits", {}).get("nvidia.com/gpu", "0"))
        held = (attempt["finishedMinute"] - attempt["startedMinute"]) * 60 - fate.pending
        gpu_seconds += held * gpus
    return OnArgo(run["simMinutes"] * 60, gpu_seconds, len(run["attempts"]), run["phase"])


def assert_within(found: OnArgo, worst: bound.Figures, gpus: int) -> None:
    assert found.wall <= worst.wall_seconds + REACTION * found.pods, found
    assert found.gpu_seconds <= worst.gpu_hours * 3600 + REACTION * found.pods * gpus, found


@pytest.mark.harness
@pytest.mark.slow
# Each example is a run of Argo's controller (a second or two): the failing history is reported
# as drawn rather than shrunk.
@settings(max_examples=50, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(retry=retries, fallback=st.booleans(), checkpointing=st.booleans(), data=st.data())
def test_argos_controller_stays_within_the_bound(retry: Retry, fallback: bool,
                                                 checkpointing: bool,
                                                 data: st.DataObject) -> None:
    s = a_stage(retry, fallback, checkpointing)
    worst = stage_bound(s).worst
    assert worst is not None
    fates = drawn_fates(Rules.of(s), float(grace_seconds(checkpointing)), data)
    assert_within(run_on_argo(s, fates), worst, 8 if fallback else 0)


ADVERSARIAL = {
    "ladder-backoff-fallback": a_stage(
        Retry(attempts=2, preemptions=1, backoff=60, on_oom=OnOom(memory=(GI, 2 * GI))),
        fallback=True, checkpointing=False),
    "checkpointing-preemptions": a_stage(Retry(attempts=1, preemptions=2, backoff=120),
                                         fallback=True, checkpointing=True),
}


@pytest.mark.harness
@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_the_adversary_reaches_the_bound_on_argo_within_one_tick(name: str) -> None:
    s = ADVERSARIAL[name]
    for figure in ("max_wall", "max_gpu_hours"):
        worst = stage_bound(s).worst
        assert worst is not None
        found = run_on_argo(s, adversary(s, figure))
        assert_within(found, worst, 8)
        if figure == "max_wall":
            assert worst.wall_seconds - TICK < found.wall, found
        else:
            assert worst.gpu_hours * 3600 - TICK * 8 < found.gpu_seconds, found


@pytest.mark.harness
def test_a_bound_with_a_term_dropped_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shown once: drop the grace from the bound, or the backoff, and the adversary's run on
    Argo exceeds it."""
    s = ADVERSARIAL["ladder-backoff-fallback"]
    found = run_on_argo(s, adversary(s))
    honest = stage_bound(s).worst
    assert honest is not None
    assert_within(found, honest, 8)

    def without_grace(self: Any, verdict: str) -> float:
        return 0.0 if verdict == machine.PENDING_TIMEOUT else self.timeout

    with monkeypatch.context() as patched:
        patched.setattr(bound._Weights, "ran", without_grace)
        graceless = stage_bound(s).worst
    assert graceless is not None and graceless.wall_seconds < honest.wall_seconds
    with pytest.raises(AssertionError):
        assert_within(found, graceless, 8)

    def without_backoff(self: Any, state: machine.State, verdict: str,
                        nxt: machine.Run | None) -> float:
        wait = float(self.rules.pending_timeout or 0) if state.probe else 0.0
        return wait + float(self.ran(verdict))

    with monkeypatch.context() as patched:
        patched.setattr(bound._Weights, "wall", without_backoff)
        backoffless = stage_bound(s).worst
    assert backoffless is not None and backoffless.wall_seconds < honest.wall_seconds
    with pytest.raises(AssertionError):
        assert_within(found, backoffless, 8)
