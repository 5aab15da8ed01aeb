"""The worst case of a pipeline before it runs: wall time, GPU-hours, node-hours and cost.

A stage's worst case is the longest path through its retry state machine (``machine.step``):
from the first attempt, every verdict ``machine.possible`` allows, until the machine says
``Done`` or ``Fail``.  The budgets are the machine's own, so the bound cannot disagree with
what an executor does.  Each step is priced at its worst:

- an attempt that ran lasts its ``timeout`` (a preemption or an OOM kill just before it ends,
  so the attempt's work is lost: durapipe declares no checkpoint interval to bound the loss);
  one that the kubelet stopped with SIGTERM (a preemption, the ``timeout`` itself) then holds
  its node for the pod's whole grace period (``grace.grace_seconds``: the final save);
- an attempt on a GPU type that may give way waits ``fallback_after`` for capacity first,
  and a pending timeout waits exactly that and uses nothing;
- the backoff before an application retry is the machine's wait (``Rules.backoff``, capped);
- memory is the rung the attempt runs at, GPUs the count of its GPU type.

Each figure (wall, GPU-hours, node-hours, cost) is maximised on its own: the path that
costs most need not be the one that takes longest, and each is an upper bound.  Queueing for
the last GPU type (or a CPU node) is not bounded by anything the pipeline declares, and a
pod's ``timeout`` counts from its start, so the wall figures are from scheduling on.

The best case beside it: the first attempt succeeds on the first type at the first rung and
runs to its ``timeout``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from durapipe.dsl import catalog
from durapipe.dsl.model import Pipeline, Stage
from durapipe.plan.grace import CHECKPOINT_GRACE_SECONDS, grace_seconds
from durapipe.plan.machine import (
    PENDING_TIMEOUT,
    PREEMPTED,
    TIMEOUT,
    Fail,
    Run,
    State,
    begin,
    possible,
    step,
)
from durapipe.plan.rules import Rules, gpu_types

#: The node-hours of a stage that requests no GPU are counted under this name.
CPU_NODE = "cpu"
#: A GPU request that names no type (or several, without a fallback order) is priced as
#: the most expensive type it could get.
ANY_GPU = "GPU"
_GIB = 1024 ** 3


@dataclass(frozen=True)
class Prices:
    """US dollars per GPU-hour by type, per vCPU-hour and per GiB-hour of memory."""

    gpu: Mapping[str, float]
    cpu_hour: float
    memory_gib_hour: float

    @classmethod
    def default(cls) -> Prices:
        return cls({name: p.usd_per_hour for name, p in catalog.GPU_PRICES.items()},
                   catalog.CPU_PRICE.usd_per_hour, catalog.MEMORY_PRICE.usd_per_hour)

    @classmethod
    def of(cls, pipeline: Pipeline) -> Prices:
        """The catalog's defaults with the pipeline's own ``prices`` over them."""
        table = pipeline.prices
        if table is None:
            return cls.default()
        return cls.default().overridden(table.gpu, table.cpu_hour, table.memory_gib_hour)

    def overridden(self, gpu: Mapping[str, float] | None = None, cpu_hour: float | None = None,
                   memory_gib_hour: float | None = None) -> Prices:
        return Prices({**self.gpu, **(gpu or {})},
                      self.cpu_hour if cpu_hour is None else cpu_hour,
                      self.memory_gib_hour if memory_gib_hour is None else memory_gib_hour)

    def of_gpu(self, names: tuple[str, ...]) -> float | None:
        """The price of the dearest of ``names`` (all known types when empty); ``None`` when
        one of them has no price."""
        candidates = names or tuple(self.gpu)
        if any(n not in self.gpu for n in candidates):
            return None
        return max((self.gpu[n] for n in candidates), default=0.0)


@dataclass(frozen=True)
class Figures:
    """One case of a stage (or the pipeline): seconds and hours, dollars."""

    wall_seconds: float
    gpu_hours: float
    node_hours: float
    cost: float
    #: GPU-hours and node-hours by GPU type (``cpu`` for a stage without GPUs).
    gpu_hours_by_type: dict[str, float] = field(default_factory=dict)
    node_hours_by_type: dict[str, float] = field(default_factory=dict)
    #: Attempts along the longest path (each run or pending timeout counts one).
    attempts: int = 0


Figure = Literal["max_wall", "max_gpu_hours", "max_cost"]


Unbounded = Literal["no_timeout", "restarts_without_budget", "unpriced_gpu"]


@dataclass(frozen=True)
class StageBound:
    stage: str
    #: ``None`` where the worst case has no bound (``unbounded`` says why).
    worst: Figures | None
    best: Figures | None
    unbounded: Unbounded | None = None
    #: The GPU type without a price (``unpriced_gpu``).
    detail: str = ""


@dataclass(frozen=True)
class PipelineBound:
    stages: tuple[StageBound, ...]
    #: Worst case of the pipeline: wall time along the critical path (the chain of stages
    #: whose worst wall times sum highest), every other figure summed over all stages.
    worst: Figures | None
    best: Figures | None
    #: Stage names along the worst case's critical path, first to last.
    critical_path: tuple[str, ...]


@dataclass(frozen=True)
class _Attempt:
    """What one attempt of a state uses, per second it runs."""

    type_key: str
    nodes: int
    gpus_per_node: int
    cost_per_second: float


def _variant(stage: Stage, rules: Rules, state: State, prices: Prices) -> _Attempt | str:
    """The resources of an attempt in ``state``, or the GPU type that has no price."""
    nodes = stage.distributed.replicas if stage.distributed is not None else 1
    choices, _ = gpu_types(stage)
    choice = choices[state.gpu_type] if state.gpu_type < len(choices) else None
    gpu = stage.resources.gpu
    if choice is not None:
        names: tuple[str, ...] = (choice.type,)
        count = choice.count
    elif gpu is not None:
        names = tuple(dict.fromkeys(t.type for t in gpu.types))
        count = max((t.count for t in gpu.types), default=gpu.count)
    else:
        names, count = (), 0
    gpu_price = 0.0
    if gpu is not None:
        found = prices.of_gpu(names)
        if found is None:
            return next(n for n in names if n not in prices.gpu)
        gpu_price = found
    memory = rules.rungs[state.rung] or 0
    cores = (stage.resources.cpu or 0) / 1000
    per_node_hour = gpu_price * count + cores * prices.cpu_hour + \
        memory / _GIB * prices.memory_gib_hour
    key = CPU_NODE if gpu is None else ("/".join(names) if names else ANY_GPU)
    return _Attempt(key, nodes, count, nodes * per_node_hour / 3600)


#: One step out of a state: the verdict, the machine's next ``Run`` (``None``: the stage
#: ends), and the state that run is in.
_Move = tuple[str, Run | None, State]


@dataclass(frozen=True)
class _Explored:
    """Every state the machine reaches, latest first (each transition raises the attempt
    number or the GPU type, so a state comes after all its successors), with its moves:
    stepped once, whatever number of figures is then maximised over them."""

    states: list[State]
    moves: Mapping[State, tuple[_Move, ...]]


def _explore(rules: Rules) -> _Explored:
    _, first = begin(rules)
    moves: dict[State, tuple[_Move, ...]] = {}
    queue = deque([first])
    while queue:
        state = queue.popleft()
        if state in moves:
            continue
        out: list[_Move] = []
        for verdict in possible(state):
            action, nxt = step(state, verdict)
            run = action if isinstance(action, Run) else None
            out.append((verdict, run, nxt))
            if run is not None and nxt not in moves:
                queue.append(nxt)
        moves[state] = tuple(out)
    states = sorted(moves, key=lambda s: (s.attempt, s.gpu_type), reverse=True)
    return _Explored(states, moves)


#: What one step of the path adds: the state, the verdict its attempt ended with, and the
#: machine's answer.  Returns the figure's increment.
_Weight = Callable[[State, str, Run | None], float]


def _values(explored: _Explored, weight: _Weight) -> dict[State, float]:
    """The longest path's ``weight`` from each state to the end."""
    value: dict[State, float] = {}
    for state in explored.states:
        best = 0.0
        for verdict, run, nxt in explored.moves[state]:
            gained = weight(state, verdict, run)
            if run is not None:
                gained += value[nxt]
            best = max(best, gained)
        value[state] = best
    return value


