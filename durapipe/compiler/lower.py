"""Lowering: a validated ``Pipeline`` to Argo Workflows objects (plain dicts).

Phases, each collecting diagnostics instead of raising:

1. ``plan``: topological order, per-stage data edges, variant grid (OOM rungs x GPU types);
2. ``lower_stage``: the templates of one stage (a container/script leaf per variant, a stage
   DAG over the variants when there is more than one, or a JobSet resource template);
3. ``graph.assemble``: the entrypoint DAG, split into nested DAGs and WorkflowTemplates when
   Argo's limits require it, wrapped in the document of the chosen kind.

Dicts are built in output order; the serializer never sorts.  Everything that comes from a
dict in the model (env, labels, outputs) is sorted here, because equal models may hold their
dicts in different orders.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from durapipe.compiler import memo, naming
from durapipe.compiler import retry as retry_rules
from durapipe.compiler.options import RUNTIME_IMAGE_ZIPAPP, CompileOptions
from durapipe.dsl import catalog, units
from durapipe.dsl.diagnostics import Diagnostic, Label, Severity
from durapipe.dsl.model import Checkpoint, GpuChoice, Interp, Pipeline, Ref, Secret, Stage, Text
from durapipe.dsl.source import lookup
from durapipe.runtime import contract

Json = dict[str, Any]

RUNTIME_VOLUME = "durapipe"
RUNTIME_ROOT = "/var/run/durapipe"
ZIPAPP = f"{contract.RUNTIME_INSTALL_DIR}/{contract.RUNTIME_ZIPAPP_NAME}"
INPUTS_ROOT = f"{RUNTIME_ROOT}/inputs"
OUTPUT_HASH_DIR = f"{RUNTIME_ROOT}/outputs"
CHECKPOINT_VOLUME = "durapipe-checkpoint"
SHM_VOLUME = "dshm"
#: JSON ``{input name: local path}`` of a stage's declared inputs (compiler-side extension of
#: the runtime contract; the runtime may read it, user code usually does).
ENV_INPUTS = "DURAPIPE_INPUTS"
INSTALL_CONTAINER = "durapipe-install"
UPLOAD_SIDECAR = "durapipe-uploader"
#: ``retry.backoff`` cap when ``max_backoff`` is not set (seconds).
DEFAULT_BACKOFF_CAP = 600
#: Seconds the runtime keeps for itself out of the pod's grace period (verdict, last upload).
GRACE_MARGIN = 15
MANAGED_BY = {"app.kubernetes.io/managed-by": "durapipe"}
LABEL_PIPELINE = "durapipe.dev/pipeline"
LABEL_STAGE = "durapipe.dev/stage"


# -- context and diagnostics ------------------------------------------------------------------


@dataclass
class Context:
    pipeline: Pipeline
    options: CompileOptions
    profile: catalog.ClusterProfile
    diagnostics: list[Diagnostic] = field(default_factory=list)

    def error(self, code: str, message: str, loc: tuple[object, ...] = (), *,
              help: str | None = None, severity: Severity = Severity.ERROR) -> None:
        span = lookup(self.options.source_map, loc) if self.options.source_map else None
        labels = (Label(span),) if span is not None else ()
        where = self.options.source_path
        if span is None and loc:
            where = f"{where or '<pipeline>'}: {'.'.join(str(p) for p in loc)}"
        self.diagnostics.append(
            Diagnostic(code, message, labels, help, location=where, severity=severity)
        )


def is_on(setting: object) -> bool:
    """A ``cache``/``checkpoint`` block is on when present (and not ``enabled = false``)."""
    return setting is not None and bool(getattr(setting, "enabled", True))


# -- text and references ----------------------------------------------------------------------


def check_literal(ctx: Context, text: str, loc: tuple[object, ...], *, before_ref: bool = False) -> str:
    """User text that reaches a templated Argo field: refuse anything Argo would substitute."""
    if "{{" in text or (before_ref and text.endswith("{")):
        ctx.error(
            "P0404",
            f"{text[:60]!r} contains `{{{{`, which Argo would treat as a template",
            loc,
            help="Argo has no escape for `{{`; build this text inside the command at run time",
        )
    return text


def input_path(stage: str, output: str) -> str:
    return f"{INPUTS_ROOT}/{stage}/{output}"


def artifact_input_name(stage: str, output: str) -> str:
    return f"in-{stage}-{output}"


def hash_param_name(output: str) -> str:
    return f"{output}-hash"


def upstream_hash_input(stage: str, output: str) -> str:
    return f"{stage}-{output}-hash"


@dataclass
class StageIO:
    """What a stage reads: params and upstream outputs, discovered while rendering text."""

    params: set[str] = field(default_factory=set)
    #: (upstream stage, output name) pairs, in first-use order.
    upstream: list[tuple[str, str]] = field(default_factory=list)

    def use(self, stage: str, output: str) -> None:
        if (stage, output) not in self.upstream:
            self.upstream.append((stage, output))


def render_ref(ctx: Context, ref: Ref, io: StageIO, loc: tuple[object, ...]) -> str:
    if ref.is_param:
        name = ref.path[1]
        try:
            ctx.pipeline.param(name)
        except KeyError:
            ctx.error("P0301", f"unknown param `{name}`", loc)
        io.params.add(name)
        return "{{workflow.parameters." + name + "}}"
    if ref.is_output:
        stage, _, output = ref.path
        try:
            upstream = ctx.pipeline.stage(stage)
        except KeyError:
            ctx.error("P0301", f"unknown stage `{stage}`", loc)
            return ""
        if output not in upstream.outputs:
            ctx.error("P0301", f"stage `{stage}` has no output `{output}`", loc)
        io.use(stage, output)
        return input_path(stage, output)
    ctx.error("P0405", f"`{ref}` has no value here", loc, help=f"write `needs = [{ref}]`")
    return ""


def render_text(ctx: Context, value: Text, io: StageIO, loc: tuple[object, ...]) -> str:
    if isinstance(value, str):
        return check_literal(ctx, value, loc)
    if isinstance(value, Ref):
        return render_ref(ctx, value, io, loc)
    out: list[str] = []
    parts = value.parts
    for index, part in enumerate(parts):
        if isinstance(part, str):
            follows_ref = index + 1 < len(parts) and isinstance(parts[index + 1], Ref)
            out.append(check_literal(ctx, part, loc, before_ref=follows_ref))
        else:
            out.append(render_ref(ctx, part, io, loc))
    return "".join(out)


def symbolic(value: Text) -> str:
    """Text with references left as ``${...}``: the compile-time cache-key form."""
    if isinstance(value, (str, Interp)):
        return str(value)
    return "${" + str(value) + "}"


# -- the variant grid -------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One way to run a stage: a memory rung and (with fallback) one GPU type."""

    name: str
    rung: int
    memory: int | None
    gpu: GpuChoice | None
    pending_timeout: int | None
    oom_from: str | None = None
    fallback_from: str | None = None


