"""One stage's plan as Argo templates, by a dispatch table on the stage's kind.

- ``pod``: one task, one leaf template (a container or script);
- ``grid``: a stage DAG over its tasks (application attempts x OOM rungs x GPU types), a leaf
  per task, a join, and with a ladder the "memory exhausted" task;
- ``jobset``: a resource template creating a JobSet (``argo_jobset``).

The tasks and the conditions between them are decided in the plan (``plan.plan_tasks``); the
expression text of those conditions comes from ``argo_retry``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from durapipe.compiler import argo_retry, naming
from durapipe.compiler.argo_jobset import lower_jobset
from durapipe.compiler.argo_pod import (
    OUTPUT_HASH_DIR,
    RESUME_REPORT,
    RESUMED_FROM_OUTPUT,
    cache_components_io,
    fill_main_container,
    gpu_label,
    gpu_product,
    hash_inputs_for,
    init_container,
    inputs_key_expression,
    LINE_KEY_FROM_TASK,
    LINE_KEY_PARAM,
    memoize,
    on_demand_on_last_retry,
    on_demand_outright,
    pod_env,
    pod_spec_patch,
    scheduling,
    stage_metadata,
    user_env,
    volumes,
    wrapped_command,
)
from durapipe.compiler.argo_text import (
    artifact_input_name,
    hash_param_name,
    input_path,
    render_ref,

)
from durapipe.compiler.context import CompileContext, Loc
from durapipe.compiler.plan import (
    RUNTIME_ROOT,
    Pred,
    StagePlan,
    TaskPlan,
    Variant,
    memory_rungs,
    plan_tasks,
    plan_variants,
)
from durapipe.dsl import units
from durapipe.dsl.model import Stage
from durapipe.runtime import contract

Json = dict[str, Any]


@dataclass
class LoweredStage:
    """A stage's templates and the interface its DAG task needs."""

    plan: StagePlan
    templates: list[Json]
    #: Input parameter names of the stage's template, by (upstream stage, output).
    hash_inputs: dict[tuple[str, str], str]
    #: Names of the pod-less templates it uses that every stage shares (``SHARED_TEMPLATES``):
    #: each document holds one copy of those its stages use.
    shared: frozenset[str] = frozenset()


# -- checks -----------------------------------------------------------------------------------


def check_gpu(ctx: CompileContext, plan: StagePlan) -> None:
    stage, loc = plan.stage, ("stages", plan.index, "resources", "gpu")
    gpu = stage.resources.gpu
    if gpu is not None and gpu.fallback_after is not None and len(gpu.types) > 1:
        if ctx.options.argo_version == "3.7":
            ctx.error(
                "P0401",
                "GPU fallback after a queue wait needs `pendingTimeout` (Argo 4.1)",
                (*loc, "fallback_after"),
                help="target `--argo-version 4.1`, or drop `fallback_after` to accept any "
                "listed type",
            )
    elif gpu is not None and len({t.count for t in gpu.types}) > 1:
        ctx.error(
            "P0406",
            f"stage `{stage.name}` lists GPU types with different counts but no "
            "`fallback_after`",
            loc,
            help="set `fallback_after` so each type runs as its own attempt",
        )


def check_texts(ctx: CompileContext, plan: StagePlan) -> None:
    """User text that reaches Argo fields of a pod stage, and the references of its inputs."""
    stage, loc = plan.stage, ("stages", plan.index)
    if stage.script is not None and stage.args:
        ctx.error("P0319", "`args` has no effect on a `script` stage", (*loc, "args"))
    for name, ref in sorted(stage.inputs.items()):
        render_ref(ctx, ref, (*loc, "inputs", name))


# -- leaf templates ---------------------------------------------------------------------------


def template_inputs(plan: StagePlan, hash_inputs: dict[tuple[str, str], str], *,
                    leaf: bool) -> Json:
    inputs: Json = {}
    if hash_inputs:
        inputs["parameters"] = [{"name": hash_inputs[k]} for k in sorted(hash_inputs)]
    if plan.upstream:
        arts: list[Json] = []
        for up_stage, output in sorted(plan.upstream):
            art: Json = {"name": artifact_input_name(up_stage, output)}
            if leaf:
                art["path"] = input_path(up_stage, output)
            arts.append(art)
        inputs["artifacts"] = arts
    return inputs


