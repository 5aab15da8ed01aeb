"""The retry rules of a stage as one state machine: ``step(state, verdict) -> (action, state)``.

Every executor runs a stage by stepping this machine.  ``durapipe run`` steps it after each
attempt's verdict; the Argo lowering enumerates the states it can reach (``graph``) and writes
each as a task of the stage's DAG, each transition between them as a condition.  The rules:

- **success** ends the stage;
- **preempted** (the runtime's SIGTERM verdict, a pod deletion) retries the same rung and GPU
  type at once while ``retry.preemptions`` lasts: one count for the whole stage;
- **timeout** (an attempt ran past the stage's ``timeout``) is a preemption too: Argo stops
  the pod at its ``activeDeadlineSeconds`` (the kubelet, with SIGTERM), the runtime exits
  143, and the compiled retry expression retries exit 143 from the preemption budget;
- **host OOM** climbs the OOM ladder (same application attempt, next memory size) without
  spending either budget; at the last rung the stage fails; without a ladder it is an
  application failure;
- **GPU OOM** fails the stage (``gpu_oom = "fail"``) or is an application failure;
- **application failure** starts the next application attempt after the backoff while
  ``retry.attempts`` lasts;
- **pending timeout** (only on a GPU type that may give way: the first attempt there, before
  it ever ran) moves to the next GPU type;
- a **multi-node** stage restarts as a whole on any failure while ``distributed.max_restarts``
  lasts, as its JobSet does; with ``restart_on_maintenance`` a preemption restarts it without
  spending that budget.

``DURAPIPE_ATTEMPT`` is the attempts made before: OOM climbs, application failures,
preemptions and restarts; a fallback to the next GPU type, whose pod never ran, counts none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Final

from durapipe.dsl import units
from durapipe.plan.rules import Rules
from durapipe.runtime import contract

SUCCESS: Final = contract.VERDICT_SUCCESS
PREEMPTED: Final = contract.VERDICT_PREEMPTED
HOST_OOM: Final = contract.VERDICT_HOST_OOM
GPU_OOM: Final = contract.VERDICT_GPU_OOM
APP_FAILURE: Final = contract.VERDICT_APP_FAILURE
#: The pod of a GPU type that may give way waited ``fallback_after`` without being scheduled.
PENDING_TIMEOUT: Final = "pending_timeout"
#: The attempt ran past the stage's ``timeout``.
TIMEOUT: Final = "timeout"
VERDICTS: Final = (SUCCESS, PREEMPTED, HOST_OOM, GPU_OOM, APP_FAILURE, PENDING_TIMEOUT, TIMEOUT)


@dataclass(frozen=True)
class State:
    """Where a stage is: what its attempts so far have spent."""

    rules: Rules = field(compare=False, repr=False)
    rung: int = 0
    #: Index of the GPU type in the fallback order.
    gpu_type: int = 0
    failures: int = 0
    #: Preemptions (and timeouts) of the whole stage; for a multi-node stage, the restarts
    #: that do not count (host maintenance, preemption).
    preemptions: int = 0
    #: Multi-node: restarts spent from ``distributed.max_restarts``.
    restarts: int = 0
    #: Seconds of backoff waited so far.
    waited: float = 0.0

    @property
    def attempt(self) -> int:
        """``DURAPIPE_ATTEMPT`` of the attempt this state runs."""
        return self.rung + self.failures + self.preemptions + self.restarts

    @property
    def probe(self) -> bool:
        """The first attempt on a GPU type that may give way: nothing has run there yet but
        OOM kills, so a pending timeout may still move on to the next type."""
        return self.rules.waits(self.gpu_type) and self.failures == 0 and \
            self.preemptions == 0

    @property
    def on_demand(self) -> bool:
        """The stage's last possible attempt, which ``last_attempt_on_demand`` moves off spot."""
        r = self.rules
        return r.on_demand_last and r.max_restarts is None and \
            self.failures == r.attempts and self.preemptions == r.preemptions


@dataclass(frozen=True)
class Run:
    """Run an attempt: this rung and GPU type, numbered ``attempt``, after ``backoff``."""

    rung: int
    gpu_type: int
    attempt: int
    backoff: float
    probe: bool
    on_demand: bool
    #: Why (the verdict before it, and what it spent), as the runner prints it.
    reason: str


@dataclass(frozen=True)
class Done:
    reason: str = "succeeded"


@dataclass(frozen=True)
class Fail:
    reason: str


Action = Run | Done | Fail


def _run(state: State, reason: str, backoff: float = 0.0) -> tuple[Action, State]:
    return Run(state.rung, state.gpu_type, state.attempt, backoff, state.probe,
               state.on_demand, reason), state


def begin(rules: Rules) -> tuple[Run, State]:
    """The stage's first attempt."""
    action, state = _run(State(rules), "first attempt")
    assert isinstance(action, Run)
    return action, state


