"""A stage's pod, from its plan: containers, environment, volumes, resources and scheduling.

Shared by the single-pod and grid lowerings (``argo_stage``) and the JobSet pods of multi-node
stages (``argo_jobset``).  Dicts are built in output order; the serializer never sorts.
"""

from __future__ import annotations

import json
from typing import Any

from durapipe.compiler import memo, naming, runtime_delivery
from durapipe.compiler.argo_text import input_path, render_text, upstream_hash_input
from durapipe.compiler.context import CompileContext, Loc
from durapipe.compiler.options import RUNTIME_IMAGE_ZIPAPP
from durapipe.compiler.plan import (
    RUNTIME_ROOT,
    Site,
    StagePlan,
    Variant,
    cache_parts,
    cache_static,
    checkpoint_line,
    contract_env,
    grace_for_runtime,
    kubelet_literal,
)
from durapipe.dsl import catalog, kube, units
from durapipe.dsl.model import ConfigMapKey, Secret, Stage, Volume
from durapipe.runtime import contract

Json = dict[str, Any]

RUNTIME_VOLUME = "durapipe"
ZIPAPP = f"{contract.RUNTIME_INSTALL_DIR}/{contract.RUNTIME_ZIPAPP_NAME}"
OUTPUT_HASH_DIR = f"{RUNTIME_ROOT}/outputs"
#: The workflow parameter naming earlier runs' checkpoint lines to restore from (a JSON
#: object ``{stage: line}``, empty by default): ``durapipe submit --resume-from RUN`` sets it.
RESUME_FROM_PARAM = contract.RESUME_FROM_PARAM
#: The runtime's report of the attempt's first restore, read as the ``resumed-from`` output.
RESUME_REPORT = f"{RUNTIME_ROOT}/resumed-from.json"
RESUMED_FROM_OUTPUT = "resumed-from"
CHECKPOINT_VOLUME = "durapipe-checkpoint"
SHM_VOLUME = "dshm"
INSTALL_CONTAINER = "durapipe-install"
PREFLIGHT_CONTAINER = "durapipe-preflight"
UPLOAD_SIDECAR = "durapipe-uploader"
MANAGED_BY = {"app.kubernetes.io/managed-by": "durapipe"}
LABEL_PIPELINE = "durapipe.dev/pipeline"
LABEL_STAGE = "durapipe.dev/stage"
RUN_ID = "{{workflow.name}}"


# -- scheduling: GPUs, spot, tolerations -------------------------------------------------------


def gpu_label(ctx: CompileContext) -> str:
    return ctx.pipeline.cluster.gpu_label or ctx.profile.gpu_label


def gpu_product(ctx: CompileContext, gpu_type: str, loc: Loc) -> str | None:
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


def spot_selector(ctx: CompileContext) -> dict[str, str]:
    return dict(ctx.pipeline.cluster.spot_selector or ctx.profile.spot_selector)


def on_demand_requirements(ctx: CompileContext) -> tuple[catalog.Requirement, ...]:
    """What the on-demand attempt's node must satisfy: the labels the pipeline says its
    on-demand nodes carry, else "not the spot labels" (the pipeline's, or the profile's)."""
    cluster = ctx.pipeline.cluster
    if cluster.on_demand_selector:
        return tuple(catalog.Requirement(k, "In", (v,))
                     for k, v in sorted(cluster.on_demand_selector.items()))
    if cluster.spot_selector:
        return tuple(catalog.Requirement(k, "NotIn", (v,))
                     for k, v in sorted(cluster.spot_selector.items()))
    return ctx.profile.on_demand


def _expression(key: str, operator: str, values: list[str]) -> Json:
    return {"key": key, "operator": operator, "values": values}


def require(t: Json, expressions: list[Json]) -> None:
    """AND ``expressions`` into the required node affinity of template ``t`` (every term)."""
    node = t.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution",
                               {"nodeSelectorTerms": []})
    terms = required["nodeSelectorTerms"]
    if not terms:
        terms.append({"matchExpressions": []})
    for term in terms:
        term["matchExpressions"] = [*term.get("matchExpressions", []), *expressions]


