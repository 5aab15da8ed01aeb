"""Multi-node stages: an Argo resource template that creates a JobSet running torchrun.

One replicated job of ``replicas`` pods (an Indexed Job, so ``JOB_COMPLETION_INDEX`` is the node
rank); JobSet's headless service gives pod 0 the stable name torchrun's static rendezvous
needs.  ``max_restarts`` maps to ``failurePolicy.maxRestarts``; with
``restart_on_maintenance`` a pod disrupted by the node (DisruptionTarget: preemption, drain,
host maintenance) fails its Job through a ``podFailurePolicy`` rule, and a JobSet rule restarts
the whole set for that reason without counting it.  Argo waits on the scalar
``status.terminalState`` JobSet publishes for exactly this use.
"""

from __future__ import annotations

from typing import Any

from durapipe.compiler.lower import (
    ZIPAPP,
    Context,
    LoweredStage,
    StageIO,
    Variant,
    cache_static,
    contract_env,
    fill_main_container,
    grace_seconds,
    init_container,
    is_on,
    memoize,
    render_text,
    scheduling,
    stage_metadata,
    user_env,
    volumes,
)
from durapipe.compiler.serialize import dump_document
from durapipe.dsl.model import Stage
from durapipe.runtime import contract

Json = dict[str, Any]

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
REPLICATED_JOB = "node"
MASTER_PORT = 29500
ENV_JOBSET_NAME = "DURAPIPE_JOBSET_NAME"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
RESTART_ANNOTATION = "jobset.sigs.k8s.io/restart-attempt"
SUCCESS_CONDITION = "status.terminalState == Completed"
FAILURE_CONDITION = "status.terminalState == Failed"


def torchrun_argv(replicas: int, procs: int, user: list[str]) -> list[str]:
    """``torchrun`` with a static rendezvous on pod 0 of the JobSet, then the user's program.

    ``python``/``python3`` in front of a script or ``-m module`` is dropped (torchrun runs
    Python itself); any other program runs with ``--no-python``.
    """
    head = [
        "torchrun",
        f"--nnodes={replicas}",
        f"--nproc-per-node={procs}",
        "--node-rank=$(JOB_COMPLETION_INDEX)",
        f"--master-addr=$({ENV_JOBSET_NAME})-{REPLICATED_JOB}-0-0.$({ENV_JOBSET_NAME})",
        f"--master-port={MASTER_PORT}",
    ]
    if user and user[0] in ("python", "python3"):
        rest = user[1:]
        if rest[:1] == ["-m"]:
            return head + ["--module"] + rest[1:]
        return head + rest
    return head + ["--no-python"] + user


