"""The stage plan: every decision about how a stage runs, made once, for both executors.

``plan_pipeline`` turns the validated model into frozen, typed decisions (the order of the
stages and, per stage, its variants, its tasks and their conditions, its budgets, its pod's
shape and the inputs its references name).  Two executors read the same plan:

- the Argo lowering (``argo_stage``, ``argo_pod``, ``argo_jobset``, ``argo_workflow``) writes
  it as Argo objects;
- ``durapipe run`` (``durapipe/runner``) runs it as local processes.

Nothing here knows Argo's field names or expression syntax, and nothing here reports
diagnostics: the plan of an invalid model is still well-formed, and each executor says what it
cannot carry out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from durapipe.compiler import memo, naming
from durapipe.dsl import units
from durapipe.dsl.model import (
    ConfigMapKey,
    GpuChoice,
    Interp,
    Pipeline,
    Ref,
    Secret,
    Stage,
    Text,
)
from durapipe.plan.graph import Because, Edge, TaskClass, explore
from durapipe.plan.rules import (
    DEFAULT_BACKOFF_CAP,
    Backoff,
    Rules,
    backoff_of,
    gpu_types,
    memory_rungs,
)
from durapipe.runtime import contract

__all__ = ["DEFAULT_BACKOFF_CAP", "Backoff", "Because", "backoff_of", "memory_rungs"]

#: Seconds the runtime keeps for itself out of the pod's grace period (verdict, last upload).
GRACE_MARGIN = 15
#: The runtime's own directory in every pod (its volume holds the zipapp, inputs, outputs).
RUNTIME_ROOT = "/var/run/durapipe"
#: JSON ``{input name: local path}`` of a stage's declared inputs (compiler-side extension of
#: the runtime contract; the runtime may read it, user code usually does).
ENV_INPUTS = "DURAPIPE_INPUTS"

StageKind = Literal["pod", "grid", "jobset"]


# -- order ------------------------------------------------------------------------------------


def topo_order(pipeline: Pipeline) -> tuple[list[int], list[int]]:
    """Stage indexes in dependency order, and the stages left over by a cycle.

    Kahn's algorithm one wave at a time: each wave holds the stages whose last upstream is in
    the wave before, in declaration order, so the order is that of scanning for ready stages
    pass after pass, in time linear in stages and edges.
    """
    stages = pipeline.stages
    index = {s.name: i for i, s in enumerate(stages)}
    indegree = [0] * len(stages)
    dependents: list[list[int]] = [[] for _ in stages]
    for i, s in enumerate(stages):
        for u in {index[u] for u in s.upstream() if u in index and u != s.name}:
            indegree[i] += 1
            dependents[u].append(i)
    order: list[int] = []
    wave = [i for i, n in enumerate(indegree) if n == 0]
    while wave:
        order.extend(wave)
        following: list[int] = []
        for i in wave:
            for d in dependents[i]:
                indegree[d] -= 1
                if indegree[d] == 0:
                    following.append(d)
        wave = sorted(following)
    placed = set(order)
    return order, [i for i in range(len(stages)) if i not in placed]


# -- budgets ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryBudgets:
    """The stage's retry budgets, each one count for the whole stage: ``preemptions`` across
    its application attempts, rungs and GPU types (each task retries what is left of it),
    ``attempts`` across rungs and types."""

    attempts: int
    preemptions: int
    backoff: Backoff | None
    gpu_oom: Literal["fail", "retry"]


# -- variants and tasks -----------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One way to run a stage: a memory rung and (with fallback) one GPU type."""

    name: str
    rung: int
    #: Index of the GPU type in the fallback order (0 without fallback).
    type_index: int
    memory: int | None
    #: The type to select nodes by, when exactly one applies (fallback, or a single type).
    gpu: GpuChoice | None
    gpu_count: int | None
    #: Seconds to wait for capacity before the next type (``None``: wait for ever).
    pending_timeout: int | None
    oom_from: str | None = None
    fallback_from: str | None = None

    @property
    def gpu_type(self) -> str:
        return self.gpu.type if self.gpu is not None else ""


@dataclass(frozen=True)
class Pred:
    """A task runs after ``task`` when it ended the way ``because`` names."""

    task: str
    because: Because