def _longest(explored: _Explored, weight: _Weight) -> float:
    return _values(explored, weight)[explored.states[-1]]


#: Verdicts of an attempt the kubelet stopped with SIGTERM, which then runs on for its grace.
_SIGNALLED = frozenset({PREEMPTED, TIMEOUT})


@dataclass(frozen=True)
class _Weights:
    """What each step of a stage's machine adds to each figure (the bound's prices)."""

    rules: Rules
    explored: _Explored
    attempts: Mapping[State, _Attempt]
    #: Seconds a pod runs on after SIGTERM (its ``terminationGracePeriodSeconds``).
    grace: float

    @property
    def timeout(self) -> float:
        return float(self.rules.timeout or 0)

    def ran(self, verdict: str) -> float:
        """Seconds an attempt that ended with ``verdict`` held its node, at most."""
        if verdict == PENDING_TIMEOUT:
            return 0.0
        return self.timeout + (self.grace if verdict in _SIGNALLED else 0.0)

    def wall(self, state: State, verdict: str, nxt: Run | None) -> float:
        wait = float(self.rules.pending_timeout or 0) if state.probe else 0.0
        return wait + self.ran(verdict) + (nxt.backoff if nxt is not None else 0.0)

    def gpu_seconds(self, key: str | None = None) -> _Weight:
        def weight(state: State, verdict: str, _: Run | None) -> float:
            a = self.attempts[state]
            return self.ran(verdict) * a.nodes * a.gpus_per_node \
                if key in (None, a.type_key) else 0.0
        return weight

    def node_seconds(self, key: str | None = None) -> _Weight:
        def weight(state: State, verdict: str, _: Run | None) -> float:
            a = self.attempts[state]
            return self.ran(verdict) * a.nodes if key in (None, a.type_key) else 0.0
        return weight

    def cost(self, state: State, verdict: str, _: Run | None) -> float:
        return self.ran(verdict) * self.attempts[state].cost_per_second

    @staticmethod
    def count(state: State, verdict: str, _: Run | None) -> float:
        return 1.0

    def of(self, figure: Figure) -> _Weight:
        return {"max_wall": self.wall, "max_gpu_hours": self.gpu_seconds(),
                "max_cost": self.cost}[figure]