def stage_memory_rungs(stage: Stage) -> tuple[int | None, ...]:
    ladder = stage.retry.on_oom
    if ladder is not None:
        return tuple(ladder.memory)
    return (stage.resources.memory,)


def gpu_choices(stage: Stage) -> tuple[GpuChoice, ...]:
    gpu = stage.resources.gpu
    if gpu is None:
        return ()
    if not gpu.types:
        return ()
    return gpu.types


def plan_variants(stage: Stage, base: str) -> list[Variant]:
    rungs = stage_memory_rungs(stage)
    gpu = stage.resources.gpu
    types: tuple[GpuChoice | None, ...] = (None,)
    wait: int | None = None
    if gpu is not None and gpu.fallback_after is not None and len(gpu.types) > 1:
        types = gpu.types
        wait = gpu.fallback_after
    elif gpu is not None and gpu.types and len({t.count for t in gpu.types}) > 1:
        types = gpu.types  # diagnosed by the caller; keeps the grid well-formed
    multi_rung = len(rungs) > 1
    multi_type = len(types) > 1

    def name(r: int, t: int) -> str:
        parts = [base]
        choice = types[t]
        if multi_type and choice is not None:
            parts.append(naming.slug(choice.type))
        if multi_rung:
            size = rungs[r]
            parts.append("mem-" + naming.memory_slug(units.format_bytes(size or 0)))
        return "-".join(parts)

    variants: list[Variant] = []
    for r, memory in enumerate(rungs):
        for t, choice in enumerate(types):
            variants.append(
                Variant(
                    name=name(r, t) if (multi_rung or multi_type) else base,
                    rung=r,
                    memory=memory,
                    gpu=choice,
                    pending_timeout=wait if (multi_type and t + 1 < len(types)) else None,
                    oom_from=name(r - 1, t) if r > 0 else None,
                    fallback_from=name(r, t - 1) if t > 0 else None,
                )
            )
    return variants


# -- scheduling: GPUs, spot, tolerations -------------------------------------------------------


def gpu_label(ctx: Context) -> str:
    return ctx.pipeline.cluster.gpu_label or ctx.profile.gpu_label


def gpu_product(ctx: Context, gpu_type: str, loc: tuple[object, ...]) -> str | None:
    products = {**ctx.profile.gpu_products, **ctx.pipeline.cluster.gpu_products}
    value = products.get(gpu_type)
    if value is None:
        ctx.error(
            "P0406",
            f"GPU type `{gpu_type}` has no node label value in cluster profile "
            f"`{ctx.profile.name}`",
            loc,
            help=f'add `cluster {{ gpu_products {{ {gpu_type} = "..." }} }}`',
        )
    return value


def spot_selector(ctx: Context) -> dict[str, str]:
    return dict(ctx.pipeline.cluster.spot_selector or ctx.profile.spot_selector)


def on_demand_selector(ctx: Context) -> dict[str, str]:
    return dict(ctx.pipeline.cluster.on_demand_selector or ctx.profile.on_demand_selector)