@dataclass(frozen=True)
class TaskPlan:
    """One task of a stage: a variant run, retrying preemptions while the stage's budget
    lasts."""

    name: str
    variant: Variant
    #: The first attempt on a GPU type that may give way to the next (no retries).
    probe: bool
    #: The preemptions the stage spent before this task, where the plan knows them: none
    #: before a first task or after a probe's OOM kill or application failure, one before a
    #: waiting type's retry task (its probe's preemption).  ``None``: as many as the
    #: predecessor that ran reports (the count passes from task to task).
    preempted: int | None
    #: The stage's preemption budget (``retry.preemptions``), shared by all its tasks.
    budget: int
    #: The application failures and OOM climbs before this task: its first attempt's
    #: ``DURAPIPE_ATTEMPT`` less the preemptions spent before it, so the attempt numbers of a
    #: stage run 0, 1, 2, ... along whichever path it takes through the grid.
    first_attempt: int
    #: Whether this task's last retry is the stage's last possible attempt (on-demand).
    last: bool
    preds: tuple[Pred, ...]
    #: The application attempt (failures so far) this task runs.
    app_attempt: int

    @property
    def limit(self) -> int | None:
        """The preemptions this task may retry: what is left of the budget, ``None`` where
        that is only known when the task starts (``preempted`` is ``None``)."""
        if self.probe:
            return 0
        if self.preempted is None:
            return None
        return self.budget - self.preempted

    @property
    def retried(self) -> bool:
        """Whether the task has a retry strategy (its pods see Argo's ``retries``)."""
        return self.limit is None or self.limit > 0

    @property
    def counted(self) -> bool:
        """Whether the task takes part in the stage-wide count: it retries preemptions, or a
        successor reads how many it spent."""
        return not self.probe and self.budget > 0


@dataclass(frozen=True)
class PodShape:
    """What every pod of the stage has, whichever variant it runs."""

    #: Seconds between SIGTERM and SIGKILL (checkpointing stages only).
    grace_seconds: int | None
    #: A checkpoint directory outside the runtime's own volume, mounted on its own.
    checkpoint_mount: str | None
    shm: int | None
    #: The upload sidecar (checkpointing stages).
    sidecar: bool


@dataclass(frozen=True)
class StagePlan:
    stage: Stage
    #: Position in the model (diagnostics point there).
    index: int
    #: Template and DAG task name.
    task: str
    kind: StageKind
    rungs: tuple[int | None, ...]
    has_ladder: bool
    variants: tuple[Variant, ...]
    tasks: tuple[TaskPlan, ...]
    budgets: RetryBudgets
    pod: PodShape
    #: Pipeline params the stage reads.
    params: frozenset[str]
    #: (upstream stage, output) pairs the stage reads, in first-use order.
    upstream: tuple[tuple[str, str], ...]
    cached: bool
    #: Its checkpoint line is found by its inputs (``checkpoint { scope = "inputs" }``): its
    #: templates need the upstream content hashes even without a cache.
    inputs_keyed_line: bool
    #: The retry rules its executors step (``durapipe.plan.machine``).
    rules: Rules


@dataclass(frozen=True)
class PipelinePlan:
    pipeline: Pipeline
    #: Stage plans in dependency order.
    stages: tuple[StagePlan, ...]
    #: Stages on a dependency cycle (not ordered).
    cycle: tuple[int, ...]


def _fixed_gpu(stage: Stage, choice: GpuChoice | None) -> tuple[GpuChoice | None, int | None]:
    gpu = stage.resources.gpu
    if gpu is None:
        return None, None
    if choice is not None:
        return choice, choice.count
    if len(gpu.types) == 1:
        return gpu.types[0], gpu.types[0].count
    if gpu.types:
        return None, gpu.types[0].count
    return None, gpu.count


def plan_variants(stage: Stage, base: str) -> tuple[Variant, ...]:
    """Rung-major, type-minor: each OOM rung x GPU type, named after what differs."""
    rungs = memory_rungs(stage)
    types, wait = gpu_types(stage)
    multi_rung, multi_type = len(rungs) > 1, len(types) > 1

    def name(r: int, t: int) -> str:
        if not (multi_rung or multi_type):
            return base
        parts = [base]
        choice = types[t]
        if multi_type and choice is not None:
            parts.append(naming.slug(choice.type))
        if multi_rung:
            parts.append("mem-" + naming.memory_slug(units.format_bytes(rungs[r] or 0)))
        return "-".join(parts)

    variants: list[Variant] = []
    for r, memory in enumerate(rungs):
        for t, choice in enumerate(types):
            gpu, count = _fixed_gpu(stage, choice)
            variants.append(Variant(
                name=name(r, t), rung=r, type_index=t, memory=memory, gpu=gpu, gpu_count=count,
                pending_timeout=wait if (multi_type and t + 1 < len(types)) else None,
                oom_from=name(r - 1, t) if r > 0 else None,
                fallback_from=name(r, t - 1) if t > 0 else None,
            ))
    return tuple(variants)