def leaf_outputs(plan: StagePlan) -> Json:
    """A pod's outputs: each declared output and its content hash, and with a checkpoint
    what its first restore found (for `durapipe status`: which line, which commit, which step)."""
    outputs = plan.stage.outputs
    names = sorted(outputs)
    params: list[Json] = [
        {"name": hash_param_name(n), "valueFrom": {
            "path": f"{OUTPUT_HASH_DIR}/{n}{contract.OUTPUT_HASH_SUFFIX}", "default": ""}}
        for n in names
    ]
    if plan.stage.checkpoint is not None:
        params.append({"name": RESUMED_FROM_OUTPUT,
                       "valueFrom": {"path": RESUME_REPORT, "default": ""}})
    out: Json = {}
    if params:
        out["parameters"] = params
    if names:
        out["artifacts"] = [{"name": n, "path": outputs[n]} for n in names]
    return out


def retry_strategy(limit: str) -> Json:
    """A leaf's ``retryStrategy``: preemptions only (application attempts are tasks), as many
    as ``limit`` (a number, or what is left of the stage's budget: ``argo_retry``).

    No ``backoff``: Argo (v4.1.2 ``processNodeRetries``) waits the backoff before it evaluates
    the retry expression, so a leaf with one would wait before every failure that leaves the
    task too (an OOM climb, a fatal CUDA OOM, the stage's last failure).  The wait of an
    application retry is a task of its own (``backoff_task``).
    """
    return {"limit": limit, "retryPolicy": "Always", "expression": argo_retry.preempted()}


#: Where a counted task's ``preempted`` output would be read from: nothing writes it, so the
#: wait container reports the output's default (``argo_retry.preempted_output``).
PREEMPTED_PATH = f"{RUNTIME_ROOT}/{argo_retry.PREEMPTED}"


@dataclass(frozen=True)
class Count:
    """How a leaf takes part in the stage's preemption count (``argo_retry``)."""

    #: Preemptions spent before the task, as the plan knows them; ``None``: the task's
    #: ``preempted-before`` input.
    before: int | None
    #: Whether the leaf retries preemptions (has a retryStrategy).
    retried: bool
    #: Whether it reports the count as its ``preempted`` output.
    reports: bool

    @classmethod
    def of(cls, plan: StagePlan, task: TaskPlan, shared: bool) -> Count:
        counted = plan.kind == "grid" and task.counted
        if counted and (shared or task.preempted is None):
            return cls(None, True, True)
        return cls(task.preempted or 0, task.retried, counted)

    def limit(self, task: TaskPlan) -> str | None:
        if self.before is None:
            return argo_retry.preemption_limit(task.budget)
        return str(task.limit) if self.retried else None

    def spent(self) -> str:
        return argo_retry.spent(before=self.before, retried=self.retried)


#: The input parameter of a pod template that several tasks share: their first attempt.
ATTEMPT_PARAM = "attempt"
#: And, where one template serves every rung of an OOM ladder, the rung and its memory.
RUNG_PARAMS = ("rung", "memory", "memory-bytes")
#: And, where it serves several GPU types, the type, its node label value (and its count).
GPU_PARAMS = ("gpu-type", "gpu-product")


@dataclass(frozen=True)
class Varying:
    """What differs between a stage's variants, so a shared pod takes it from the task."""

    rung: bool
    gpu: bool
    gpu_count: bool

    @classmethod
    def of(cls, plan: StagePlan, shared: bool) -> Varying:
        types = {v.type_index for v in plan.variants}
        counts = {v.gpu_count for v in plan.variants}
        return cls(shared and plan.has_ladder, shared and len(types) > 1,
                   shared and len(types) > 1 and len(counts) > 1)

    def params(self) -> list[str]:
        return [*(RUNG_PARAMS if self.rung else ()), *(GPU_PARAMS if self.gpu else ()),
                *(("gpu-count",) if self.gpu_count else ())]