def lower_distributed(ctx: Context, index: int, stage: Stage, task: str) -> LoweredStage:
    dist = stage.distributed
    assert dist is not None
    loc: tuple[object, ...] = ("stages", index)
    gpu = stage.resources.gpu
    if stage.outputs:
        ctx.error("P0407", f"multi-node stage `{stage.name}` cannot declare outputs",
                  (*loc, "outputs"))
    if stage.retry.on_oom is not None and len(stage.retry.on_oom.memory) > 1:
        ctx.error("P0407", f"multi-node stage `{stage.name}` cannot use an OOM ladder",
                  (*loc, "retry", "on_oom"))
    if gpu is not None and gpu.fallback_after is not None:
        ctx.error("P0407", f"multi-node stage `{stage.name}` cannot fall back between GPU types",
                  (*loc, "resources", "gpu", "fallback_after"))
    if stage.script is not None:
        ctx.error("P0407", f"multi-node stage `{stage.name}` needs an exec-form `command`",
                  (*loc, "script"))

    io = StageIO()
    user = [render_text(ctx, c, io, (*loc, "command", i))
            for i, c in enumerate(stage.command or ())]
    user += [render_text(ctx, a, io, (*loc, "args", i)) for i, a in enumerate(stage.args)]
    env_user = user_env(ctx, index, stage, io)
    if io.upstream or stage.inputs:
        ctx.error("P0407", f"multi-node stage `{stage.name}` cannot read upstream outputs "
                  "(Argo artifacts reach only Argo's own pods)", loc)

    memory = stage.retry.on_oom.memory[0] if stage.retry.on_oom else stage.resources.memory
    variant = Variant(
        name=task, rung=0, memory=memory,
        gpu=gpu.types[0] if gpu is not None and gpu.types else None, pending_timeout=None,
    )
    env: list[Json] = [
        {"name": ENV_JOBSET_NAME, "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.labels['{JOBSET_NAME_LABEL}']"}}},
    ]
    for item in contract_env(ctx, stage, variant, attempt="", declared_inputs={}):
        if item["name"] == contract.ENV_ATTEMPT:
            env.append({"name": contract.ENV_ATTEMPT, "valueFrom": {"fieldRef": {
                "fieldPath": f"metadata.annotations['{RESTART_ANNOTATION}']"}}})
        else:
            env.append(item)
    main: Json = {
        "name": "main",
        "image": stage.image,
        "command": ["python3", ZIPAPP, "exec", "--",
                    *torchrun_argv(dist.replicas, dist.procs_per_node, user)],
    }
    sidecar = fill_main_container(ctx, stage, variant, main, env + env_user)
    containers = [main] if sidecar is None else [main, sidecar]

    pod_spec: Json = {"restartPolicy": "Never"}
    grace = grace_seconds(ctx, stage)
    if grace is not None:
        pod_spec["terminationGracePeriodSeconds"] = grace
    if ctx.pipeline.service_account:
        pod_spec["serviceAccountName"] = ctx.pipeline.service_account
    pod_spec.update(scheduling(ctx, index, stage, variant))
    pod_spec["initContainers"] = [init_container(ctx)]
    pod_spec["containers"] = containers
    pod_spec["volumes"] = volumes(stage)

    job_spec: Json = {
        "parallelism": dist.replicas,
        "completions": dist.replicas,
        "completionMode": "Indexed",
        "backoffLimit": 0,
    }
    if stage.timeout is not None:
        job_spec["activeDeadlineSeconds"] = stage.timeout
    if dist.restart_on_maintenance:
        job_spec["podFailurePolicy"] = {"rules": [{
            "action": "FailJob",
            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
        }]}
    meta = stage_metadata(ctx, stage)
    job_spec["template"] = {"metadata": meta, "spec": pod_spec}

    failure_policy: Json = {"maxRestarts": dist.max_restarts}
    if dist.restart_on_maintenance:
        failure_policy["rules"] = [{
            "name": "host-maintenance",
            "action": "RestartJobSetAndIgnoreMaxRestarts",
            "onJobFailureReasons": ["PodFailurePolicy"],
        }]
    manifest: Json = {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": {
            "generateName": f"{{{{workflow.name}}}}-{stage.name}-",
            "labels": meta["labels"],
        },
        "spec": {
            "failurePolicy": failure_policy,
            "successPolicy": {"operator": "All"},
            "replicatedJobs": [{
                "name": REPLICATED_JOB,
                "replicas": 1,
                "template": {"spec": job_spec},
            }],
        },
    }
    template: Json = {
        "name": task,
        "outputs": {"parameters": [{"name": "jobset-name", "valueFrom": {
            "jsonPath": "{.metadata.name}"}}]},
        "metadata": meta,
    }
    m = memoize(ctx, stage, cache_static(stage) if is_on(stage.cache) else "", io, {})
    if m is not None:
        template["memoize"] = m
    template["resource"] = {
        "action": "create",
        "setOwnerReference": True,
        "successCondition": SUCCESS_CONDITION,
        "failureCondition": FAILURE_CONDITION,
        "manifest": dump_document(manifest),
    }
    return LoweredStage(stage, task, task, [template], io, {})