def scheduling(ctx: Context, index: int, stage: Stage, variant: Variant) -> Json:
    """``nodeSelector``, ``affinity`` and ``tolerations`` of one variant."""
    loc: tuple[object, ...] = ("stages", index, "resources", "gpu")
    selector: dict[str, str] = {}
    affinity: Json | None = None
    tolerations: list[Json] = []
    gpu = stage.resources.gpu
    if stage.interruptible:
        selector.update(spot_selector(ctx))
        tolerations.extend(
            _toleration(t) for t in ctx.profile.spot_tolerations
        )
    if gpu is not None:
        label = gpu_label(ctx)
        if variant.gpu is not None:
            product = gpu_product(ctx, variant.gpu.type, loc)
            if product is not None:
                selector[label] = product
        elif len(gpu.types) == 1:
            product = gpu_product(ctx, gpu.types[0].type, loc)
            if product is not None:
                selector[label] = product
        elif gpu.types:
            products: list[str] = []
            for choice in gpu.types:
                value = gpu_product(ctx, choice.type, loc)
                if value is not None and value not in products:
                    products.append(value)
            affinity = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [
                                {"key": label, "operator": "In", "values": products}
                            ]}
                        ]
                    },
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": max(1, 100 - 10 * i),
                            "preference": {"matchExpressions": [
                                {"key": label, "operator": "In", "values": [product]}
                            ]},
                        }
                        for i, product in enumerate(products)
                    ],
                }
            }
        tolerations.append(
            {"key": ctx.pipeline.cluster.gpu_resource, "operator": "Exists",
             "effect": "NoSchedule"}
        )
    out: Json = {}
    if selector:
        out["nodeSelector"] = dict(sorted(selector.items()))
    if affinity is not None:
        out["affinity"] = affinity
    if tolerations:
        out["tolerations"] = tolerations
    return out


def _toleration(t: catalog.Toleration) -> Json:
    out: Json = {"key": t.key, "operator": t.operator}
    if t.value is not None:
        out["value"] = t.value
    out["effect"] = t.effect
    return out


# -- resources ---------------------------------------------------------------------------------


def gpu_count(stage: Stage, variant: Variant) -> int | None:
    gpu = stage.resources.gpu
    if gpu is None:
        return None
    if variant.gpu is not None:
        return variant.gpu.count
    if gpu.types:
        return gpu.types[0].count
    return gpu.count


def container_resources(ctx: Context, stage: Stage, variant: Variant) -> Json:
    res = stage.resources
    requests: Json = {}
    limits: Json = {}
    if res.cpu is not None:
        requests["cpu"] = units.format_millicpu(res.cpu)
    if variant.memory is not None:
        requests["memory"] = limits["memory"] = units.format_bytes(variant.memory)
    if res.ephemeral_storage is not None:
        size = units.format_bytes(res.ephemeral_storage)
        requests["ephemeral-storage"] = limits["ephemeral-storage"] = size
    count = gpu_count(stage, variant)
    if count is not None:
        limits[ctx.pipeline.cluster.gpu_resource] = str(count)
    out: Json = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


# -- the runtime: env, volumes, init container, sidecar ---------------------------------------


def checkpoint_line(root: str, pipeline: str, stage: str, scope: str, run: str) -> str:
    """Where a stage's checkpoints live: keyed by run (or pipeline) and stage, never by
    attempt, so retries, rungs and fallback types all resume from the same line.  The local
    runner uses the same layout under its own store."""
    base = f"{root.rstrip('/')}/{pipeline}"
    if scope == "pipeline":
        return f"{base}/stages/{stage}/checkpoints"
    return f"{base}/runs/{run}/{stage}/checkpoints"


def checkpoint_uri(pipeline: Pipeline, stage: Stage, checkpoint: Checkpoint) -> str:
    return checkpoint_line(pipeline.storage or "", pipeline.name, stage.name, checkpoint.scope,
                           "{{workflow.name}}")


def grace_seconds(ctx: Context, stage: Stage) -> int | None:
    if is_on(stage.checkpoint):
        return ctx.options.checkpoint_grace_seconds
    return None


def _env(name: str, value: str) -> Json:
    return {"name": name, "value": value}


def contract_env(
    ctx: Context,
    stage: Stage,
    variant: Variant | None,
    *,
    attempt: str,
    declared_inputs: dict[str, str],
) -> list[Json]:
    pipeline = ctx.pipeline
    env: list[Json] = [
        _env(contract.ENV_PIPELINE, pipeline.name),
        _env(contract.ENV_STAGE, stage.name),
        _env(contract.ENV_RUN_ID, "{{workflow.name}}"),
        _env(contract.ENV_ATTEMPT, attempt),
    ]
    if variant is not None:
        env.append(_env(contract.ENV_RUNG, str(variant.rung)))
        gpu_type = variant.gpu.type if variant.gpu is not None else ""
        gpu = stage.resources.gpu
        if not gpu_type and gpu is not None and len(gpu.types) == 1:
            gpu_type = gpu.types[0].type
        env.append(_env(contract.ENV_GPU_TYPE, gpu_type))
        env.append(_env(contract.ENV_MEMORY_LIMIT, str(variant.memory or "")))
    env.append(_env(contract.ENV_TERMINATION_LOG, contract.DEFAULT_TERMINATION_LOG))
    env.append(_env(contract.ENV_GPU_OOM_POLICY, stage.retry.gpu_oom))
    if pipeline.storage:
        env.append(_env(contract.ENV_STORE_URI, pipeline.storage))
    if stage.outputs:
        outputs = {k: stage.outputs[k] for k in sorted(stage.outputs)}
        env.append(_env(contract.ENV_OUTPUTS, json.dumps(outputs, separators=(",", ":"))))
        env.append(_env(contract.ENV_OUTPUT_HASH_DIR, OUTPUT_HASH_DIR))
    if declared_inputs:
        env.append(_env(ENV_INPUTS, json.dumps(declared_inputs, separators=(",", ":"))))
    ckpt = stage.checkpoint
    if ckpt is not None and is_on(ckpt):
        env.append(_env(contract.ENV_CHECKPOINT_URI, checkpoint_uri(pipeline, stage, ckpt)))
        env.append(_env(contract.ENV_CHECKPOINT_PATH, ckpt.path))
        env.append(_env(contract.ENV_CHECKPOINT_KEEP, str(ckpt.keep)))
        env.append(_env(contract.ENV_SPOOL_DIR, contract.DEFAULT_SPOOL_DIR))
        env.append(_env(contract.ENV_UPLOADER, "sidecar"))
    grace = grace_seconds(ctx, stage)
    if grace is not None:
        env.append(_env(contract.ENV_GRACE_SECONDS, str(max(1, grace - GRACE_MARGIN))))
    return env