def _weights(stage: Stage, prices: Prices, checkpoint_grace_seconds: int) \
        -> _Weights | StageBound:
    """The weights of ``stage``'s steps, or the bound that says why it has none."""
    rules = Rules.of(stage)
    if rules.timeout is None:
        return StageBound(stage.name, None, None, "no_timeout")
    if rules.max_restarts is not None and rules.restart_on_maintenance:
        # The machine restarts a preempted group without spending a budget: no count of
        # preemptions, so no bound.
        return StageBound(stage.name, None, None, "restarts_without_budget")
    explored = _explore(rules)
    attempts: dict[State, _Attempt] = {}
    for state in explored.states:
        found = _variant(stage, rules, state, prices)
        if isinstance(found, str):
            return StageBound(stage.name, None, None, "unpriced_gpu", found)
        attempts[state] = found
    return _Weights(rules, explored, attempts,
                    float(grace_seconds(stage.checkpoint is not None, checkpoint_grace_seconds)))


def stage_bound(stage: Stage, prices: Prices | None = None,
                checkpoint_grace_seconds: int = CHECKPOINT_GRACE_SECONDS) -> StageBound:
    """The worst and best case of one stage (its pods compiled with
    ``checkpoint_grace_seconds``)."""
    w = _weights(stage, prices or Prices.default(), checkpoint_grace_seconds)
    if isinstance(w, StageBound):
        return w
    explored, timeout = w.explored, w.timeout
    keys = sorted({a.type_key for a in w.attempts.values()})
    gpu_keys = [k for k in keys if k != CPU_NODE]
    worst = Figures(
        wall_seconds=_longest(explored, w.wall),
        gpu_hours=_longest(explored, w.gpu_seconds()) / 3600,
        node_hours=_longest(explored, w.node_seconds()) / 3600,
        cost=_longest(explored, w.cost),
        gpu_hours_by_type={k: _longest(explored, w.gpu_seconds(k)) / 3600 for k in gpu_keys},
        node_hours_by_type={k: _longest(explored, w.node_seconds(k)) / 3600 for k in keys},
        attempts=int(_longest(explored, w.count)),
    )
    first = w.attempts[explored.states[-1]]
    best = Figures(
        wall_seconds=timeout,
        gpu_hours=timeout * first.nodes * first.gpus_per_node / 3600,
        node_hours=timeout * first.nodes / 3600,
        cost=timeout * first.cost_per_second,
        gpu_hours_by_type=({first.type_key: timeout * first.nodes * first.gpus_per_node / 3600}
                           if first.type_key != CPU_NODE else {}),
        node_hours_by_type={first.type_key: timeout * first.nodes / 3600},
        attempts=1,
    )
    return StageBound(stage.name, worst, best)