def _without_spot(ctx: CompileContext, t: Json) -> list[Json]:
    """Drop the spot labels from ``t``'s nodeSelector; the spot tolerations it holds."""
    spot = spot_selector(ctx)
    selector = {k: v for k, v in t.get("nodeSelector", {}).items() if k not in spot}
    if selector:
        t["nodeSelector"] = selector
    else:
        t.pop("nodeSelector", None)
    spot_tolerations = [_toleration(x) for x in ctx.profile.spot_tolerations]
    return [x for x in t.get("tolerations", []) if x in spot_tolerations]


def on_demand_outright(ctx: CompileContext, t: Json) -> None:
    """A task that runs once and is the stage's last attempt: on-demand capacity outright,
    with no spot label asked for and no spot taint tolerated."""
    dropped = _without_spot(ctx, t)
    kept = [x for x in t.get("tolerations", []) if x not in dropped]
    if kept:
        t["tolerations"] = kept
    else:
        t.pop("tolerations", None)
    require(t, [_expression(r.key, r.operator, list(r.values))
                for r in on_demand_requirements(ctx)])


#: A toleration value no node's taint has: what a spot toleration becomes on the on-demand
#: attempt, so that attempt tolerates no spot taint (a template cannot drop a list item).
NO_TAINT = "durapipe-on-demand"


def on_demand_on_last_retry(ctx: CompileContext, t: Json, spent: str, budget: int) -> None:
    """The last task of an interruptible stage, whose last retry is the stage's last attempt:
    spot while the preemptions ``spent`` (Argo expression text over ``retries``) are below
    the ``budget``, on-demand at it.  A ``nodeSelector`` entry
    cannot be removed by a template expression and GKE and AKS on-demand nodes carry no label
    to select, so the spot labels move into node affinity, whose operator and value switch on
    Argo's ``retries``; the spot tolerations switch to a value no taint has."""
    def pick(on_demand: str, spot: str) -> str:
        if on_demand == spot:
            return spot
        return "{{=" + f"{spent} >= {budget} ? '{on_demand}' : '{spot}'" + "}}"

    spot = spot_selector(ctx)
    wanted = {r.key: r for r in on_demand_requirements(ctx)}
    expressions: list[Json] = []
    for key in sorted(spot):
        value = spot[key]
        od = wanted.pop(key, None)
        if od is None or len(od.values) != 1:
            od = catalog.Requirement(key, "NotIn", (value,))
        expressions.append(_expression(key, pick(od.operator, "In"),
                                       [pick(od.values[0], value)]))
    for r in wanted.values():
        # "Not spot" holds on spot attempts too when it is about another label (GKE's
        # preemptible one); an on-demand label is avoided by the spot attempts.
        operator = r.operator if r.operator == "NotIn" else pick(r.operator, "NotIn")
        expressions.append(_expression(r.key, operator, list(r.values)))
    spot_tolerations = _without_spot(ctx, t)
    t["tolerations"] = [
        {**x, "value": pick(NO_TAINT, str(x["value"]))} if x in spot_tolerations else x
        for x in t.get("tolerations", [])]
    require(t, expressions)


def _preferred_types(ctx: CompileContext, products: list[str]) -> Json:
    """Any listed GPU type will do, the earlier ones preferred (no fallback wait)."""
    label = gpu_label(ctx)

    def term(values: list[str]) -> Json:
        return {"matchExpressions": [{"key": label, "operator": "In", "values": values}]}

    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [term(products)]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": max(1, 100 - 10 * i), "preference": term([product])}
                for i, product in enumerate(products)
            ],
        }
    }