def variant_arguments(ctx: CompileContext, plan: StagePlan, variant: Variant,
                      varying: Varying) -> list[Json]:
    values: dict[str, str] = {}
    if varying.rung:
        memory = variant.memory
        values.update({"rung": str(variant.rung), "memory": units.format_bytes(memory or 0),
                       "memory-bytes": str(memory or "")})
    if varying.gpu:
        product = gpu_product(ctx, variant.gpu_type, ("stages", plan.index, "resources", "gpu"))
        values.update({"gpu-type": variant.gpu_type, "gpu-product": product or ""})
    if varying.gpu_count:
        values["gpu-count"] = str(variant.gpu_count)
    return [{"name": name, "value": values[name]} for name in varying.params()]


def attempt_text(task: TaskPlan, count: Count, *, shared: bool = False) -> str:
    """``DURAPIPE_ATTEMPT``: the task's first attempt (in a pod template several tasks share,
    from the calling task), the preemptions spent before it and Argo's ``retries`` within it;
    the stage's attempts are numbered 0, 1, 2, ... whichever path it takes."""
    first = f"inputs.parameters.{ATTEMPT_PARAM}"
    fixed = 0 if shared else task.first_attempt + (count.before or 0)
    terms = [f"asInt({first})"] if shared else []
    if count.before is None:
        terms.append(argo_retry.spent(before=None, retried=False))
    if count.retried:
        terms.append("asInt(retries)")
    if fixed:
        terms.append(str(fixed))
    if terms == [f"asInt({first})"]:
        return "{{" + first + "}}"
    if terms == ["asInt(retries)"]:
        return "{{retries}}"
    if not terms:
        return str(fixed)
    return "{{=" + " + ".join(terms) + "}}"


def main_container(ctx: CompileContext, plan: StagePlan, task: TaskPlan, count: Count,
                   t: Json, *, shared: bool = False, varying: Varying | None = None,
                   line_key: str | None = None) -> None:
    """The leaf's main container (or script) and its upload sidecar, into ``t``.  What
    ``varying`` names comes from the task's inputs."""
    stage = plan.stage
    command, args = wrapped_command(ctx, plan)
    varying = varying or Varying(False, False, False)
    variant = task.variant
    if varying.rung:
        variant = replace(variant, memory=None)  # podSpecPatch sets it
    if varying.gpu_count:
        variant = replace(variant, gpu_count=None)
    env = pod_env(ctx, plan, variant, attempt_text(task, count, shared=shared),
                  line_key=line_key)
    from_task: dict[str, str] = {}
    if varying.rung:
        from_task[contract.ENV_RUNG] = "{{inputs.parameters.rung}}"
        from_task[contract.ENV_MEMORY_LIMIT] = "{{inputs.parameters.memory-bytes}}"
    if varying.gpu:
        from_task[contract.ENV_GPU_TYPE] = "{{inputs.parameters.gpu-type}}"
    env = [{**e, "value": from_task[e["name"]]} if e["name"] in from_task else e for e in env]
    main: Json = {"image": stage.image, "command": command}
    if stage.script is not None:
        main["source"] = stage.script
    elif args:
        main["args"] = args
    sidecar = fill_main_container(ctx, plan, variant, main, env + user_env(ctx, plan))
    t["script" if stage.script is not None else "container"] = main
    if sidecar is not None:
        t["sidecars"] = [sidecar]