def retry_task_name(variant: str) -> str:
    return f"{variant}-retry"


def _task_name(variant: Variant, task: TaskClass, rules: Rules) -> str:
    if task.probe:
        return variant.name
    if rules.attempts == 0:
        return retry_task_name(variant.name) if variant.pending_timeout is not None \
            else variant.name
    return f"{variant.name}-app-{task.failures}"


def _preempted_before(rules: Rules, preds: Sequence[Edge]) -> int | None:
    """The preemptions spent before a task, where every predecessor is a probe (which
    retries nothing: one if the probe was preempted, else none); ``None`` where one is a
    task that retries, which reports its own count."""
    if rules.preemptions == 0 or not preds:
        return 0
    counts = {int(e.because == "preempted") if e.source.probe else None for e in preds}
    return counts.pop() if len(counts) == 1 else None


def plan_tasks(stage: Stage, variants: Sequence[Variant]) -> tuple[TaskPlan, ...]:
    """The tasks of a stage: one per class of states the retry machine reaches
    (``durapipe.plan.graph``), linked by its transitions.

    Each task retries preemptions only, as many as the stage's budget has left (the count of
    those spent passes from task to task); every other transition of the machine starts
    another task: an application failure the next application attempt's, an OOM kill the
    same attempt's one rung up, a pending timeout the next GPU type's (docs/lowering.md,
    "Retries").  A stage with no application budget and one variant is a single task.
    """
    rules = Rules.of(stage)
    graph = explore(rules)
    variant_of = {(v.rung, v.type_index): v for v in variants}
    names = {c: _task_name(variant_of[(c.rung, c.gpu_type)], c, rules) for c in graph.classes}
    tasks: list[TaskPlan] = []
    for c in graph.classes:
        into = graph.into(c)
        tasks.append(TaskPlan(
            name=names[c], variant=variant_of[(c.rung, c.gpu_type)], probe=c.probe,
            preempted=0 if c.probe else _preempted_before(rules, into),
            budget=rules.preemptions, first_attempt=c.rung + c.failures, last=c.last(rules),
            preds=tuple(Pred(names[e.source], e.because) for e in into),
            app_attempt=c.failures))
    return tuple(tasks)


# -- inputs, shape, the whole stage -----------------------------------------------------------


def _refs_in(value: object) -> list[Ref]:
    if isinstance(value, Ref):
        return [value]
    if isinstance(value, Interp):
        return [p for p in value.parts if isinstance(p, Ref)]
    return []


def stage_reads(pipeline: Pipeline,
                stage: Stage) -> tuple[frozenset[str], tuple[tuple[str, str], ...]]:
    """The params and the (stage, output) pairs the stage's references name, the latter in
    first-use order (args, command, env and inputs by name); a reference to a stage that does
    not exist (P0301, reported by the front end) reads nothing."""
    values: list[object] = [*stage.args, *(stage.command or ())]
    values += [stage.env[name] for name in sorted(stage.env)]
    if stage.distributed is None:
        values += [stage.inputs[name] for name in sorted(stage.inputs)]
    params: set[str] = set()
    upstream: dict[tuple[str, str], None] = {}
    for value in values:
        for ref in _refs_in(value):
            if ref.is_param:
                params.add(ref.path[1])
            elif ref.is_output and ref.path[0] in pipeline.stage_names:
                upstream.setdefault((ref.path[0], ref.path[2]), None)
    return frozenset(params), tuple(upstream)


def checkpoint_mount(stage: Stage) -> str | None:
    """The checkpoint directory when it lies outside the runtime's volume (it needs its own)."""
    if stage.checkpoint is None:
        return None
    path = stage.checkpoint.path.rstrip("/")
    if path == RUNTIME_ROOT or path.startswith(RUNTIME_ROOT + "/"):
        return None
    return path


def pod_shape(stage: Stage, checkpoint_grace_seconds: int) -> PodShape:
    checkpointing = stage.checkpoint is not None
    return PodShape(
        grace_seconds=checkpoint_grace_seconds if checkpointing else None,
        checkpoint_mount=checkpoint_mount(stage),
        shm=stage.resources.shm,
        sidecar=checkpointing,
    )