def user_env(ctx: Context, index: int, stage: Stage, io: StageIO) -> list[Json]:
    env: list[Json] = []
    for name in sorted(stage.env):
        value = stage.env[name]
        loc: tuple[object, ...] = ("stages", index, "env", name)
        if isinstance(value, Secret):
            env.append({"name": name, "valueFrom": {
                "secretKeyRef": {"name": value.name, "key": value.key}}})
        else:
            env.append(_env(name, render_text(ctx, value, io, loc)))
    return env


def store_env_from(ctx: Context) -> list[Json]:
    if ctx.pipeline.storage_secret:
        return [{"secretRef": {"name": ctx.pipeline.storage_secret}}]
    return []


def checkpoint_outside_root(stage: Stage) -> str | None:
    ckpt = stage.checkpoint
    if not is_on(ckpt) or ckpt is None:
        return None
    path = ckpt.path.rstrip("/")
    if path == RUNTIME_ROOT or path.startswith(RUNTIME_ROOT + "/"):
        return None
    return path


def volumes(stage: Stage) -> list[Json]:
    out: list[Json] = [{"name": RUNTIME_VOLUME, "emptyDir": {}}]
    if checkpoint_outside_root(stage) is not None:
        out.append({"name": CHECKPOINT_VOLUME, "emptyDir": {}})
    if stage.resources.shm is not None:
        out.append({"name": SHM_VOLUME, "emptyDir": {
            "medium": "Memory", "sizeLimit": units.format_bytes(stage.resources.shm)}})
    return out


def main_mounts(stage: Stage) -> list[Json]:
    out: list[Json] = [{"name": RUNTIME_VOLUME, "mountPath": RUNTIME_ROOT}]
    ckpt_path = checkpoint_outside_root(stage)
    if ckpt_path is not None:
        out.append({"name": CHECKPOINT_VOLUME, "mountPath": ckpt_path})
    if stage.resources.shm is not None:
        out.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    return out


def init_container(ctx: Context) -> Json:
    return {
        "name": INSTALL_CONTAINER,
        "image": ctx.options.runtime_image,
        "command": ["cp", RUNTIME_IMAGE_ZIPAPP, ZIPAPP],
        "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}},
        "volumeMounts": [{
            "name": RUNTIME_VOLUME,
            "mountPath": contract.RUNTIME_INSTALL_DIR,
            "subPath": "bin",
        }],
    }


def fill_main_container(ctx: Context, stage: Stage, variant: Variant, main: Json,
                        env: list[Json]) -> Json | None:
    """Add what every stage's main container has (working dir, env, store credentials,
    resources, mounts) to ``main``; return the upload sidecar when the stage checkpoints.

    Shared by single-pod stages and the JobSet pods of multi-node stages."""
    if stage.workdir is not None:
        main["workingDir"] = stage.workdir
    main["env"] = env
    env_from = store_env_from(ctx)
    if env_from:
        main["envFrom"] = env_from
    resources = container_resources(ctx, stage, variant)
    if resources:
        main["resources"] = resources
    main["volumeMounts"] = main_mounts(stage)
    if not is_on(stage.checkpoint):
        return None
    sidecar_env = [e for e in env if str(e.get("name", "")).startswith("DURAPIPE_")]
    return upload_sidecar(ctx, stage, sidecar_env)


def upload_sidecar(ctx: Context, stage: Stage, env: list[Json]) -> Json:
    mounts: list[Json] = [{"name": RUNTIME_VOLUME, "mountPath": RUNTIME_ROOT}]
    ckpt_path = checkpoint_outside_root(stage)
    if ckpt_path is not None:
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": ckpt_path})
    sidecar: Json = {
        "name": UPLOAD_SIDECAR,
        "image": ctx.options.runtime_image,
        "command": ["python3", RUNTIME_IMAGE_ZIPAPP, "agent"],
        "env": env,
    }
    env_from = store_env_from(ctx)
    if env_from:
        sidecar["envFrom"] = env_from
    sidecar["resources"] = {"requests": {"cpu": "250m", "memory": "256Mi"}}
    sidecar["volumeMounts"] = mounts
    return sidecar