def scheduling(ctx: CompileContext, plan: StagePlan, variant: Variant) -> Json:
    """``nodeSelector``, ``affinity`` and ``tolerations`` of one variant."""
    loc: Loc = ("stages", plan.index, "resources", "gpu")
    stage = plan.stage
    selector: dict[str, str] = {}
    affinity: Json | None = None
    tolerations: list[Json] = []
    gpu = stage.resources.gpu
    if stage.interruptible:
        selector.update(spot_selector(ctx))
        tolerations.extend(_toleration(t) for t in ctx.profile.spot_tolerations)
    if gpu is not None:
        if variant.gpu is not None:
            product = gpu_product(ctx, variant.gpu.type, loc)
            if product is not None:
                selector[gpu_label(ctx)] = product
        elif gpu.types:
            products: list[str] = []
            for choice in gpu.types:
                value = gpu_product(ctx, choice.type, loc)
                if value is not None and value not in products:
                    products.append(value)
            affinity = _preferred_types(ctx, products)
        tolerations.append(
            {"key": ctx.pipeline.cluster.gpu_resource, "operator": "Exists",
             "effect": "NoSchedule"}
        )
    selector.update(stage.node_selector)
    tolerations.extend(kube_toleration(t) for t in stage.tolerations)
    affinity = user_affinity(stage, affinity)
    out: Json = {}
    if stage.service_account is not None:
        out["serviceAccountName"] = stage.service_account
    if stage.priority_class is not None:
        out["priorityClassName"] = stage.priority_class
    if selector:
        out["nodeSelector"] = dict(sorted(selector.items()))
    if affinity is not None:
        out["affinity"] = affinity
    if tolerations:
        out["tolerations"] = tolerations
    return out


def kube_toleration(text: str) -> Json:
    parsed = kube.parse_toleration(text)
    assert not isinstance(parsed, str), text  # the front end reported it (P0342)
    return parsed.to_json()


def _expressions(labels: dict[str, tuple[str, ...]]) -> list[Json]:
    return [{"key": k, "operator": "In", "values": list(v)} for k, v in sorted(labels.items())]


def user_affinity(stage: Stage, affinity: Json | None) -> Json | None:
    """The stage's `affinity` on top of the GPU-type one: its required labels join every
    node selector term (all must hold), its preferred ones are one more preference."""
    user = stage.affinity
    if user is None or not (user.required or user.preferred):
        return affinity
    node: Json = dict((affinity or {}).get("nodeAffinity", {}))
    if user.required:
        key = "requiredDuringSchedulingIgnoredDuringExecution"
        terms = node.get(key, {}).get("nodeSelectorTerms") or [{"matchExpressions": []}]
        node[key] = {"nodeSelectorTerms": [
            {"matchExpressions": [*t.get("matchExpressions", []),
                                  *_expressions(user.required)]} for t in terms]}
    if user.preferred:
        key = "preferredDuringSchedulingIgnoredDuringExecution"
        node[key] = [*node.get(key, []), {
            "weight": 50, "preference": {"matchExpressions": _expressions(user.preferred)}}]
    return {"nodeAffinity": node}


def _toleration(t: catalog.Toleration) -> Json:
    out: Json = {"key": t.key, "operator": t.operator}
    if t.value is not None:
        out["value"] = t.value
    out["effect"] = t.effect
    return out


def container_resources(ctx: CompileContext, stage: Stage, variant: Variant) -> Json:
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
    if variant.gpu_count is not None:
        limits[ctx.pipeline.cluster.gpu_resource] = str(variant.gpu_count)
    out: Json = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


# -- the runtime: env, volumes, init container, sidecar ---------------------------------------


#: The input parameter through which a stage's own template hands its pods the key of their
#: inputs-scoped checkpoint line: only that template has the upstream content hashes.
LINE_KEY_PARAM = "checkpoint-key"
#: The key as a pod template that takes it from its task reads it.
LINE_KEY_FROM_TASK = "{{inputs.parameters." + LINE_KEY_PARAM + "}}"