def plan_stage(pipeline: Pipeline, index: int, *, checkpoint_grace_seconds: int) -> StagePlan:
    stage = pipeline.stages[index]
    task = naming.task_name(stage.name)
    rule = stage.retry
    rungs = memory_rungs(stage)
    params, upstream = stage_reads(pipeline, stage)
    if stage.distributed is not None:
        variants: tuple[Variant, ...] = plan_variants(_first_rung_only(stage), task)[:1]
        tasks: tuple[TaskPlan, ...] = ()
        kind: StageKind = "jobset"
    else:
        variants = plan_variants(stage, task)
        tasks = plan_tasks(stage, variants)
        kind = "pod" if len(tasks) == 1 else "grid"
    return StagePlan(
        stage=stage, index=index, task=task, kind=kind, rungs=rungs,
        has_ladder=len(rungs) > 1, variants=variants, tasks=tasks,
        budgets=RetryBudgets(rule.attempts, rule.preemptions, backoff_of(rule), rule.gpu_oom),
        pod=pod_shape(stage, checkpoint_grace_seconds), params=params, upstream=upstream,
        cached=stage.cache is not None,
        inputs_keyed_line=stage.checkpoint is not None and stage.checkpoint.scope == "inputs",
        rules=Rules.of(stage),
    )


def _first_rung_only(stage: Stage) -> Stage:
    """A multi-node stage runs one variant: the first rung, the first GPU type."""
    from dataclasses import replace

    gpu = stage.resources.gpu
    if gpu is not None:
        gpu = replace(gpu, fallback_after=None, types=gpu.types[:1])
    retry = replace(stage.retry, on_oom=None)
    return replace(stage, retry=retry, resources=replace(
        stage.resources, memory=memory_rungs(stage)[0], gpu=gpu))


def plan_pipeline(pipeline: Pipeline, *, checkpoint_grace_seconds: int) -> PipelinePlan:
    order, cycle = topo_order(pipeline)
    stages = tuple(
        plan_stage(pipeline, i, checkpoint_grace_seconds=checkpoint_grace_seconds)
        for i in order + cycle
    )
    return PipelinePlan(pipeline, stages, tuple(cycle))


# -- the contract environment -----------------------------------------------------------------


@dataclass(frozen=True)
class Site:
    """Where an attempt runs: the values of the contract that depend on the executor.

    The cluster's come from Argo (``{{workflow.name}}``, the pod's paths); the local runner's
    from its run directory.  Everything else comes from the plan, the same for both.
    """

    run_id: str
    attempt: str
    #: Output name -> where the command writes it.
    outputs: Mapping[str, str]
    output_hash_dir: str
    termination_log: str
    #: Declared input name -> where the upstream output is found.
    inputs: Mapping[str, str]
    store_uri: str | None
    checkpoint_uri: str
    checkpoint_path: str
    grace_seconds: str | None
    #: The checkpoint upload sidecar (the cluster) rather than the runtime's own thread.
    upload_sidecar: bool
    #: Where the runtime reports what the first restore found (``contract.ENV_RESUME_REPORT``).
    resume_report: str = ""
    #: Earlier runs' lines to restore from (``contract.ENV_CHECKPOINT_RESUME_FROM``).
    resume_from: str = ""


def pipeline_lines_root(root: str, pipeline: str) -> str:
    """The prefix under which every checkpoint line of ``pipeline`` lives (and its cache
    entries, which the collector tells apart)."""
    return f"{root.rstrip('/')}/{pipeline}"


def checkpoint_line(root: str, pipeline: str, stage: str, scope: str, *, run: str,
                    inputs_key: str) -> str:
    """Where a stage's checkpoints live: by the stage's inputs (its cache key), by run or by
    pipeline, and stage; never by attempt, so retries, rungs and fallback types all resume
    from the same line, and with ``inputs`` so does a later run of the same inputs."""
    base = pipeline_lines_root(root, pipeline)
    if scope == "inputs":
        return f"{base}/inputs/{stage}/{inputs_key}/checkpoints"
    if scope == "pipeline":
        return f"{base}/stages/{stage}/checkpoints"
    return f"{base}/runs/{run}/{stage}/checkpoints"


def grace_for_runtime(grace_seconds: int | None) -> str | None:
    """The runtime's share of the pod's grace period."""
    if grace_seconds is None:
        return None
    return str(max(1, grace_seconds - GRACE_MARGIN))