def wrapped_command(ctx: Context, index: int, stage: Stage, io: StageIO) -> tuple[list[str], list[str]]:
    """(command, args) of the main container: the runtime wrapper, then the user's argv."""
    wrapper = ["python3", ZIPAPP, "exec", "--"]
    args = [
        render_text(ctx, a, io, ("stages", index, "args", i)) for i, a in enumerate(stage.args)
    ]
    if stage.command is not None:
        command = [
            render_text(ctx, c, io, ("stages", index, "command", i))
            for i, c in enumerate(stage.command)
        ]
        return wrapper + command, args
    return wrapper + ["sh"], args


def symbolic_argv(stage: Stage) -> list[str]:
    if stage.command is not None:
        return [symbolic(c) for c in stage.command] + [symbolic(a) for a in stage.args]
    return ["sh", "-c", stage.script or ""] + [symbolic(a) for a in stage.args]


# -- one stage ---------------------------------------------------------------------------------


@dataclass
class LoweredStage:
    """A stage's templates and the interface its DAG task needs."""

    stage: Stage
    task: str
    #: The template the stage's DAG task calls.
    entry: str
    templates: list[Json]
    io: StageIO
    #: Input parameter names of the entry template, by (upstream stage, output).
    hash_inputs: dict[tuple[str, str], str]


def stage_metadata(ctx: Context, stage: Stage) -> Json:
    labels = {LABEL_PIPELINE: ctx.pipeline.name, LABEL_STAGE: stage.name}
    labels.update(stage.labels)
    meta: Json = {"labels": dict(sorted(labels.items()))}
    if stage.annotations:
        meta["annotations"] = dict(sorted(stage.annotations.items()))
    return meta


def template_inputs(io: StageIO, hash_inputs: dict[tuple[str, str], str], *, leaf: bool) -> Json:
    inputs: Json = {}
    if hash_inputs:
        inputs["parameters"] = [{"name": hash_inputs[k]} for k in sorted(hash_inputs)]
    if io.upstream:
        arts: list[Json] = []
        for up_stage, output in sorted(io.upstream):
            art: Json = {"name": artifact_input_name(up_stage, output)}
            if leaf:
                art["path"] = input_path(up_stage, output)
            arts.append(art)
        inputs["artifacts"] = arts
    return inputs


def leaf_outputs(stage: Stage) -> Json:
    if not stage.outputs:
        return {}
    names = sorted(stage.outputs)
    return {
        "parameters": [
            {"name": hash_param_name(n), "valueFrom": {
                "path": f"{OUTPUT_HASH_DIR}/{n}{contract.OUTPUT_HASH_SUFFIX}", "default": ""}}
            for n in names
        ],
        "artifacts": [{"name": n, "path": stage.outputs[n]} for n in names],
    }


def retry_strategy(stage: Stage, *, has_ladder: bool, limit: int) -> Json | None:
    """A leaf's ``retryStrategy``: preemptions only (application attempts are tasks)."""
    rule = stage.retry
    if limit == 0:
        return None
    out: Json = {
        "limit": str(limit),
        "retryPolicy": "Always",
        "expression": retry_rules.expression(rule, has_ladder=has_ladder),
    }
    if rule.backoff is not None:
        backoff: Json = {
            "duration": units.format_seconds(rule.backoff),
            "factor": str(rule.backoff_factor),
        }
        # Backoff applies to every retry, preemptions included, so an uncapped exponential
        # would leave a spot stage waiting hours after its tenth reclaim: cap it by default.
        cap = rule.max_backoff if rule.max_backoff is not None else max(
            DEFAULT_BACKOFF_CAP, rule.backoff)
        backoff["cap"] = units.format_seconds(cap)
        out["backoff"] = backoff
    return out


def pod_spec_patch(ctx: Context, stage: Stage, limit: int) -> str | None:
    """Template ``podSpecPatch``: grace period, and the last attempt on on-demand capacity."""
    patch: Json = {}
    grace = grace_seconds(ctx, stage)
    if grace is not None:
        patch["terminationGracePeriodSeconds"] = grace
    if stage.interruptible and stage.last_attempt_on_demand and limit > 0:
        spot = spot_selector(ctx)
        demand = on_demand_selector(ctx)
        selector: Json = {}
        for key in sorted(spot):
            if key in demand:
                selector[key] = (
                    f"{{{{=asInt(retries) >= {limit} ? '{demand[key]}' : '{spot[key]}'}}}}"
                )
        if selector:
            patch["nodeSelector"] = selector
    if not patch:
        return None
    return json.dumps(patch, sort_keys=True, separators=(",", ":"))


def memoize(ctx: Context, stage: Stage, static: str, io: StageIO,
            hash_inputs: dict[tuple[str, str], str]) -> Json | None:
    cache = stage.cache
    if cache is None or not is_on(cache):
        return None
    upstream = {f"{s}.{o}": name for (s, o), name in hash_inputs.items()}
    return {
        "key": memo.key_expression(static, sorted(io.params), upstream),
        "maxAge": units.format_seconds(cache.max_age) if cache.max_age is not None else "",
        "cache": {"configMap": {"name": naming.cache_configmap(ctx.pipeline.name)}},
    }


def cache_static(stage: Stage) -> str:
    env: dict[str, str] = {}
    for name in sorted(stage.env):
        value = stage.env[name]
        if isinstance(value, Secret):
            env[name] = f"secret:{value.name}/{value.key}"
        else:
            env[name] = symbolic(value)
    return memo.static_digest(
        image=stage.image, command=symbolic_argv(stage), env=env,
        salt=stage.cache.version if stage.cache is not None else "",
    )