def inputs_key_expression(plan: StagePlan, hash_inputs: dict[tuple[str, str], str]) -> str:
    """The stage's cache key as Argo evaluates it (``memo``), over the template's inputs
    ``hash_inputs``: the memoization key, and the name of an inputs-scoped checkpoint line."""
    upstream = {f"{s}.{o}": name for (s, o), name in hash_inputs.items()}
    return memo.key_expression(cache_static(plan.stage), sorted(plan.params), upstream)


def cluster_site(ctx: CompileContext, plan: StagePlan, attempt: str, *,
                 inputs: bool = True, line_key: str | None = None) -> Site:
    """The contract's pod-side values: Argo's run name, the pod's own paths.  ``line_key``:
    the text naming an inputs-scoped checkpoint line, where the template cannot compute it
    (``LINE_KEY_FROM_TASK``); by default its own key expression (a template that has the
    stage's hash inputs, or a stage with no upstream)."""
    pipeline, stage = ctx.pipeline, plan.stage
    ckpt = stage.checkpoint
    if line_key is None and plan.inputs_keyed_line:
        line_key = inputs_key_expression(plan, hash_inputs_for(plan))
    declared = {
        name: input_path(ref.path[0], ref.path[2])
        for name, ref in sorted(stage.inputs.items()) if ref.is_output
    } if inputs else {}
    return Site(
        run_id=RUN_ID, attempt=attempt, outputs=stage.outputs,
        output_hash_dir=OUTPUT_HASH_DIR, termination_log=contract.DEFAULT_TERMINATION_LOG,
        inputs=declared, store_uri=pipeline.storage,
        checkpoint_uri=checkpoint_line(pipeline.storage or "", pipeline.name, stage.name,
                                       ckpt.scope, run=RUN_ID, inputs_key=line_key or "")
        if ckpt is not None else "",
        checkpoint_path=ckpt.path if ckpt is not None else "",
        grace_seconds=grace_for_runtime(plan.pod.grace_seconds), upload_sidecar=True,
        # A JobSet's pods are no Argo pods: nothing would read their outputs.
        resume_report=RESUME_REPORT if ckpt is not None and plan.kind != "jobset" else "",
        resume_from="{{workflow.parameters." + RESUME_FROM_PARAM + "}}" if ckpt is not None
        else "",
    )


def env_list(pairs: list[tuple[str, str]]) -> list[Json]:
    """Contract variables: their values carry user text (output and checkpoint paths, the
    storage URI), which the kubelet would expand like any ``env[].value``."""
    return [{"name": name, "value": kubelet_literal(value)} for name, value in pairs]


def pod_env(ctx: CompileContext, plan: StagePlan, variant: Variant, attempt: str, *,
            inputs: bool = True, line_key: str | None = None) -> list[Json]:
    site = cluster_site(ctx, plan, attempt, inputs=inputs, line_key=line_key)
    return env_list(contract_env(ctx.pipeline, plan, variant, site))


def user_env(ctx: CompileContext, plan: StagePlan) -> list[Json]:
    env: list[Json] = []
    stage = plan.stage
    for name in sorted(stage.env):
        value = stage.env[name]
        loc: Loc = ("stages", plan.index, "env", name)
        if isinstance(value, Secret):
            ref = "configMapKeyRef" if isinstance(value, ConfigMapKey) else "secretKeyRef"
            env.append({"name": name, "valueFrom": {
                ref: {"name": value.name, "key": value.key}}})
        else:
            env.append({"name": name, "value": render_text(ctx, value, loc)})
    return env


def store_env_from(ctx: CompileContext) -> list[Json]:
    if ctx.pipeline.storage_secret:
        return [{"secretRef": {"name": ctx.pipeline.storage_secret}}]
    return []