def worst_verdicts(stage: Stage, figure: Figure = "max_wall", prices: Prices | None = None,
                   checkpoint_grace_seconds: int = CHECKPOINT_GRACE_SECONDS) \
        -> tuple[str, ...] | None:
    """The verdicts of a history that reaches ``figure``'s worst case (each attempt's, first
    to last), ``None`` where the stage has no bound: the adversary the property tests play
    to show that the bound is reached, not padded."""
    w = _weights(stage, prices or Prices.default(), checkpoint_grace_seconds)
    if isinstance(w, StageBound):
        return None
    weight = w.of(figure)
    value = _values(w.explored, weight)
    state, verdicts = w.explored.states[-1], []
    while True:
        def gain(move: _Move, at: State = state) -> float:
            verdict, run, nxt = move
            return weight(at, verdict, run) + (value[nxt] if run is not None else 0.0)
        # The first of equals: a stable history.
        verdict, run, state = max(w.explored.moves[state], key=gain)
        verdicts.append(verdict)
        if run is None:
            return tuple(verdicts)


def _sum(figures: list[Figures], wall: float) -> Figures:
    def merged(pick: Callable[[Figures], dict[str, float]]) -> dict[str, float]:
        out: dict[str, float] = {}
        for f in figures:
            for key, hours in pick(f).items():
                out[key] = out.get(key, 0.0) + hours
        return dict(sorted(out.items()))
    return Figures(wall, sum(f.gpu_hours for f in figures), sum(f.node_hours for f in figures),
                   sum(f.cost for f in figures), merged(lambda f: f.gpu_hours_by_type),
                   merged(lambda f: f.node_hours_by_type), sum(f.attempts for f in figures))


def _critical(pipeline: Pipeline, wall: Mapping[str, float]) -> tuple[float, tuple[str, ...]]:
    """The chain of stages (by ``upstream``) with the highest sum of ``wall``."""
    finish: dict[str, tuple[float, tuple[str, ...]]] = {}
    by_name = {s.name: s for s in pipeline.stages}

    def of(name: str) -> tuple[float, tuple[str, ...]]:
        if name not in finish:
            before = max((of(u) for u in by_name[name].upstream() if u in by_name),
                         default=(0.0, ()), key=lambda found: found[0])
            finish[name] = (before[0] + wall[name], (*before[1], name))
        return finish[name]

    return max((of(s.name) for s in pipeline.stages), default=(0.0, ()),
               key=lambda found: found[0])


def pipeline_bound(pipeline: Pipeline, prices: Prices | None = None) -> PipelineBound:
    """Every stage's bound, and the pipeline's, at ``prices`` (the pipeline's own, over the
    defaults, when not given): ``worst``/``best`` are ``None`` when a stage is unbounded."""
    prices = prices or Prices.of(pipeline)
    stages = tuple(stage_bound(s, prices) for s in pipeline.stages)
    if any(b.worst is None or b.best is None for b in stages):
        return PipelineBound(stages, None, None, ())
    worst = [b.worst for b in stages if b.worst is not None]
    best = [b.best for b in stages if b.best is not None]
    wall, path = _critical(pipeline, {b.stage: b.worst.wall_seconds for b in stages
                                      if b.worst is not None})
    best_wall, _ = _critical(pipeline, {b.stage: b.best.wall_seconds for b in stages
                                        if b.best is not None})
    return PipelineBound(stages, _sum(worst, wall), _sum(best, best_wall), path)