def lower_stage(ctx: Context, index: int, stage: Stage) -> LoweredStage:
    task = naming.task_name(stage.name)
    loc: tuple[object, ...] = ("stages", index)
    check_literal(ctx, stage.image, (*loc, "image"))
    if stage.distributed is not None:
        from durapipe.compiler.jobset import lower_distributed

        return lower_distributed(ctx, index, stage, task)

    gpu = stage.resources.gpu
    if gpu is not None and gpu.fallback_after is not None and len(gpu.types) > 1:
        if ctx.options.argo_version == "3.7":
            ctx.error(
                "P0401",
                "GPU fallback after a queue wait needs `pendingTimeout` (Argo 4.1)",
                (*loc, "resources", "gpu", "fallback_after"),
                help="target `--argo-version 4.1`, or drop `fallback_after` to accept any "
                "listed type",
            )
    elif gpu is not None and len({t.count for t in gpu.types}) > 1:
        ctx.error(
            "P0406",
            f"stage `{stage.name}` lists GPU types with different counts but no "
            "`fallback_after`",
            (*loc, "resources", "gpu"),
            help="set `fallback_after` so each type runs as its own attempt",
        )
    if stage.script is not None and stage.args:
        ctx.error("P0319", "`args` has no effect on a `script` stage", (*loc, "args"))

    io = StageIO()
    command, args = wrapped_command(ctx, index, stage, io)
    env_user = user_env(ctx, index, stage, io)
    for name, ref in sorted(stage.inputs.items()):
        render_ref(ctx, ref, io, (*loc, "inputs", name))
    declared_inputs = {
        name: input_path(ref.path[0], ref.path[2])
        for name, ref in sorted(stage.inputs.items()) if ref.is_output
    }
    if stage.workdir is not None:
        check_literal(ctx, stage.workdir, (*loc, "workdir"))
    if stage.script is not None:
        check_literal(ctx, stage.script, (*loc, "script"))
    for name, path in sorted(stage.outputs.items()):
        check_literal(ctx, path, (*loc, "outputs", name))
    ckpt = stage.checkpoint
    if ckpt is not None:
        check_literal(ctx, ckpt.path, (*loc, "checkpoint", "path"))
    for field_name, mapping in (("labels", stage.labels), ("annotations", stage.annotations)):
        for key, value in sorted(mapping.items()):
            check_literal(ctx, value, (*loc, field_name, key))

    cached = is_on(stage.cache)
    hash_inputs = (
        {(s, o): upstream_hash_input(s, o) for s, o in io.upstream} if cached else {}
    )
    static = cache_static(stage) if cached else ""
    variants = plan_variants(stage, task)
    has_ladder = stage.retry.on_oom is not None and len(stage.retry.on_oom.memory) > 1
    single = len(variants) == 1 and stage.retry.attempts == 0

    def leaf(name: str, variant: Variant, *, limit: int, wait: bool, first_attempt: int,
             last: bool) -> Json:
        strategy = retry_strategy(stage, has_ladder=has_ladder, limit=limit)
        patch = pod_spec_patch(ctx, stage, limit if (strategy is not None and last) else 0)
        t: Json = {"name": name}
        inputs = template_inputs(io, hash_inputs if single else {}, leaf=True)
        if inputs:
            t["inputs"] = inputs
        outputs = leaf_outputs(stage)
        if outputs:
            t["outputs"] = outputs
        t["metadata"] = stage_metadata(ctx, stage)
        t.update(scheduling(ctx, index, stage, variant))
        if last and strategy is None and stage.interruptible and stage.last_attempt_on_demand:
            # This task runs once, and it is the stage's last attempt: on-demand outright.
            demand = on_demand_selector(ctx)
            t["nodeSelector"] = dict(sorted({**t.get("nodeSelector", {}), **{
                k: v for k, v in demand.items() if k in spot_selector(ctx)}}.items()))
        if stage.timeout is not None:
            t["activeDeadlineSeconds"] = str(stage.timeout)
        if wait:
            t.update(gpu_wait_fields(variant))
        if strategy is not None:
            t["retryStrategy"] = strategy
        if single:
            m = memoize(ctx, stage, static, io, hash_inputs)
            if m is not None:
                t["memoize"] = m
        if patch is not None:
            t["podSpecPatch"] = patch
        t["volumes"] = volumes(stage)
        t["initContainers"] = [init_container(ctx)]
        if strategy is None:
            attempt = str(first_attempt)
        elif first_attempt:
            attempt = "{{=asInt(retries) + " + str(first_attempt) + "}}"
        else:
            attempt = "{{retries}}"
        env = contract_env(
            ctx, stage, variant, attempt=attempt, declared_inputs=declared_inputs,
        ) + env_user
        main: Json = {"image": stage.image, "command": command}
        if stage.script is not None:
            main["source"] = stage.script
        elif args:
            main["args"] = args
        sidecar = fill_main_container(ctx, stage, variant, main, env)
        t["script" if stage.script is not None else "container"] = main
        if sidecar is not None:
            t["sidecars"] = [sidecar]
        return t

    plans = plan_tasks(stage, variants, has_ladder=has_ladder)
    if len(plans) > ctx.options.max_tasks - 2:
        ctx.error("P0403", f"stage `{stage.name}` would need {len(plans)} tasks (memory rungs x "
                  "GPU types x application attempts), over Argo's 200 per DAG",
                  (*loc, "retry", "attempts"), help="lower `retry.attempts` or the ladder")
    single = len(plans) == 1
    templates = [
        leaf(plan.name, plan.variant, limit=plan.limit, wait=plan.probe,
             first_attempt=plan.first_attempt, last=plan.last)
        for plan in plans
    ]
    if single:
        return LoweredStage(stage, task, task, templates, io, hash_inputs)

    grid = grid_template(ctx, stage, task, plans, io, hash_inputs, static)
    extra = [oom_exhausted_template(ctx, stage, task)] if has_ladder else []
    extra.append(join_template(task))
    return LoweredStage(stage, task, task, [grid, *templates, *extra], io, hash_inputs)