def leaf(ctx: CompileContext, plan: StagePlan, task: TaskPlan,
         hash_inputs: dict[tuple[str, str], str], *, shared: bool = False,
         wrapped: bool = False) -> Json:
    """The template one task runs: a pod of one variant, with its preemption retries.  A
    ``shared`` one takes the task's first attempt as an input parameter, and on a ladder its
    rung and memory too.  A ``wrapped`` pod stage's leaf leaves its cache to the wrapper."""
    stage, single = plan.stage, plan.kind == "pod" and not wrapped
    varying = Varying.of(plan, shared)
    count = Count.of(plan, task, shared)
    limit = count.limit(task)
    t: Json = {"name": task.name}
    inputs = template_inputs(plan, hash_inputs if single else {}, leaf=True)
    names = [ATTEMPT_PARAM] if shared else []
    if count.before is None:
        names.append(argo_retry.PREEMPTED_BEFORE)
    if names:
        names += varying.params()
    # Only the stage's own template has the upstream hashes that name its checkpoint line.
    line_key = LINE_KEY_FROM_TASK if plan.inputs_keyed_line and not single else None
    if line_key is not None:
        names.append(LINE_KEY_PARAM)
    if names:
        inputs = {"parameters": [{"name": n} for n in names], **inputs}
    if inputs:
        t["inputs"] = inputs
    outputs = leaf_outputs(plan)
    if count.reports:
        reported = argo_retry.preempted_output(PREEMPTED_PATH, before=count.before,
                                               retried=count.retried)
        outputs = {**outputs, "parameters": [*outputs.get("parameters", []), reported]}
    if outputs:
        t["outputs"] = outputs
    t["metadata"] = stage_metadata(ctx, stage)
    t.update(scheduling(ctx, plan, task.variant))
    if varying.gpu:
        t["nodeSelector"] = {**t.get("nodeSelector", {}),
                             gpu_label(ctx): "{{inputs.parameters.gpu-product}}"}
    if task.last and stage.interruptible and stage.last_attempt_on_demand:
        if limit is None:
            on_demand_outright(ctx, t)
        else:
            on_demand_on_last_retry(ctx, t, count.spent(), task.budget)
    if stage.timeout is not None:
        t["activeDeadlineSeconds"] = str(stage.timeout)
    if task.probe and task.variant.pending_timeout is not None:
        t["pendingTimeout"] = units.format_seconds(task.variant.pending_timeout)
    if limit is not None:
        t["retryStrategy"] = retry_strategy(limit)
    if single:
        m = memoize(ctx, plan, hash_inputs)
        if m is not None:
            t["memoize"] = m
    patch = pod_spec_patch(ctx, plan, memory_param=varying.rung, gpu_count_param=varying.gpu_count)
    if patch is not None:
        t["podSpecPatch"] = patch
    t["volumes"] = volumes(ctx, plan)
    t["initContainers"] = [init_container(ctx, plan, line_key=line_key)]
    main_container(ctx, plan, task, count, t, shared=shared, varying=varying, line_key=line_key)
    return t


def shared_name(plan: StagePlan, tasks: list[TaskPlan]) -> str:
    """``<variant>-pod``, without the memory and GPU type that the tasks pass."""
    variants = {t.variant for t in tasks}
    first = tasks[0].variant
    if len(variants) == 1:
        return f"{first.name}-pod"
    parts = [plan.task]
    if len({v.type_index for v in variants}) == 1 and first.gpu is not None and \
            len({v.type_index for v in plan.variants}) > 1:
        parts.append(naming.slug(first.gpu.type))
    if len({v.rung for v in variants}) == 1 and plan.has_ladder:
        parts.append("mem-" + naming.memory_slug(units.format_bytes(first.memory or 0)))
    if any(t.probe for t in tasks):
        parts.append("probe")
    return "-".join(parts) + "-pod"


@dataclass(frozen=True)
class PodTemplates:
    """Which template each task of a grid runs: tasks whose pods differ only in their
    attempt numbers share one template (``<variant>-pod``), so each pod appears once."""

    #: Task name -> template name.
    template_of: dict[str, str]
    #: Task names whose template takes ``ATTEMPT_PARAM``.
    parameterised: frozenset[str]
    templates: list[Json]