#: Why a stage has no bound, and how to give it one (the diagnostics' words).
UNBOUNDED_CODES: dict[Unbounded, str] = {
    "no_timeout": "P0350",
    "restarts_without_budget": "P0351",
    "unpriced_gpu": "P0352",
}


def parse_prices(data: object, base: Prices) -> Prices | str:
    """``base`` with the overrides of a price file's JSON (``{"gpu": {"H100": 4.1},
    "cpu_hour": 0.04, "memory_gib_hour": 0.005}``, every key optional), or what is wrong
    with it."""
    if not isinstance(data, dict):
        return "a price file holds one JSON object"
    unknown = sorted(set(data) - {"gpu", "cpu_hour", "memory_gib_hour"})
    if unknown:
        return f"unknown key `{unknown[0]}` (expected `gpu`, `cpu_hour`, `memory_gib_hour`)"

    def price(value: object, what: str) -> float | str:
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 \
                or value != value or value == float("inf"):
            return f"{what} must be a finite number of US dollars per hour, >= 0"
        return float(value)

    gpu: dict[str, float] = {}
    table = data.get("gpu", {})
    if not isinstance(table, dict):
        return "`gpu` maps GPU type names to US dollars per GPU-hour"
    for name, value in table.items():
        found = price(value, f"`gpu.{name}`")
        if isinstance(found, str):
            return found
        gpu[str(name)] = found
    units_: dict[str, float] = {}
    for key in ("cpu_hour", "memory_gib_hour"):
        if key in data:
            found = price(data[key], f"`{key}`")
            if isinstance(found, str):
                return found
            units_[key] = found
    return base.overridden(gpu, units_.get("cpu_hour"), units_.get("memory_gib_hour"))


def figure_of(figures: Figures, limit: Figure) -> float:
    """The figure a limit caps, in the limit's unit (seconds, GPU-hours, dollars)."""
    return {"max_wall": figures.wall_seconds, "max_gpu_hours": figures.gpu_hours,
            "max_cost": figures.cost}[limit]


def _without(stage: Stage, budget: str) -> Stage | None:
    """``stage`` with one retry budget taken away, or ``None`` where it has none to take."""
    retry, dist = stage.retry, stage.distributed
    if budget == "retry.attempts" and retry.attempts:
        return replace(stage, retry=replace(retry, attempts=0))
    if budget == "retry.preemptions" and retry.preemptions and dist is None:
        return replace(stage, retry=replace(retry, preemptions=0))
    if budget == "retry.on_oom" and retry.on_oom is not None and len(retry.on_oom.memory) > 1:
        top = retry.on_oom.memory[-1]
        return replace(stage, retry=replace(retry, on_oom=None),
                       resources=replace(stage.resources, memory=top))
    if budget == "distributed.max_restarts" and dist is not None and dist.max_restarts:
        return replace(stage, distributed=replace(dist, max_restarts=0))
    return None


#: The budgets a stage's worst case multiplies, in the order a tie names them.
BUDGETS = ("retry.preemptions", "retry.attempts", "retry.on_oom", "distributed.max_restarts")


def dominant_budget(stage: Stage, limit: Figure, prices: Prices | None = None) \
        -> tuple[str, float]:
    """The budget whose removal lowers ``limit``'s figure of ``stage`` most, and by how much;
    ``("timeout", ...)`` when no budget adds anything (every attempt runs to it)."""
    base = stage_bound(stage, prices).worst
    if base is None:
        return "timeout", 0.0
    best, saved = "timeout", 0.0
    for budget in BUDGETS:
        lighter = _without(stage, budget)
        found = stage_bound(lighter, prices).worst if lighter is not None else None
        if found is not None and figure_of(base, limit) - figure_of(found, limit) > saved:
            best, saved = budget, figure_of(base, limit) - figure_of(found, limit)
    return best, saved