@dataclass(frozen=True)
class TaskPlan:
    """One DAG task of a stage, and the leaf template it runs."""

    name: str
    variant: Variant
    #: The first attempt on a GPU type that may give way to the next (``pendingTimeout``).
    probe: bool
    #: ``retryStrategy.limit``: preemptions retried within this task.
    limit: int
    #: ``DURAPIPE_ATTEMPT`` of this task's first attempt.
    first_attempt: int
    #: Whether this task's last retry is the stage's last possible attempt (on-demand).
    last: bool
    #: (predecessor task, condition under which this task runs after it).
    preds: tuple[tuple[str, str], ...]


def plan_tasks(stage: Stage, variants: list[Variant], *, has_ladder: bool) -> list[TaskPlan]:
    """The tasks of a stage: per variant (rung x GPU type), an optional probe, then one task
    per application attempt.

    Argo has one retry ``limit`` and shows an expression only the last attempt, so separate
    budgets need separate tasks: each task retries preemptions only (its own limit), and an
    application failure ends it and starts the next application attempt's task, up to
    ``attempts`` of them.  An OOM kill moves to the same application attempt one rung up, so
    the count of application failures carries across rungs; a pending timeout moves to the
    next GPU type (docs/lowering.md, "Retries").  A stage with no application budget and one
    variant is a single task.
    """
    rule = stage.retry
    attempts, preemptions = rule.attempts, rule.preemptions
    probes: dict[tuple[int, int], TaskPlan] = {}
    chains: dict[tuple[int, int, int], TaskPlan] = {}
    out: list[TaskPlan] = []
    # Variants come rung-major, type-minor; (rung, type) coordinates from the link names.
    coords: dict[str, tuple[int, int]] = {}
    for variant in variants:
        t = 0
        if variant.fallback_from is not None:
            t = coords[variant.fallback_from][1] + 1
        coords[variant.name] = (variant.rung, t)
    for variant in variants:
        r, t = coords[variant.name]
        probe: TaskPlan | None = None
        if variant.pending_timeout is not None:
            preds: list[tuple[str, str]] = []
            if variant.fallback_from is not None:
                preds.append((variant.fallback_from,
                              retry_rules.fallback_condition(variant.fallback_from)))
            if (r - 1, t) in probes:
                below = probes[(r - 1, t)].name
                preds.append((below, retry_rules.oom_condition(below)))
            probe = TaskPlan(variant.name, variant, True, 0, 0,
                             attempts == 0 and preemptions == 0, tuple(preds))
            probes[(r, t)] = probe
            out.append(probe)
        next_attempt = 1 if probe is not None else 0
        for k in range(attempts + 1):
            preds = []
            limit = preemptions
            if k == 0:
                if probe is not None:
                    if preemptions == 0:
                        continue
                    preds.append((probe.name, retry_rules.preempted_exit_condition(probe.name)))
                    limit = preemptions - 1
                elif variant.fallback_from is not None:
                    preds.append((variant.fallback_from,
                                  retry_rules.fallback_condition(variant.fallback_from)))
            if (r - 1, t, k) in chains:
                below = chains[(r - 1, t, k)].name
                preds.append((below, retry_rules.oom_condition(below)))
            if k >= 1 and (r, t, k - 1) in chains:
                previous = chains[(r, t, k - 1)].name
                preds.append((previous, retry_rules.app_failure_condition(
                    previous, rule, has_ladder=has_ladder)))
            if k == 1 and probe is not None:
                preds.append((probe.name, retry_rules.app_failure_condition(
                    probe.name, rule, has_ladder=has_ladder)))
            if attempts == 0:
                name = retry_task_name(variant.name) if probe is not None else variant.name
            else:
                name = f"{variant.name}-app-{k}"
            plan = TaskPlan(name, variant, False, limit, next_attempt, k == attempts,
                            tuple(preds))
            next_attempt += limit + 1
            chains[(r, t, k)] = plan
            out.append(plan)
    return out