def pod_templates(ctx: CompileContext, plan: StagePlan,
                  hash_inputs: dict[tuple[str, str], str]) -> PodTemplates:
    # (the shared pod, the tasks that run it); a stage has a few, so equality beats hashing
    groups: list[tuple[Json, list[TaskPlan]]] = []
    for task in plan.tasks:
        candidate = leaf(ctx, plan, task, hash_inputs, shared=True)
        candidate["name"] = ""
        for pod, members in groups:
            if pod == candidate:
                members.append(task)
                break
        else:
            groups.append((candidate, [task]))
    template_of: dict[str, str] = {}
    parameterised: set[str] = set()
    templates: list[Json] = []
    names: set[str] = set()
    for pod, tasks in groups:
        if len(tasks) == 1:
            (task,) = tasks
            template_of[task.name] = task.name
            templates.append(leaf(ctx, plan, task, hash_inputs))
            continue
        name = shared_name(plan, tasks)
        while name in names:
            name += "-2"
        names.add(name)
        templates.append({**pod, "name": name})
        for task in tasks:
            template_of[task.name] = name
            parameterised.add(task.name)
    return PodTemplates(template_of, frozenset(parameterised), templates)


# -- the stage DAG of a grid ------------------------------------------------------------------


def join_name(task: str) -> str:
    return f"{task}-done"


#: Pod-less templates that hold nothing of a stage, so one copy serves every stage of a
#: document: the join (a zero-length suspend that succeeds when any variant did) and the
#: backoff wait (a suspend for its ``duration`` parameter, requeued by the controller itself).
SHARED_TEMPLATES: dict[str, Json] = {
    naming.JOIN_TEMPLATE: {"name": naming.JOIN_TEMPLATE, "suspend": {"duration": "0"}},
    naming.WAIT_TEMPLATE: {"name": naming.WAIT_TEMPLATE,
                           "inputs": {"parameters": [{"name": "duration"}]},
                           "suspend": {"duration": "{{inputs.parameters.duration}}"}},
}


def oom_exhausted_name(task: str) -> str:
    return f"{task}-oom-exhausted"


def oom_exhausted_template(ctx: CompileContext, plan: StagePlan) -> Json:
    stage = plan.stage
    sizes = ", ".join(units.format_bytes(m or 0) for m in plan.rungs)
    message = (
        f"durapipe: stage {stage.name} ran out of memory at every size of its OOM ladder "
        f"({sizes}); raise the last size of retry.on_oom.memory"
    )
    return {
        "name": oom_exhausted_name(plan.task),
        "metadata": stage_metadata(ctx, stage),
        "container": {
            "image": ctx.options.runtime_image or stage.image,
            "command": ["python3", "-c", f"import sys; sys.exit({message!r})"],
            "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}},
            "terminationMessagePolicy": "FallbackToLogsOnError",
        },
    }


def condition(plan: StagePlan, pred: Pred) -> str:
    """The expression text of one predecessor link."""
    if pred.because == "oom":
        return argo_retry.oom_condition(pred.task)
    if pred.because == "fallback":
        return argo_retry.fallback_condition(pred.task)
    if pred.because == "preempted":
        return argo_retry.preempted_exit_condition(pred.task)
    return argo_retry.app_failure_condition(pred.task, plan.budgets.gpu_oom,
                                            has_ladder=plan.has_ladder)


def backoff_name(task: str) -> str:
    """The wait before the application attempt after ``task``'s failure."""
    return f"{task}-backoff"


def waits(plan: StagePlan) -> dict[str, TaskPlan]:
    """Failed task -> the application attempt that runs after its backoff."""
    if plan.budgets.backoff is None:
        return {}
    return {p.task: task for task in plan.tasks for p in task.preds
            if p.because == "app_failure"}


@dataclass(frozen=True)
class DagSize:
    """The tasks of a stage's compiled DAG (one for a pod or a multi-node stage)."""

    #: One per state class of the retry machine (``plan.plan_tasks``).
    attempts: int
    #: Backoff waits: one after each task whose application failure starts another.
    waits: int
    #: The join, and with a ladder the "memory exhausted" task.
    extra: int

    @property
    def total(self) -> int:
        return self.attempts + self.waits + self.extra


