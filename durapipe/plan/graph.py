"""The states a stage can reach, grouped into the classes an executor unrolls.

A class is what the Argo lowering makes one task of: a rung, a GPU type, the application
failures so far, and whether it is a probe (a waiting type's first attempt, which may give
way).  Preemptions stay inside a class: a task retries them itself (its ``retryStrategy``).
Every other transition of the machine moves to another class, and is one edge here (one
condition of the task grid).

``explore`` steps the machine from its first state through every verdict ``possible`` in
each state.  It keeps one state per class: the machine's transitions other than a preemption
read nothing of a state that its class does not fix (``tests/plan`` checks this against the
full enumeration), so one representative finds every edge.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

from durapipe.plan.machine import Run, State, begin, possible, step
from durapipe.plan.rules import Rules

#: Why a class follows another: an OOM climb (the next rung), a pending timeout (the next
#: GPU type), a probe's preemption (the type's retrying task), an application failure.
Because = Literal["oom", "fallback", "preempted", "app_failure"]
#: The order a class lists the edges into it: arrival on the type, the rung below, the
#: application attempt before (a retrying task's before a probe's).
_RANK: dict[Because, int] = {"preempted": 0, "fallback": 0, "oom": 1, "app_failure": 2}


@dataclass(frozen=True)
class TaskClass:
    rung: int
    gpu_type: int
    failures: int
    probe: bool

    @classmethod
    def of(cls, state: State) -> TaskClass:
        return cls(state.rung, state.gpu_type, state.failures, state.probe)

    @property
    def order(self) -> tuple[int, int, bool, int]:
        """Rung-major, type-minor; a type's probe first, then its application attempts."""
        return (self.rung, self.gpu_type, not self.probe, self.failures)

    def last(self, rules: Rules) -> bool:
        """Whether the class holds the stage's last possible attempt (``State.on_demand``)."""
        return self.failures == rules.attempts and (not self.probe or rules.preemptions == 0)


@dataclass(frozen=True)
class Edge:
    source: TaskClass
    target: TaskClass
    because: Because


@dataclass(frozen=True)
class StateGraph:
    rules: Rules
    #: Reachable classes in grid order (``TaskClass.order``).
    classes: tuple[TaskClass, ...]
    edges: tuple[Edge, ...]

    def into(self, target: TaskClass) -> tuple[Edge, ...]:
        found = [e for e in self.edges if e.target == target]
        return tuple(sorted(found, key=lambda e: (_RANK[e.because], e.source.probe)))


def because(before: State, after: State) -> Because:
    """What a transition between two classes changed."""
    if after.rung != before.rung:
        return "oom"
    if after.gpu_type != before.gpu_type:
        return "fallback"
    if after.failures != before.failures:
        return "app_failure"
    return "preempted"


def explore(rules: Rules) -> StateGraph:
    """Every class the machine reaches from its first attempt, and the edges between them."""
    _, first = begin(rules)
    seen = {TaskClass.of(first): first}
    queue = deque([first])
    edges: dict[Edge, None] = {}
    while queue:
        state = queue.popleft()
        source = TaskClass.of(state)
        for verdict in possible(state):
            action, nxt = step(state, verdict)
            target = TaskClass.of(nxt)
            if not isinstance(action, Run) or target == source:
                continue  # the stage ends, or the task retries (a preemption)
            edges.setdefault(Edge(source, target, because(state, nxt)), None)
            if target not in seen:
                seen[target] = nxt
                queue.append(nxt)
    classes = tuple(sorted(seen, key=lambda c: c.order))
    return StateGraph(rules, classes, tuple(edges))