def gpu_wait_fields(variant: Variant) -> Json:
    """How a GPU type gives way to the next after its queue wait.

    The construction (docs/lowering.md, "GPU fallback"): each type is its own DAG task whose
    first attempt (the probe) carries Argo 4.1's ``pendingTimeout`` and **no** retryStrategy:
    Argo checks ``pendingTimeout`` against the node the caller sees, which for a template with
    a retryStrategy is the Retry node, never Pending (operator.go ``executeTemplate`` /
    ``checkTemplateTimeouts``, v4.1.2), so the timeout would never fire.  The type's remaining
    attempts run in a ``-retry`` task (``plan_tasks``); the next type runs when the probe
    failed without an exit code (``retry.fallback_condition``).
    """
    if variant.pending_timeout is None:
        return {}
    return {"pendingTimeout": units.format_seconds(variant.pending_timeout)}


def join_name(task: str) -> str:
    return f"{task}-done"


def join_template(task: str) -> Json:
    """A pod-less no-op (a zero-length suspend) that succeeds when any variant did."""
    return {"name": join_name(task), "suspend": {"duration": "0"}}


def oom_exhausted_name(task: str) -> str:
    return f"{task}-oom-exhausted"


def oom_exhausted_template(ctx: Context, stage: Stage, task: str) -> Json:
    ladder = stage.retry.on_oom
    sizes = ", ".join(units.format_bytes(m) for m in (ladder.memory if ladder else ()))
    message = (
        f"durapipe: stage {stage.name} ran out of memory at every size of its OOM ladder "
        f"({sizes}); raise the last size of retry.on_oom.memory"
    )
    return {
        "name": oom_exhausted_name(task),
        "metadata": stage_metadata(ctx, stage),
        "container": {
            "image": ctx.options.runtime_image,
            "command": ["python3", "-c", f"import sys; sys.exit({message!r})"],
            "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}},
            "terminationMessagePolicy": "FallbackToLogsOnError",
        },
    }


def retry_task_name(variant: str) -> str:
    return f"{variant}-retry"


def grid_template(
    ctx: Context,
    stage: Stage,
    task: str,
    plans: list[TaskPlan],
    io: StageIO,
    hash_inputs: dict[tuple[str, str], str],
    static: str,
) -> Json:
    """The stage DAG over its tasks: application attempts chain, OOM rungs climb, GPU types
    fall back; a join makes the stage succeed when any task did."""
    has_ladder = stage.retry.on_oom is not None and len(stage.retry.on_oom.memory) > 1
    arts = [
        {"name": artifact_input_name(s, o),
         "from": "{{inputs.artifacts." + artifact_input_name(s, o) + "}}"}
        for s, o in sorted(io.upstream)
    ]
    tasks: list[Json] = []
    for plan in plans:
        out: Json = {"name": plan.name, "template": plan.name}
        if plan.preds:
            out["depends"] = " || ".join(
                f"({p}.Failed || {p}.Errored)" if len(plan.preds) > 1 else
                f"{p}.Failed || {p}.Errored" for p, _ in plan.preds)
            out["when"] = "{{=" + " || ".join(f"({c})" for _, c in plan.preds) + "}}"
        if arts:
            out["arguments"] = {"artifacts": arts}
        tasks.append(out)
    all_tasks = [plan.name for plan in plans]
    ladder = stage.retry.on_oom
    if has_ladder and ladder is not None:
        last_rung = [p.name for p in plans if p.variant.rung == len(ladder.memory) - 1]
        tasks.append({
            "name": oom_exhausted_name(task),
            "template": oom_exhausted_name(task),
            "depends": " || ".join(f"{n}.Failed" for n in last_rung),
            "when": "{{=" + " || ".join(
                f"({retry_rules.oom_condition(n)})" for n in last_rung) + "}}",
        })
    # The join is the DAG's only leaf.  Argo derives a DAG's phase from its leaves, and an
    # omitted leaf inherits the *worst* phase of the branches that reach it, so without a join
    # a rung that failed before a later rung succeeded would fail the stage.
    tasks.append({
        "name": join_name(task),
        "template": join_name(task),
        "depends": " || ".join(
            [f"{n}.Succeeded" for n in all_tasks]
            + ([f"{oom_exhausted_name(task)}.Succeeded"] if has_ladder else [])),
    })
    t: Json = {"name": task}
    inputs = template_inputs(io, hash_inputs, leaf=False)
    if inputs:
        t["inputs"] = inputs
    if stage.outputs:
        names_ = sorted(stage.outputs)
        last = all_tasks[-1]
        t["outputs"] = {
            "parameters": [
                {"name": hash_param_name(n), "valueFrom": {
                    "expression": _pick(all_tasks, f"outputs.parameters['{hash_param_name(n)}']",
                                        "''")}}
                for n in names_
            ],
            "artifacts": [
                {"name": n, "fromExpression": _pick(
                    all_tasks, f"outputs.artifacts['{n}']",
                    f"tasks['{last}'].outputs.artifacts['{n}']")}
                for n in names_
            ],
        }
    m = memoize(ctx, stage, static, io, hash_inputs)
    if m is not None:
        t["memoize"] = m
    t["dag"] = {"tasks": tasks}
    return t


def _pick(tasks: list[str], field_path: str, otherwise: str) -> str:
    expr = otherwise
    for index in range(len(tasks) - 1, -1, -1):
        ref = f"tasks['{tasks[index]}']"
        expr = f"{ref}.status == 'Succeeded' ? {ref}.{field_path} : {expr}"
        if index:
            expr = f"({expr})"
    return expr
