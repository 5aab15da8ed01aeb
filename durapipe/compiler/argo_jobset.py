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

import json

from typing import Any

from durapipe.compiler.argo_pod import (
    KUEUE_QUEUE_LABEL,
    ZIPAPP,
    fill_main_container,
    init_container,
    memoize,
    pod_env,
    scheduling,
    strategic_merge,
    stage_metadata,
    user_env,
    volumes,
)
from durapipe.compiler.argo_text import render_text
from durapipe.compiler.context import CompileContext
from durapipe.compiler.plan import StagePlan
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
#: JobSet's webhook refuses rule names outside ``^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$``
#: (no hyphens: jobset v0.12.0 pkg/webhooks/jobset_webhook.go, ``ruleNameFmt``).
MAINTENANCE_RULE = "HostMaintenance"


def torchrun_argv(replicas: int, procs: int, user: list[str]) -> list[str]:
    """``torchrun`` with a static rendezvous on pod 0 of the JobSet, then the user's program.

    ``python``/``python3`` in front of a script or ``-m module`` is dropped (torchrun runs
    Python itself); any other program runs with ``--no_python``.

    The flags are spelled with underscores, the only spelling torchrun had before PyTorch 2.0
    (1.13's ``torch/distributed/run.py``: ``--nproc_per_node``, ``--node_rank``, ...); 2.x
    takes both.  The hyphenated forms stop a 1.x image at argument parsing (Debian bookworm's
    ``python3-torch`` is 1.13.1: tests/realnode/test_multinode.py runs it).
    """
    head = [
        "torchrun",
        f"--nnodes={replicas}",
        f"--nproc_per_node={procs}",
        "--node_rank=$(JOB_COMPLETION_INDEX)",
        f"--master_addr=$({ENV_JOBSET_NAME})-{REPLICATED_JOB}-0-0.$({ENV_JOBSET_NAME})",
        f"--master_port={MASTER_PORT}",
    ]
    if user and user[0] in ("python", "python3"):
        rest = user[1:]
        if rest[:1] == ["-m"]:
            return head + ["--module"] + rest[1:]
        return head + rest
    return head + ["--no_python"] + user


def check_distributed(ctx: CompileContext, plan: StagePlan) -> None:
    """What a JobSet cannot carry: outputs and inputs (Argo artifacts reach only Argo's own
    pods), an OOM ladder, GPU fallback, a script."""
    stage, loc = plan.stage, ("stages", plan.index)
    gpu = stage.resources.gpu
    if stage.outputs:
        ctx.error("P0407", f"multi-node stage `{stage.name}` cannot declare outputs",
                  (*loc, "outputs"))
    if plan.has_ladder:
        ctx.error("P0407", f"multi-node stage `{stage.name}` cannot use an OOM ladder",
                  (*loc, "retry", "on_oom"))
    if gpu is not None and gpu.fallback_after is not None:
        ctx.error("P0407", f"multi-node stage `{stage.name}` cannot fall back between GPU types",
                  (*loc, "resources", "gpu", "fallback_after"))
    if stage.script is not None:
        ctx.error("P0407", f"multi-node stage `{stage.name}` needs an exec-form `command`",
                  (*loc, "script"))
    if plan.upstream or stage.inputs:
        ctx.error("P0407", f"multi-node stage `{stage.name}` cannot read upstream outputs "
                  "(Argo artifacts reach only Argo's own pods)", loc)


def jobset_env(ctx: CompileContext, plan: StagePlan) -> list[Json]:
    """The contract environment, with the JobSet's name and its restart count as the attempt."""
    env: list[Json] = [
        {"name": ENV_JOBSET_NAME, "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.labels['{JOBSET_NAME_LABEL}']"}}},
    ]
    for item in pod_env(ctx, plan, plan.variants[0], "", inputs=False):
        if item["name"] == contract.ENV_ATTEMPT:
            env.append({"name": contract.ENV_ATTEMPT, "valueFrom": {"fieldRef": {
                "fieldPath": f"metadata.annotations['{RESTART_ANNOTATION}']"}}})
        else:
            env.append(item)
    return env


