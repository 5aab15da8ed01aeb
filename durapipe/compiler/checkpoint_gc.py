"""``checkpoint_gc { schedule max_age }``: a CronWorkflow that collects the pipeline's old
checkpoint lines (docs/lowering.md, "checkpoint_gc").

Its one pod runs the runtime's own ``checkpoints gc`` (the code ``durapipe checkpoints gc``
runs) over ``<storage>/<pipeline>``, with ``--apply`` and ``--protect-unfinished-runs``: it
lists the namespace's Workflows that have not finished and keeps every line one of them has
claimed or resumes from, and removes nothing when it cannot list them.  So the account it runs
as needs ``list`` of ``workflows`` (``rbac.rules`` adds it), besides the store's credentials,
which it reads from the same ``storage_secret`` as the stages.

It runs in the image the runtime is delivered to anyway (the block's ``image``, else the
first checkpointing stage's: every stage image runs the runtime's Python), with the runtime
ConfigMap mounted as in every stage pod; with ``--runtime-image``, in that image.
"""

from __future__ import annotations

import hashlib
from typing import Any

from durapipe.compiler import naming, runtime_delivery
from durapipe.compiler.argo_pod import (
    KUEUE_QUEUE_LABEL,
    LABEL_PIPELINE,
    MANAGED_BY,
    ZIPAPP,
    store_env_from,
)
from durapipe.compiler.context import CompileContext
from durapipe.compiler.options import RUNTIME_IMAGE_ZIPAPP
from durapipe.compiler.plan import kubelet_literal, pipeline_lines_root
from durapipe.dsl.model import CheckpointGc

Json = dict[str, Any]

API_VERSION = "argoproj.io/v1alpha1"
#: Marks the collector's objects, so that ``durapipe submit`` of the compiled file starts the
#: pipeline's run and never the collector.
LABEL_ROLE = "durapipe.dev/role"
ROLE = "checkpoint-gc"
SUFFIX = "-ckpt-gc"
TEMPLATE = "collect"
#: A pass lists the store and reads each line's claims; hours would mean a stuck store, and
#: the next night's pass starts over (``concurrencyPolicy: Forbid`` keeps two apart).
DEADLINE_SECONDS = 6 * 3600
RETRIES = 2


def cron_name(pipeline: str) -> str:
    """``<pipeline>-ckpt-gc``, or a shortened pipeline name with a hash of the whole where
    that is over Argo's 52 characters for a CronWorkflow."""
    name = pipeline + SUFFIX
    if len(name) <= naming.MAX_CRON_NAME:
        return name
    digest = hashlib.sha256(pipeline.encode()).hexdigest()[:6]
    keep = naming.MAX_CRON_NAME - len(SUFFIX) - len(digest) - 1
    return f"{pipeline[:keep].rstrip('-')}-{digest}{SUFFIX}"


def is_collector(doc: Any) -> bool:
    """Whether ``doc`` is a compiled collector (which a submission of the file leaves out)."""
    if not isinstance(doc, dict):
        return False
    labels = (doc.get("metadata") or {}).get("labels") or {}
    return isinstance(labels, dict) and labels.get(LABEL_ROLE) == ROLE


def collector_image(ctx: CompileContext, gc: CheckpointGc) -> str:
    if ctx.options.runtime_image is not None:
        return ctx.options.runtime_image
    if gc.image is not None:
        return gc.image
    # The validator (P0346) makes sure a stage checkpoints when the block names no image.
    return next(s.image for s in ctx.pipeline.stages if s.checkpoint is not None)


def command(ctx: CompileContext, gc: CheckpointGc) -> list[str]:
    assert ctx.pipeline.storage is not None  # P0317 otherwise
    zipapp = ZIPAPP if ctx.options.runtime_image is None else RUNTIME_IMAGE_ZIPAPP
    root = pipeline_lines_root(ctx.pipeline.storage, ctx.pipeline.name)
    return ["python3", zipapp, "checkpoints", "gc", kubelet_literal(root),
            "--max-age", f"{gc.max_age}s", "--apply", "--protect-unfinished-runs"]


def labels(ctx: CompileContext, *, pod: bool = False) -> Json:
    """The collector's labels; on its pod, the pipeline's Kueue queue too (a cluster where
    Kueue manages every pod would never start one without)."""
    out = {**MANAGED_BY, LABEL_PIPELINE: ctx.pipeline.name, LABEL_ROLE: ROLE}
    if pod and ctx.pipeline.queue is not None:
        out[KUEUE_QUEUE_LABEL] = ctx.pipeline.queue
    return dict(sorted({**out, **ctx.pipeline.labels}.items()))


def container(ctx: CompileContext, gc: CheckpointGc) -> Json:
    out: Json = {"image": collector_image(ctx, gc), "command": command(ctx, gc)}
    env_from = store_env_from(ctx)
    if env_from:
        out["envFrom"] = env_from
    out["resources"] = {"requests": {"cpu": "100m", "memory": "128Mi"},
                        "limits": {"memory": "512Mi"}}
    if ctx.options.runtime_image is None:
        out["volumeMounts"] = [runtime_delivery.mount()]
    return out


def workflow_spec(ctx: CompileContext, gc: CheckpointGc) -> Json:
    pipeline = ctx.pipeline
    template: Json = {
        "name": TEMPLATE,
        "metadata": {"labels": labels(ctx, pod=True)},
        # A store that failed for a moment; the pass is idempotent, so a retry only redoes it.
        "retryStrategy": {"limit": RETRIES, "retryPolicy": "Always",
                          "backoff": {"duration": "1m", "factor": 2}},
        "container": container(ctx, gc),
    }
    spec: Json = {"entrypoint": TEMPLATE, "activeDeadlineSeconds": DEADLINE_SECONDS}
    account = pipeline.service_account or ctx.options.service_account
    if account:
        spec["serviceAccountName"] = account
    if pipeline.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": n} for n in pipeline.image_pull_secrets]
    if ctx.options.runtime_image is None:
        spec["volumes"] = [runtime_delivery.volume(ctx)]
    spec["templates"] = [template]
    return spec


def cron_workflow(ctx: CompileContext, gc: CheckpointGc) -> Json:
    """The collector's CronWorkflow, in the pipeline's namespace and time zone."""
    pipeline = ctx.pipeline
    meta: Json = {"name": cron_name(pipeline.name)}
    if pipeline.namespace:
        meta["namespace"] = pipeline.namespace
    meta["labels"] = labels(ctx)
    if pipeline.annotations:
        meta["annotations"] = dict(sorted(pipeline.annotations.items()))
    cron: Json = {"schedules": [gc.schedule]}
    if pipeline.timezone:
        cron["timezone"] = pipeline.timezone
    cron["concurrencyPolicy"] = "Forbid"
    cron["successfulJobsHistoryLimit"] = 3
    cron["failedJobsHistoryLimit"] = 3
    cron["workflowSpec"] = workflow_spec(ctx, gc)
    return {"apiVersion": API_VERSION, "kind": "CronWorkflow", "metadata": meta, "spec": cron}