def contract_env(pipeline: Pipeline, plan: StagePlan, variant: Variant,
                 site: Site) -> list[tuple[str, str]]:
    """The contract environment of an attempt (``durapipe/runtime/contract.py``), in the order
    the pod spec lists it; the user's own variables are kept apart (``user_env``)."""
    stage = plan.stage
    env = [
        (contract.ENV_PIPELINE, pipeline.name),
        (contract.ENV_STAGE, stage.name),
        (contract.ENV_RUN_ID, site.run_id),
        (contract.ENV_ATTEMPT, site.attempt),
        (contract.ENV_RUNG, str(variant.rung)),
        (contract.ENV_GPU_TYPE, variant.gpu_type),
        (contract.ENV_MEMORY_LIMIT, str(variant.memory or "")),
        (contract.ENV_TERMINATION_LOG, site.termination_log),
        (contract.ENV_GPU_OOM_POLICY, plan.budgets.gpu_oom),
    ]
    if site.store_uri:
        env.append((contract.ENV_STORE_URI, site.store_uri))
    if site.outputs:
        outputs = {k: site.outputs[k] for k in sorted(site.outputs)}
        env.append((contract.ENV_OUTPUTS, json.dumps(outputs, separators=(",", ":"))))
        env.append((contract.ENV_OUTPUT_HASH_DIR, site.output_hash_dir))
    if site.inputs:
        inputs = {k: site.inputs[k] for k in sorted(site.inputs)}
        env.append((ENV_INPUTS, json.dumps(inputs, separators=(",", ":"))))
    ckpt = stage.checkpoint
    if ckpt is not None:
        env.append((contract.ENV_CHECKPOINT_URI, site.checkpoint_uri))
        env.append((contract.ENV_CHECKPOINT_PATH, site.checkpoint_path))
        env.append((contract.ENV_CHECKPOINT_KEEP, str(ckpt.keep)))
        if site.resume_report:
            env.append((contract.ENV_RESUME_REPORT, site.resume_report))
        if site.resume_from:
            env.append((contract.ENV_CHECKPOINT_RESUME_FROM, site.resume_from))
        if site.upload_sidecar:
            env.append((contract.ENV_SPOOL_DIR, contract.DEFAULT_SPOOL_DIR))
            env.append((contract.ENV_UPLOADER, "sidecar"))
    if site.grace_seconds is not None:
        env.append((contract.ENV_GRACE_SECONDS, site.grace_seconds))
    return env


# -- values and the cache key -----------------------------------------------------------------


def kubelet_literal(text: str) -> str:
    """``text`` escaped so that the kubelet's ``$(VAR)`` expansion gives it back unchanged.

    The kubelet expands ``command``, ``args`` and ``env[].value`` with
    ``k8s.io/kubernetes/third_party/forked/golang/expansion.Expand``: ``$$`` becomes ``$``,
    ``$(NAME)`` becomes NAME's value when the container defines NAME (and stays as written
    otherwise), and any other ``$`` is kept.  So a ``$`` must be doubled exactly when the next
    character is ``$`` or ``(``; doubling every ``$`` would also be exact, but would rewrite
    every shell ``$HOME`` in the output for nothing.  (Argo's own ``{{...}}`` never holds a
    ``$``, so references are not affected; P0404 keeps ``{{`` out of user text.)
    """
    if "$" not in text:
        return text
    out: list[str] = []
    for index, char in enumerate(text):
        out.append(char)
        if char == "$" and index + 1 < len(text) and text[index + 1] in "$(":
            out.append("$")
    return "".join(out)


def param_value(value: object) -> str:
    """A param's value as text: what Argo substitutes and what the local runner passes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def symbolic(value: Text) -> str:
    """Text with references left as ``${...}``: the compile-time cache-key form."""
    if isinstance(value, (str, Interp)):
        return str(value)
    return "${" + str(value) + "}"


def symbolic_argv(stage: Stage) -> list[str]:
    if stage.command is not None:
        return [symbolic(c) for c in stage.command] + [symbolic(a) for a in stage.args]
    return ["sh", "-c", stage.script or ""] + [symbolic(a) for a in stage.args]


def _cache_env(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for name in sorted(stage.env):
        value = stage.env[name]
        if isinstance(value, Secret):
            source = "configmap" if isinstance(value, ConfigMapKey) else "secret"
            env[name] = f"{source}:{value.name}/{value.key}"
        else:
            env[name] = symbolic(value)
    return env


def cache_static(stage: Stage) -> str:
    """The compile-time half of the stage's cache key (``memo``), shared by both executors."""
    return memo.static_digest(
        image=stage.image, command=symbolic_argv(stage), env=_cache_env(stage),
        salt=stage.cache.version if stage.cache is not None else "",
    )


def cache_parts(stage: Stage) -> dict[str, str]:
    """What :func:`cache_static` is made of, part by part (``memo.static_components``): the
    record of a key's components that explains a later miss."""
    return memo.static_components(
        image=stage.image, command=symbolic_argv(stage), env=_cache_env(stage),
        salt=stage.cache.version if stage.cache is not None else "",
    )