def possible(state: State) -> tuple[str, ...]:
    """The verdicts an attempt in ``state`` can end with."""
    out = [SUCCESS, PREEMPTED, HOST_OOM, GPU_OOM, APP_FAILURE]
    if state.probe:
        out.append(PENDING_TIMEOUT)
    if state.rules.timeout is not None:
        out.append(TIMEOUT)
    return tuple(out)


def _preempted(state: State, what: str, times: bool = True) -> tuple[Action, State]:
    limit = state.rules.preemptions
    if state.preemptions < limit:
        nxt = replace(state, preemptions=state.preemptions + 1)
        return _run(nxt, f"{what}; retry {nxt.preemptions}/{limit} of the preemption budget")
    count = f" {state.preemptions + 1} times" if times else ""
    return Fail(f"{what}{count}; the preemption budget ({limit}) is spent"), state


def _timed_out(state: State) -> tuple[Action, State]:
    timeout = units.format_seconds(state.rules.timeout or 0)
    return _preempted(state, f"timed out after {timeout}", times=False)


def _app_failure(state: State, what: str) -> tuple[Action, State]:
    rules = state.rules
    if state.failures < rules.attempts:
        wait = rules.backoff.wait(state.failures + 1) if rules.backoff is not None else 0.0
        nxt = replace(state, failures=state.failures + 1, waited=state.waited + wait)
        return _run(nxt, f"{what}; retry {nxt.failures}/{rules.attempts}", wait)
    return Fail(f"{what}; the failure budget ({rules.attempts}) is spent"
                if rules.attempts else what), state


def _host_oom(state: State) -> tuple[Action, State]:
    rungs = state.rules.rungs
    if not state.rules.has_ladder:
        return _app_failure(state, "out of memory (no OOM ladder)")
    if state.rung + 1 < len(rungs):
        nxt = replace(state, rung=state.rung + 1)
        return _run(nxt, f"out of memory at {units.format_bytes(rungs[state.rung] or 0)}; "
                         f"next rung {units.format_bytes(rungs[nxt.rung] or 0)}")
    sizes = ", ".join(units.format_bytes(m or 0) for m in rungs)
    return Fail(f"out of memory at every size of the OOM ladder ({sizes})"), state


def _gpu_oom(state: State) -> tuple[Action, State]:
    if state.rules.gpu_oom == "fail":
        return Fail("CUDA out of memory (gpu_oom = \"fail\")"), state
    return _app_failure(state, "CUDA out of memory")


def _pending_timeout(state: State) -> tuple[Action, State]:
    rules = state.rules
    if not state.probe:
        raise ValueError(f"no pending timeout in {state}: only a waiting GPU type's first "
                         "attempt has one")
    nxt = replace(state, gpu_type=state.gpu_type + 1)
    return _run(nxt, f"no {rules.types[state.gpu_type]} capacity within "
                     f"{units.format_seconds(rules.pending_timeout or 0)}; "
                     f"falling back to {rules.types[nxt.gpu_type]}")


_SINGLE: dict[str, Callable[[State], tuple[Action, State]]] = {
    PREEMPTED: lambda s: _preempted(s, "preempted"),
    TIMEOUT: _timed_out,
    APP_FAILURE: lambda s: _app_failure(s, "failed"),
    HOST_OOM: _host_oom,
    GPU_OOM: _gpu_oom,
    PENDING_TIMEOUT: _pending_timeout,
}

#: A multi-node stage's failures, in words.
_WHAT = {PREEMPTED: "preempted", TIMEOUT: "timed out", APP_FAILURE: "failed",
         HOST_OOM: "out of memory", GPU_OOM: "CUDA out of memory"}


def _restart(state: State, verdict: str) -> tuple[Action, State]:
    """A multi-node stage: the JobSet restarts every node on any failure."""
    rules = state.rules
    limit = rules.max_restarts or 0
    if verdict == PREEMPTED and rules.restart_on_maintenance:
        nxt = replace(state, preemptions=state.preemptions + 1)
        return _run(nxt, "preempted; the group restarts (a preemption does not spend "
                         "distributed.max_restarts)")
    if verdict not in _WHAT:
        raise ValueError(f"a multi-node stage never ends with {verdict!r}")
    what = _WHAT[verdict]
    if state.restarts < limit:
        nxt = replace(state, restarts=state.restarts + 1)
        return _run(nxt, f"{what}; restart {nxt.restarts}/{limit} of distributed.max_restarts")
    return Fail(f"{what}; distributed.max_restarts ({limit}) is spent" if limit else what), state


def step(state: State, verdict: str) -> tuple[Action, State]:
    """What follows an attempt of ``state`` that ended with ``verdict``, and the state the
    next attempt (if any) runs in.  Pure: ``state`` is not changed."""
    if verdict == SUCCESS:
        return Done(), state
    if state.rules.max_restarts is not None:
        return _restart(state, verdict)
    if verdict not in _SINGLE:
        raise ValueError(f"unknown verdict {verdict!r}")
    return _SINGLE[verdict](state)