def node_pod_spec(ctx: CompileContext, plan: StagePlan) -> Json:
    """The pod of each node: torchrun under the runtime wrapper."""
    stage, dist, variant = plan.stage, plan.stage.distributed, plan.variants[0]
    assert dist is not None
    loc = ("stages", plan.index)
    user = [render_text(ctx, c, (*loc, "command", i)) for i, c in enumerate(stage.command or ())]
    user += [render_text(ctx, a, (*loc, "args", i)) for i, a in enumerate(stage.args)]
    env_user = user_env(ctx, plan)
    main: Json = {
        "name": "main",
        "image": stage.image,
        "command": ["python3", ZIPAPP, "exec", "--",
                    *torchrun_argv(dist.replicas, dist.procs_per_node, user)],
    }
    sidecar = fill_main_container(ctx, plan, variant, main, jobset_env(ctx, plan) + env_user)
    pod_spec: Json = {"restartPolicy": "Never"}
    if plan.pod.grace_seconds is not None:
        pod_spec["terminationGracePeriodSeconds"] = plan.pod.grace_seconds
    account = ctx.pipeline.service_account or ctx.options.service_account
    if account:
        pod_spec["serviceAccountName"] = account
    if ctx.pipeline.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in ctx.pipeline.image_pull_secrets]
    pod_spec.update(scheduling(ctx, plan, variant))
    # The uploader is a native sidecar (an init container that keeps running): a Job pod
    # completes only when its regular containers have, and nothing SIGTERMs a plain sidecar
    # there, so as a plain container it would keep every node's pod Running for ever.  After
    # the preflight init container, which fails the pod early when the store cannot be opened.
    inits = [init_container(ctx, plan)]
    if sidecar is not None:
        inits.append({**sidecar, "restartPolicy": "Always"})
    pod_spec["initContainers"] = inits
    pod_spec["containers"] = [main]
    pod_spec["volumes"] = volumes(ctx, plan)
    if stage.pod_patch is not None:  # a JobSet pod has no podSpecPatch: applied here
        patched: Json = strategic_merge(pod_spec, json.loads(stage.pod_patch))
        return patched
    return pod_spec


def jobset_labels(ctx: CompileContext, stage: Stage, meta: Json) -> Json:
    """The JobSet's labels: its pods', and the Kueue queue, by which Kueue's JobSet
    integration admits the whole JobSet as one workload (its pods carry none)."""
    labels = dict(meta["labels"])
    queue = ctx.pipeline.queue_of(stage)
    if queue is not None:
        labels[KUEUE_QUEUE_LABEL] = queue
    return dict(sorted(labels.items()))


def jobset_manifest(ctx: CompileContext, plan: StagePlan, meta: Json) -> Json:
    stage, dist = plan.stage, plan.stage.distributed
    assert dist is not None
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
    job_spec["template"] = {"metadata": meta, "spec": node_pod_spec(ctx, plan)}
    failure_policy: Json = {"maxRestarts": dist.max_restarts}
    if dist.restart_on_maintenance:
        failure_policy["rules"] = [{
            "name": MAINTENANCE_RULE,
            "action": "RestartJobSetAndIgnoreMaxRestarts",
            "onJobFailureReasons": ["PodFailurePolicy"],
        }]
    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": {
            "generateName": f"{{{{workflow.name}}}}-{stage.name}-",
            "labels": jobset_labels(ctx, stage, meta),
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


def lower_jobset(ctx: CompileContext, plan: StagePlan) -> Json:
    """The resource template of a multi-node stage."""
    check_distributed(ctx, plan)
    manifest = jobset_manifest(ctx, plan, stage_metadata(ctx, plan.stage, queued=False))
    template: Json = {
        "name": plan.task,
        "outputs": {"parameters": [{"name": "jobset-name", "valueFrom": {
            "jsonPath": "{.metadata.name}"}}]},
        # The executor's pod that creates the JobSet is a pod like any: on the queue too.
        "metadata": stage_metadata(ctx, plan.stage),
    }
    m = memoize(ctx, plan, {})
    if m is not None:
        template["memoize"] = m
    template["resource"] = {
        "action": "create",
        "setOwnerReference": True,
        "successCondition": SUCCESS_CONDITION,
        "failureCondition": FAILURE_CONDITION,
        "manifest": dump_document(manifest),
    }
    return template