def dag_size(stage: Stage) -> DagSize:
    """What ``lower_grid`` writes for ``stage``, counted from the same plan (the editor's
    hover and ``durapipe graph`` read it, so they never disagree with the YAML)."""
    if stage.distributed is not None:
        return DagSize(1, 0, 0)
    tasks = plan_tasks(stage, plan_variants(stage, stage.name))
    if len(tasks) == 1:
        return DagSize(1, 0, 0)
    failing = {p.task for t in tasks for p in t.preds if p.because == "app_failure"}
    waits = len(failing) if stage.retry.backoff is not None else 0
    return DagSize(len(tasks), waits, 1 + int(len(memory_rungs(stage)) > 1))


def backoff_task(plan: StagePlan, failed: str, then: TaskPlan) -> Json:
    assert plan.budgets.backoff is not None
    wait = units.format_seconds(int(plan.budgets.backoff.wait(then.app_attempt)))
    return {"name": backoff_name(failed), "template": naming.WAIT_TEMPLATE,
            "depends": f"{failed}.Failed || {failed}.Errored",
            "when": "{{=" + condition(plan, Pred(failed, "app_failure")) + "}}",
            "arguments": {"parameters": [{"name": "duration", "value": wait}]}}


def grid_task(ctx: CompileContext, plan: StagePlan, task: TaskPlan, arts: list[Json],
              pods: PodTemplates, waited: frozenset[str]) -> Json:
    out: Json = {"name": task.name, "template": pods.template_of[task.name]}
    links: list[tuple[str, str | None]] = []
    for p in task.preds:
        if p.because == "app_failure" and p.task in waited:
            # The wait ran only on an application failure: its success is the condition.
            w = backoff_name(p.task)
            links.append((f"{w}.Succeeded", None))
        else:
            links.append((f"{p.task}.Failed || {p.task}.Errored", condition(plan, p)))
    conds = [c if c is not None else
             f"tasks['{d.split('.')[0]}'].status == 'Succeeded'" for d, c in links]
    if links:
        out["depends"] = " || ".join(f"({d})" if len(links) > 1 else d for d, _ in links)
        if any(c is not None for _, c in links):
            out["when"] = "{{=" + " || ".join(f"({c})" for c in conds) + "}}"
    shared = task.name in pods.parameterised
    params: list[Json] = []
    if shared:
        params.append({"name": ATTEMPT_PARAM, "value": str(task.first_attempt)})
    if Count.of(plan, task, shared).before is None:
        params.append({"name": argo_retry.PREEMPTED_BEFORE,
                       "value": preempted_before(plan, task, conds)})
    if shared:
        params += variant_arguments(ctx, plan, task.variant, Varying.of(plan, True))
    params += line_key_argument(plan)
    args: Json = {"parameters": params} if params else {}
    if arts:
        args["artifacts"] = arts
    if args:
        out["arguments"] = args
    return out


def line_key_argument(plan: StagePlan) -> list[Json]:
    """What a stage's template passes its pods: the key of their inputs-scoped checkpoint
    line, evaluated over its own inputs."""
    if not plan.inputs_keyed_line:
        return []
    return [{"name": LINE_KEY_PARAM,
             "value": inputs_key_expression(plan, hash_inputs_for(plan))}]


def preempted_before(plan: StagePlan, task: TaskPlan, conds: list[str]) -> str:
    """The ``preempted-before`` argument: the count the predecessor that started the task
    passes on (``conds``: the condition of each of its links, in ``task.preds`` order).  A
    probe retries nothing, so it passes one if it was preempted and none otherwise."""
    if task.preempted is not None:
        return str(task.preempted)
    probes = {t.name for t in plan.tasks if t.probe}
    links = [(c, p.task, (f"'{int(p.because == 'preempted')}'" if p.task in probes else None))
             for c, p in zip(conds, task.preds)]
    return argo_retry.preempted_before_value(links, task.budget)