def volumes(ctx: CompileContext, plan: StagePlan) -> list[Json]:
    out: list[Json] = [{"name": RUNTIME_VOLUME, "emptyDir": {}}]
    if ctx.options.runtime_image is None:
        out.append(runtime_delivery.volume(ctx))
    if plan.pod.checkpoint_mount is not None:
        out.append({"name": CHECKPOINT_VOLUME, "emptyDir": {}})
    if plan.pod.shm is not None:
        out.append({"name": SHM_VOLUME, "emptyDir": {
            "medium": "Memory", "sizeLimit": units.format_bytes(plan.pod.shm)}})
    out.extend(user_volume(name, v) for name, v in sorted(plan.stage.volumes.items()))
    return out


def user_volume(name: str, volume: Volume) -> Json:
    if volume.claim is not None:
        claim: Json = {"claimName": volume.claim}
        if volume.read_only:
            claim["readOnly"] = True
        return {"name": user_volume_name(name), "persistentVolumeClaim": claim}
    if volume.secret is not None:
        return {"name": user_volume_name(name), "secret": {"secretName": volume.secret}}
    return {"name": user_volume_name(name), "configMap": {"name": volume.config_map}}


def user_volume_name(name: str) -> str:
    """User volumes are prefixed so that none can take the name of the pod's own."""
    return f"v-{name}"[:63].rstrip("-")


def user_mounts(plan: StagePlan) -> list[Json]:
    out: list[Json] = []
    for name, volume in sorted(plan.stage.volumes.items()):
        mount: Json = {"name": user_volume_name(name), "mountPath": volume.path}
        if volume.read_only or volume.claim is None:
            mount["readOnly"] = True
        out.append(mount)
    return out


def _runtime_mounts(ctx: CompileContext, plan: StagePlan) -> list[Json]:
    out: list[Json] = [{"name": RUNTIME_VOLUME, "mountPath": RUNTIME_ROOT}]
    if ctx.options.runtime_image is None:
        # Nested in the emptyDir above; container runtimes mount parents first.
        out.append(runtime_delivery.mount())
    if plan.pod.checkpoint_mount is not None:
        out.append({"name": CHECKPOINT_VOLUME, "mountPath": plan.pod.checkpoint_mount})
    return out


def main_mounts(ctx: CompileContext, plan: StagePlan) -> list[Json]:
    out = _runtime_mounts(ctx, plan)
    if plan.pod.shm is not None:
        out.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    out.extend(user_mounts(plan))
    return out


def init_container(ctx: CompileContext, plan: StagePlan, *, line_key: str | None = None) -> Json:
    """With the ConfigMap delivery: a preflight in the stage's own image, so an image whose
    Python cannot run the runtime, or that has no client for the checkpoint store, fails the
    pod with a verdict line before the trainer starts.  With a runtime image: copy the
    zipapp out of it."""
    resources = {"requests": {"cpu": "50m", "memory": "32Mi"}}
    if ctx.options.runtime_image is not None:
        return {
            "name": INSTALL_CONTAINER,
            "image": ctx.options.runtime_image,
            "command": ["cp", RUNTIME_IMAGE_ZIPAPP, ZIPAPP],
            "resources": resources,
            "volumeMounts": [{
                "name": RUNTIME_VOLUME,
                "mountPath": contract.RUNTIME_INSTALL_DIR,
                "subPath": "bin",
            }],
        }
    command = ["python3", ZIPAPP, "preflight"]
    checkpoint_uri = cluster_site(ctx, plan, "", inputs=False, line_key=line_key).checkpoint_uri
    if plan.pod.sidecar and checkpoint_uri:
        command += ["--uri", kubelet_literal(checkpoint_uri)]
    init: Json = {"name": PREFLIGHT_CONTAINER, "image": plan.stage.image, "command": command}
    env_from = store_env_from(ctx)
    if env_from:
        init["envFrom"] = env_from
    init["resources"] = resources
    init["volumeMounts"] = [runtime_delivery.mount()]
    return init