def grid_tasks(ctx: CompileContext, plan: StagePlan, pods: PodTemplates) -> list[Json]:
    """The stage DAG's tasks: application attempts chain, OOM rungs climb, GPU types fall
    back; a join makes the stage succeed when any task did."""
    arts = [
        {"name": artifact_input_name(s, o),
         "from": "{{inputs.artifacts." + artifact_input_name(s, o) + "}}"}
        for s, o in sorted(plan.upstream)
    ]
    after = waits(plan)
    tasks: list[Json] = []
    for task in plan.tasks:
        tasks.append(grid_task(ctx, plan, task, arts, pods, frozenset(after)))
        if task.name in after:
            tasks.append(backoff_task(plan, task.name, after[task.name]))
    names = [task.name for task in plan.tasks]
    exhausted = oom_exhausted_name(plan.task)
    if plan.has_ladder:
        last_rung = [t.name for t in plan.tasks if t.variant.rung == len(plan.rungs) - 1]
        tasks.append({
            "name": exhausted,
            "template": exhausted,
            "depends": " || ".join(f"{n}.Failed" for n in last_rung),
            "when": "{{=" + " || ".join(
                f"({argo_retry.oom_condition(n)})" for n in last_rung) + "}}",
        })
    # The join is the DAG's only leaf.  Argo derives a DAG's phase from its leaves, and an
    # omitted leaf inherits the *worst* phase of the branches that reach it, so without a join
    # a rung that failed before a later rung succeeded would fail the stage.
    tasks.append({
        "name": join_name(plan.task),
        "template": naming.JOIN_TEMPLATE,
        "depends": " || ".join(
            [f"{n}.Succeeded" for n in names]
            + ([f"{exhausted}.Succeeded"] if plan.has_ladder else [])),
    })
    return tasks


def _pick(tasks: list[str], field_path: str, otherwise: str) -> str:
    """The field of the first task that succeeded."""
    expr = otherwise
    for index in range(len(tasks) - 1, -1, -1):
        ref = f"tasks['{tasks[index]}']"
        expr = f"{ref}.status == 'Succeeded' ? {ref}.{field_path} : {expr}"
        if index:
            expr = f"({expr})"
    return expr


def grid_outputs(plan: StagePlan) -> Json:
    """The stage's outputs: those of whichever task succeeded."""
    names = [task.name for task in plan.tasks]
    outputs = sorted(plan.stage.outputs)
    last = names[-1]
    return {
        "parameters": [
            {"name": hash_param_name(n), "valueFrom": {
                "expression": _pick(names, f"outputs.parameters['{hash_param_name(n)}']",
                                    "''")}}
            for n in outputs
        ],
        "artifacts": [
            {"name": n, "fromExpression": _pick(
                names, f"outputs.artifacts['{n}']",
                f"tasks['{last}'].outputs.artifacts['{n}']")}
            for n in outputs
        ],
    }


def grid_template(ctx: CompileContext, plan: StagePlan, hash_inputs: dict[tuple[str, str], str],
                  pods: PodTemplates) -> Json:
    t: Json = {"name": plan.task}
    inputs = template_inputs(plan, hash_inputs, leaf=False)
    if inputs:
        t["inputs"] = inputs
    if plan.stage.outputs:
        t["outputs"] = grid_outputs(plan)
    m = memoize(ctx, plan, hash_inputs)
    if m is not None:
        t["memoize"] = m
        record_cache_components(plan, hash_inputs, t)
    t["dag"] = {"tasks": grid_tasks(ctx, plan, pods)}
    return t


def record_cache_components(plan: StagePlan, hash_inputs: dict[tuple[str, str], str],
                            t: Json) -> None:
    """Give a memoized DAG template the record of its key's components as an input (Argo
    evaluates it with the key) and as an output, which its memoization entry keeps."""
    given, recorded = cache_components_io(plan, hash_inputs)
    t.setdefault("inputs", {}).setdefault("parameters", []).append(given)
    t.setdefault("outputs", {}).setdefault("parameters", []).append(recorded)
    # Inputs and outputs first, as every other template lists them.
    ordered = {k: t[k] for k in ("name", "inputs", "outputs")} | t
    t.clear()
    t.update(ordered)


# -- the dispatch table -----------------------------------------------------------------------


def lower_pod(ctx: CompileContext, plan: StagePlan) -> LoweredStage:
    check_gpu(ctx, plan)
    check_texts(ctx, plan)
    hash_inputs = hash_inputs_for(plan)
    (task,) = plan.tasks
    m = memoize(ctx, plan, hash_inputs)
    if m is None:
        return LoweredStage(plan, [leaf(ctx, plan, task, hash_inputs)], hash_inputs)
    # A leaf with both `memoize` and a `retryStrategy` hangs its workflow on a cache hit: the
    # hit is a Retry node, whose children Argo's assessDAGPhase skips (getRetryNodeChildrenIds),
    # so the DAG around it never completes.  The cache goes on a one-task DAG around the pod,
    # as on a grid (test_a_cache_hit_in_the_middle_of_the_dag_with_the_default_retry_budget_completes),
    # and so it does without a retry too: a DAG's outputs can record what its key was made of
    # (``record_cache_components``), a pod's come only from files its executor reads.
    inner = replace(task, name=wrapped_task_name(plan.task))
    pod = leaf(ctx, plan, inner, hash_inputs, wrapped=True)
    return LoweredStage(plan, [wrapper_template(plan, hash_inputs, inner.name, m), pod],
                        hash_inputs)


def wrapped_task_name(task: str) -> str:
    return f"{task}-pod"


def wrapper_template(plan: StagePlan, hash_inputs: dict[tuple[str, str], str], inner: str,
                     memo: Json) -> Json:
    """A memoized one-task DAG running the stage's pod; its outputs are the pod's."""
    t: Json = {"name": plan.task}
    inputs = template_inputs(plan, hash_inputs, leaf=False)
    if inputs:
        t["inputs"] = inputs
    names = sorted(plan.stage.outputs)
    if names:
        ref = "tasks." + inner + ".outputs"
        t["outputs"] = {
            "parameters": [{"name": hash_param_name(n), "valueFrom": {
                "parameter": "{{" + ref + ".parameters." + hash_param_name(n) + "}}"}}
                for n in names],
            "artifacts": [{"name": n, "from": "{{" + ref + ".artifacts." + n + "}}"}
                          for n in names],
        }
    t["memoize"] = memo
    record_cache_components(plan, hash_inputs, t)
    task: Json = {"name": inner, "template": inner}
    args: Json = {}
    if plan.inputs_keyed_line:
        args["parameters"] = line_key_argument(plan)
    if plan.upstream:
        args["artifacts"] = [
            {"name": artifact_input_name(s, o),
             "from": "{{inputs.artifacts." + artifact_input_name(s, o) + "}}"}
            for s, o in sorted(plan.upstream)]
    if args:
        task["arguments"] = args
    t["dag"] = {"tasks": [task]}
    return t


def lower_grid(ctx: CompileContext, plan: StagePlan) -> LoweredStage:
    check_gpu(ctx, plan)
    check_texts(ctx, plan)
    needed = len(plan.tasks) + len(waits(plan))
    if needed > ctx.options.max_tasks - 2:
        loc: Loc = ("stages", plan.index, "retry", "attempts")
        ctx.error("P0403", f"stage `{plan.stage.name}` would need {needed} tasks "
                  "(memory rungs x GPU types x application attempts, and a backoff wait before "
                  "each application retry), over Argo's 200 per DAG",
                  loc, help="lower `retry.attempts` or the ladder")
    hash_inputs = hash_inputs_for(plan)
    pods = pod_templates(ctx, plan, hash_inputs)
    extra = [oom_exhausted_template(ctx, plan)] if plan.has_ladder else []
    shared = {naming.JOIN_TEMPLATE} | ({naming.WAIT_TEMPLATE} if waits(plan) else set())
    return LoweredStage(plan, [grid_template(ctx, plan, hash_inputs, pods), *pods.templates,
                               *extra], hash_inputs, frozenset(shared))


def lower_distributed(ctx: CompileContext, plan: StagePlan) -> LoweredStage:
    return LoweredStage(plan, [lower_jobset(ctx, plan)], {})


LOWERERS: dict[str, Callable[[CompileContext, StagePlan], LoweredStage]] = {
    "pod": lower_pod,
    "grid": lower_grid,
    "jobset": lower_distributed,
}


def lower_stage(ctx: CompileContext, plan: StagePlan) -> LoweredStage:
    return LOWERERS[plan.kind](ctx, plan)