def fill_main_container(ctx: CompileContext, plan: StagePlan, variant: Variant, main: Json,
                        env: list[Json]) -> Json | None:
    """Add what every stage's main container has (working dir, env, store credentials,
    resources, mounts) to ``main``; return the upload sidecar when the stage checkpoints."""
    stage = plan.stage
    if stage.workdir is not None:
        main["workingDir"] = stage.workdir
    main["env"] = env
    env_from = store_env_from(ctx)
    if env_from:
        main["envFrom"] = env_from
    resources = container_resources(ctx, stage, variant)
    if resources:
        main["resources"] = resources
    main["volumeMounts"] = main_mounts(ctx, plan)
    if not plan.pod.sidecar:
        return None
    # By exact name: what the agent reads, and nothing of the user's that merely shares the
    # prefix (a user's own DURAPIPE_* stays in the main container).
    sidecar_env = [e for e in env if e.get("name") in contract.AGENT_ENV]
    return upload_sidecar(ctx, plan, sidecar_env + POD_IDENTITY_ENV)


#: The downward API gives the agent its pod's name and namespace, for the pod-status fallback
#: (``durapipe.runtime.podstatus``) that explains an ending the wrapper could not report.
POD_IDENTITY_ENV: list[Json] = [
    {"name": contract.ENV_POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    {"name": contract.ENV_POD_NAMESPACE,
     "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
]


def upload_sidecar(ctx: CompileContext, plan: StagePlan, env: list[Json]) -> Json:
    image = ctx.options.runtime_image
    sidecar: Json = {
        "name": UPLOAD_SIDECAR,
        "image": plan.stage.image if image is None else image,
        "command": ["python3", ZIPAPP if image is None else RUNTIME_IMAGE_ZIPAPP, "agent"],
        "env": env,
    }
    env_from = store_env_from(ctx)
    if env_from:
        sidecar["envFrom"] = env_from
    sidecar["resources"] = {"requests": {"cpu": "250m", "memory": "256Mi"}}
    sidecar["volumeMounts"] = _runtime_mounts(ctx, plan)
    return sidecar


def user_argv(ctx: CompileContext, plan: StagePlan) -> tuple[list[str], list[str]]:
    """The user's command and args, rendered (a script stage's command is ``sh``)."""
    stage, index = plan.stage, plan.index
    args = [render_text(ctx, a, ("stages", index, "args", i)) for i, a in enumerate(stage.args)]
    if stage.command is None:
        return ["sh"], args
    command = [render_text(ctx, c, ("stages", index, "command", i))
               for i, c in enumerate(stage.command)]
    return command, args


def wrapped_command(ctx: CompileContext, plan: StagePlan) -> tuple[list[str], list[str]]:
    """(command, args) of the main container: the runtime wrapper, then the user's argv."""
    command, args = user_argv(ctx, plan)
    return ["python3", ZIPAPP, "exec", "--", *command], args


#: The label Kueue's pod and JobSet integrations admit an object by (its LocalQueue).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def stage_metadata(ctx: CompileContext, stage: Stage, *, queued: bool = True) -> Json:
    """The labels and annotations of a stage's pods; ``queued``: with the stage's Kueue queue
    (not on a JobSet's pods, which Kueue admits through the JobSet)."""
    labels = {LABEL_PIPELINE: ctx.pipeline.name, LABEL_STAGE: stage.name}
    queue = ctx.pipeline.queue_of(stage)
    if queued and queue is not None:
        labels[KUEUE_QUEUE_LABEL] = queue
    labels.update(stage.labels)
    meta: Json = {"labels": dict(sorted(labels.items()))}
    if stage.annotations:
        meta["annotations"] = dict(sorted(stage.annotations.items()))
    return meta


def cache_components_io(plan: StagePlan,
                        hash_inputs: dict[tuple[str, str], str]) -> tuple[Json, Json]:
    """A memoized template's input that evaluates the record of its key's components, and the
    output that hands it to Argo's memoization entry (``memo.COMPONENTS_PARAM``)."""
    upstream = {f"{s}.{o}": name for (s, o), name in hash_inputs.items()}
    value = memo.components_expression(plan.stage.name, cache_static(plan.stage),
                                       cache_parts(plan.stage), sorted(plan.params), upstream)
    return ({"name": memo.COMPONENTS_PARAM, "value": value},
            {"name": memo.COMPONENTS_PARAM,
             "valueFrom": {"expression": f"inputs.parameters['{memo.COMPONENTS_PARAM}']"}})


def memoize(ctx: CompileContext, plan: StagePlan,
            hash_inputs: dict[tuple[str, str], str]) -> Json | None:
    cache = plan.stage.cache
    if cache is None:
        return None
    key = inputs_key_expression(plan, hash_inputs)
    return {
        "key": key,
        "maxAge": units.format_seconds(cache.max_age) if cache.max_age is not None else "",
        "cache": {"configMap": {"name": naming.cache_configmap(ctx.pipeline.name,
                                                                memo.shard_expression(key))}},
    }


def hash_inputs_for(plan: StagePlan) -> dict[tuple[str, str], str]:
    """The input parameters of a stage's template that carry upstream content hashes, by
    (upstream stage, output): its cache key reads them, and so does the name of an
    inputs-scoped checkpoint line."""
    if not (plan.cached or plan.inputs_keyed_line):
        return {}
    return {(s, o): upstream_hash_input(s, o) for s, o in plan.upstream}


def resources_patch(ctx: CompileContext, *, memory: bool, gpu_count: bool) -> Json:
    """The main container's resources from the task's inputs, where one pod template serves
    several rungs or GPU types: Argo templates no container resources, ``podSpecPatch`` can."""
    limits: Json = {}
    requests: Json = {}
    if memory:
        limits["memory"] = requests["memory"] = "{{inputs.parameters.memory}}"
    if gpu_count:
        limits[ctx.pipeline.cluster.gpu_resource] = "{{inputs.parameters.gpu-count}}"
    resources: Json = {"limits": limits}
    if requests:
        resources["requests"] = requests
    return {"name": "main", "resources": resources}


def pod_spec_patch(ctx: CompileContext, plan: StagePlan, *, memory_param: bool = False,
                   gpu_count_param: bool = False) -> str | None:
    """Template ``podSpecPatch``: grace period, and the main container's memory or GPU count
    from the task's inputs (the on-demand last attempt is ``on_demand_on_last_retry``)."""
    stage = plan.stage
    patch: Json = {}
    if memory_param or gpu_count_param:
        patch["containers"] = [resources_patch(ctx, memory=memory_param,
                                               gpu_count=gpu_count_param)]
    if plan.pod.grace_seconds is not None:
        patch["terminationGracePeriodSeconds"] = plan.pod.grace_seconds
    if stage.pod_patch is not None:
        patch = strategic_merge(patch, json.loads(stage.pod_patch))
    if not patch:
        return None
    return json.dumps(patch, sort_keys=True, separators=(",", ":"))


def strategic_merge(base: Any, patch: Any) -> Any:
    """``patch`` over ``base`` as a strategic merge does for the pod spec: objects merge key
    by key (``null`` deletes), lists of named objects (containers, volumes, env) merge by
    ``name``, other lists are replaced.  Used where durapipe's own patch and the stage's
    `pod_patch` meet, and on JobSet pods, which have no ``podSpecPatch``."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = strategic_merge(base.get(key), value)
        return out
    named = (isinstance(base, list) and isinstance(patch, list)
             and all(isinstance(x, dict) and "name" in x for x in [*base, *patch]))
    if named:
        merged = list(base)
        index = {x["name"]: i for i, x in enumerate(merged)}
        for item in patch:
            if item["name"] in index:
                merged[index[item["name"]]] = strategic_merge(merged[index[item["name"]]], item)
            else:
                merged.append(item)
        return merged
    return patch
