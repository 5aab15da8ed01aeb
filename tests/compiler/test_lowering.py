"""Focused tests, one construct at a time: the exact Argo text each construct lowers to."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from durapipe.compiler import CompileOptions, CompileResult, compile_pipeline, memo
from durapipe.compiler import argo_retry as retry
from durapipe.compiler.plan import cache_parts, cache_static
from durapipe.runtime import contract
from tests.compiler.models import (
    GI,
    Cache,
    Checkpoint,
    Cluster,
    Distributed,
    Gpu,
    GpuChoice,
    Interp,
    OnOom,
    Param,
    Ref,
    Resources,
    Retry,
    fallback_gpu,
    ladder_stage,
    pipeline,
    prep_train_eval,
    spot_stage,
    stage,
)

Json = dict[str, Any]


def compiled(p: Any, **options: Any) -> CompileResult:
    result = compile_pipeline(p, CompileOptions(**options))
    assert result.ok, [d.message for d in result.diagnostics]
    return result


def codes(p: Any, **options: Any) -> list[str]:
    return [d.code for d in compile_pipeline(p, CompileOptions(**options)).diagnostics]


def templates(result: CompileResult) -> dict[str, Json]:
    out: dict[str, Json] = {}
    for doc in result.documents:
        spec = doc["spec"].get("workflowSpec", doc["spec"])
        for t in spec["templates"]:
            out[t["name"]] = t
    return out


def dag_tasks(ts: dict[str, Json], stage_task: str = "train") -> dict[str, Json]:
    return {t["name"]: t for t in ts[stage_task]["dag"]["tasks"]}


def pod(ts: dict[str, Json], task: str, stage_task: str = "train") -> Json:
    """The template a task of a stage DAG runs (tasks that differ only in their attempt
    numbers share one)."""
    return ts[dag_tasks(ts, stage_task)[task]["template"]]


def resolved(ts: dict[str, Json], task: str, stage_task: str = "train") -> Json:
    """The pod template a task runs, with the ``{{inputs.parameters.X}}`` tags it fills in
    replaced by what it passes (as Argo substitutes them)."""
    call = dag_tasks(ts, stage_task)[task]
    text = json.dumps(ts[call["template"]])
    for param in call.get("arguments", {}).get("parameters", []):
        text = text.replace("{{inputs.parameters." + param["name"] + "}}", param["value"])
    out: Json = json.loads(text)
    return out


def first_attempt(ts: dict[str, Json], task: str, stage_task: str = "train") -> str:
    """The first attempt a task passes to its shared pod template."""
    params = dag_tasks(ts, stage_task)[task]["arguments"]["parameters"]
    assert params[0]["name"] == "attempt"
    return str(params[0]["value"])


def env_of(template: Json) -> dict[str, str]:
    main = template.get("container") or template.get("script")
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in main["env"]}


PREEMPTED = (
    "(lastRetry.exitCode == '143' || lastRetry.message contains 'pod deleted' || "
    "lastRetry.message contains 'neither main nor wait container completed successfully' || "
    "lastRetry.message contains 'imminent node shutdown' || lastRetry.message contains 'Evicted' || "
    "lastRetry.message contains 'evicted' || lastRetry.message contains 'The node was low on resource' || "
    "lastRetry.message contains 'DisruptionTarget' || lastRetry.message contains 'PreemptionByScheduler' || "
    "lastRetry.message contains 'durapipe-verdict:preempted')"
)
#: How a task reads the count its predecessor reported (``argo_retry.reported``).
REPORTED = ("{{{{=(tasks['{task}'].status != '' ? (get(get(get(tasks['{task}'], 'outputs'), "
            "'parameters'), 'preempted') ?? '{budget}') : '{budget}')}}}}")
GPU_OOM = "(lastRetry.exitCode == '86' || lastRetry.message contains 'durapipe-verdict:gpu_oom')"
OOM = "(lastRetry.message contains 'OOMKilled' || lastRetry.message contains 'durapipe-verdict:host_oom')"


# -- retries ----------------------------------------------------------------------------------


def test_each_task_retries_preemptions_only_with_the_preemption_budget() -> None:
    t = templates(compiled(pipeline(spot_stage())))["train"]
    assert t["retryStrategy"] == {
        "limit": "5",
        "retryPolicy": "Always",
        "expression": PREEMPTED,
    }  # no backoff: Argo would wait it before every failure that leaves the task too
    assert env_of(t)[contract.ENV_ATTEMPT] == "{{retries}}"


def test_application_attempts_are_separate_tasks_chained_on_application_failure() -> None:
    ts = templates(compiled(pipeline(stage(retry=Retry(attempts=2, preemptions=3)))))
    grid = {t["name"]: t for t in ts["train"]["dag"]["tasks"]}
    assert list(grid) == ["train-app-0", "train-app-1", "train-app-2", "train-done"]
    assert grid["train-app-1"]["depends"] == "train-app-0.Failed || train-app-0.Errored"
    assert grid["train-app-1"]["when"] == (
        "{{=(tasks['train-app-0'].status == 'Failed' && "
        "!((get(tasks['train-app-0'], 'exitCode') ?? '') in ['', '-1', '143', '86']))}}"
    )
    # The three attempts run the same pod, written once; each task passes its first attempt.
    assert {grid[f"train-app-{k}"]["template"] for k in range(3)} == {"train-pod"}
    assert "train-app-0" not in ts
    assert ts["train-pod"]["inputs"] == {"parameters": [{"name": "attempt"},
                                                        {"name": "preempted-before"}]}
    # One preemption budget for the stage: each task retries what is left of it, and reports
    # what it spent (the wait container saves the default, whatever main's exit code).
    assert ts["train-pod"]["retryStrategy"]["limit"] == (
        "{{=3 - asInt(inputs.parameters['preempted-before'])}}")
    assert ts["train-pod"]["retryStrategy"]["expression"] == PREEMPTED
    assert ts["train-pod"]["outputs"]["parameters"] == [{"name": "preempted", "valueFrom": {
        "path": "/var/run/durapipe/preempted",
        "default": "{{=asInt(inputs.parameters['preempted-before']) + asInt(retries)}}"}}]
    assert env_of(ts["train-pod"])[contract.ENV_ATTEMPT] == (
        "{{=asInt(inputs.parameters.attempt) + asInt(inputs.parameters['preempted-before'])"
        " + asInt(retries)}}")
    # Attempt numbers run on: application failures before the task, plus the preemptions.
    assert [first_attempt(ts, f"train-app-{k}") for k in range(3)] == ["0", "1", "2"]
    passed = [dag_tasks(ts)[f"train-app-{k}"]["arguments"]["parameters"][1] for k in range(3)]
    # Read nil-safe: a task result that never came (main's exit reported, then the node
    # lost) passes the whole budget rather than requeueing the workflow for ever.
    assert passed == [{"name": "preempted-before", "value": v} for v in (
        "0", REPORTED.format(task="train-app-0", budget=3),
        REPORTED.format(task="train-app-1", budget=3))]


def test_without_an_application_budget_only_preemptions_retry() -> None:
    t = templates(compiled(pipeline(stage())))["train"]
    assert t["retryStrategy"] == {"limit": "3", "retryPolicy": "Always", "expression": PREEMPTED}


def test_gpu_oom_retry_policy_makes_cuda_oom_an_application_failure() -> None:
    s = stage(retry=Retry(attempts=1, preemptions=0, gpu_oom="retry"))
    ts = templates(compiled(pipeline(s)))
    assert "retryStrategy" not in pod(ts, "train-app-0")
    when = dag_tasks(ts)["train-app-1"]["when"]
    assert "['', '-1', '143']" in when
    assert env_of(pod(ts, "train-app-1"))[contract.ENV_ATTEMPT] == "{{inputs.parameters.attempt}}"
    assert first_attempt(ts, "train-app-1") == "1"
    assert env_of(pod(ts, "train-app-0"))[contract.ENV_GPU_OOM_POLICY] == "retry"


def test_no_budgets_means_no_retry_strategy_and_attempt_zero() -> None:
    t = templates(compiled(pipeline(stage(retry=Retry(preemptions=0)))))["train"]
    assert "retryStrategy" not in t
    assert env_of(t)[contract.ENV_ATTEMPT] == "0"


def test_backoff_waits_before_each_application_retry_with_its_factor_and_cap() -> None:
    s = stage(retry=Retry(attempts=4, backoff=60, backoff_factor=3, max_backoff=600))
    ts = templates(compiled(pipeline(s)))
    dag = {t["name"]: t for t in ts["train"]["dag"]["tasks"]}
    waits = [dag[f"train-app-{k}-backoff"] for k in range(4)]
    assert [w["arguments"]["parameters"] for w in waits] == [
        [{"name": "duration", "value": v}] for v in ("1m", "3m", "9m", "10m")]
    assert waits[0]["depends"] == "train-app-0.Failed || train-app-0.Errored"
    assert waits[0]["when"] == "{{=" + retry.app_failure_condition(
        "train-app-0", "fail", has_ladder=False) + "}}"
    assert dag["train-app-1"]["depends"] == "train-app-0-backoff.Succeeded"
    assert "when" not in dag["train-app-1"]
    assert "train-app-4-backoff" not in dag  # the last failure waits for nothing


def test_retry_markers_come_from_the_runtime_contract() -> None:
    assert contract.verdict_marker(contract.VERDICT_PREEMPTED) in retry.preempted()
    assert contract.verdict_marker(contract.VERDICT_HOST_OOM) in retry.oom()
    assert f"'{contract.EXIT_PREEMPTED}'" in retry.preempted()


# -- OOM ladder -------------------------------------------------------------------------------


def test_oom_ladder_unrolls_into_rung_tasks_with_exact_conditions() -> None:
    result = compiled(pipeline(ladder_stage()))
    ts = templates(result)
    grid = ts["train"]["dag"]["tasks"]
    assert [t["name"] for t in grid] == [
        "train-mem-256gi", "train-mem-512gi", "train-mem-1ti", "train-oom-exhausted", "train-done",
    ]
    assert grid[1]["depends"] == "train-mem-256gi.Failed || train-mem-256gi.Errored"
    assert grid[1]["when"] == (
        "{{=(tasks['train-mem-256gi'].status == 'Failed' && "
        "get(tasks['train-mem-256gi'], 'exitCode') == '137')}}"
    )
    assert grid[3]["depends"] == "train-mem-1ti.Failed"
    assert grid[4]["depends"] == (
        "train-mem-256gi.Succeeded || train-mem-512gi.Succeeded || train-mem-1ti.Succeeded"
        " || train-oom-exhausted.Succeeded"
    )
    # One pod for every rung: each rung's task passes its rung and memory, and the template's
    # podSpecPatch sets the main container's memory from them.
    assert {t["template"] for t in grid[:3]} == {"train-pod"}
    leaf = ts["train-pod"]
    assert [p["name"] for p in leaf["inputs"]["parameters"]] == [
        "attempt", "preempted-before", "rung", "memory", "memory-bytes", "checkpoint-key"]
    assert "memory" not in leaf["container"].get("resources", {}).get("limits", {})
    patch = json.loads(leaf["podSpecPatch"])
    assert patch["containers"] == [{"name": "main", "resources": {
        "limits": {"memory": "{{inputs.parameters.memory}}"},
        "requests": {"memory": "{{inputs.parameters.memory}}"}}}]
    env = env_of(leaf)
    assert env[contract.ENV_RUNG] == "{{inputs.parameters.rung}}"
    assert env[contract.ENV_MEMORY_LIMIT] == "{{inputs.parameters.memory-bytes}}"
    for rung, size in enumerate(("256Gi", "512Gi", "1Ti")):
        args = {p["name"]: p["value"] for p in grid[rung]["arguments"]["parameters"]}
        # The rung's first attempt follows its OOM climbs; the preemptions spent below it
        # come from the rung that ran out of memory.
        spent = "0" if rung == 0 else REPORTED.format(task=grid[rung - 1]["name"], budget=2)
        assert args == {"attempt": str(rung), "preempted-before": spent, "rung": str(rung),
                        "memory": size,
                        "memory-bytes": str({0: 256, 1: 512, 2: 1024}[rung] * GI),
                        "checkpoint-key": grid[0]["arguments"]["parameters"][-1]["value"]}
    # An OOM kill is never retried on the same rung; the next rung's task runs instead.
    assert leaf["retryStrategy"]["expression"] == PREEMPTED
    assert leaf["retryStrategy"]["limit"] == "{{=2 - asInt(inputs.parameters['preempted-before'])}}"
    # Every rung resumes from the same checkpoint line (named by the stage's inputs, never by
    # rung): each task passes the one key, and the one template holds the line.
    assert env[contract.ENV_CHECKPOINT_URI].endswith(
        "/inputs/train/{{inputs.parameters.checkpoint-key}}/checkpoints")
    exhausted = ts["train-oom-exhausted"]["container"]
    assert "ran out of memory at every size" in exhausted["command"][2]
    assert "256Gi, 512Gi, 1Ti" in exhausted["command"][2]
    assert exhausted["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # The join is pod-less and holds nothing of the stage: one template serves every stage.
    assert ts["durapipe-join"] == {"name": "durapipe-join", "suspend": {"duration": "0"}}
    assert [t["template"] for t in grid if t["name"] == "train-done"] == ["durapipe-join"]


def test_checkpoint_uri_is_keyed_by_inputs_run_or_pipeline_and_stage_never_attempt() -> None:
    # The default, by inputs: the stage's cache key, as its memoization computes it, whether
    # it caches or not; a grid's tasks hand it to the pod (only the grid has the hashes).
    for cache in (None, Cache(version="v3")):
        ladder = replace(ladder_stage(), cache=cache)
        ts = templates(compiled(pipeline(ladder, storage="s3://b/p")))
        keyed = env_of(pod(ts, "train-mem-1ti"))
        assert keyed[contract.ENV_CHECKPOINT_URI] == (
            "s3://b/p/demo/inputs/train/{{inputs.parameters.checkpoint-key}}/checkpoints")
        key = memo.key_expression(cache_static(ladder), [], {})
        assert {t["name"]: [p["value"] for p in t["arguments"]["parameters"]
                            if p["name"] == "checkpoint-key"]
                for t in ts["train"]["dag"]["tasks"] if "-mem-" in t["name"]} == {
            "train-mem-256gi": [key], "train-mem-512gi": [key], "train-mem-1ti": [key]}
        if cache is not None:
            assert ts["train"]["memoize"]["key"] == key
    # A single pod computes it itself, over the upstream hashes it receives even uncached.
    uncached = replace(prep_train_eval(), stages=tuple(
        replace(s, cache=None, checkpoint=Checkpoint()) for s in prep_train_eval().stages))
    train = templates(compiled(uncached))["train"]
    assert [p["name"] for p in train["inputs"]["parameters"]] == ["prep-data-hash"]
    assert "'upstream': {'prep.data': inputs.parameters['prep-data-hash']}" in \
        env_of(train)[contract.ENV_CHECKPOINT_URI]
    run_scoped = stage(checkpoint=Checkpoint(scope="run"))
    run = env_of(templates(compiled(pipeline(run_scoped, storage="s3://b/p")))["train"])
    assert run[contract.ENV_CHECKPOINT_URI] == "s3://b/p/demo/runs/{{workflow.name}}/train/checkpoints"
    s = stage(checkpoint=Checkpoint(scope="pipeline", path="/ckpt", keep=5))
    env = env_of(templates(compiled(pipeline(s, storage="s3://b/p")))["train"])
    assert env[contract.ENV_CHECKPOINT_URI] == "s3://b/p/demo/stages/train/checkpoints"
    assert env[contract.ENV_CHECKPOINT_PATH] == "/ckpt"
    assert env[contract.ENV_CHECKPOINT_KEEP] == "5"


# -- runtime injection ------------------------------------------------------------------------


def test_runtime_is_injected_with_wrapper_init_container_sidecar_and_grace() -> None:
    s = stage(checkpoint=Checkpoint(path="/ckpt"), resources=Resources(shm=16 * GI))
    t = templates(compiled(pipeline(s, storage="s3://b/p", storage_secret="creds")))["train"]
    main = t["container"]
    assert main["command"] == [
        "python3", "/var/run/durapipe/bin/durapipe-runtime.pyz", "exec", "--", "python", "train.py",
    ]
    assert main["envFrom"] == [{"secretRef": {"name": "creds"}}]
    runtime_mount = {"name": "durapipe-runtime", "mountPath": "/var/run/durapipe/bin",
                     "readOnly": True}
    assert main["volumeMounts"] == [
        {"name": "durapipe", "mountPath": "/var/run/durapipe"},
        runtime_mount,
        {"name": "durapipe-checkpoint", "mountPath": "/ckpt"},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    assert t["volumes"][-1] == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}
    # The runtime comes from the ConfigMap; the preflight runs in the stage's own image.
    (init,) = t["initContainers"]
    assert init["image"] == main["image"]
    assert init["command"] == ["python3", "/var/run/durapipe/bin/durapipe-runtime.pyz",
                               "preflight", "--uri", env_of(t)[contract.ENV_CHECKPOINT_URI]]
    assert init["command"][-1].startswith("s3://b/p/demo/inputs/train/{{=sprig.sha256sum(")
    assert init["envFrom"] == [{"secretRef": {"name": "creds"}}]
    assert init["volumeMounts"] == [runtime_mount]
    (sidecar,) = t["sidecars"]
    assert sidecar["name"] == "durapipe-uploader"
    assert sidecar["envFrom"] == [{"secretRef": {"name": "creds"}}]
    assert {"name": "durapipe-checkpoint", "mountPath": "/ckpt"} in sidecar["volumeMounts"]
    assert json.loads(t["podSpecPatch"]) == {"terminationGracePeriodSeconds": 300}
    env = env_of(t)
    assert env[contract.ENV_GRACE_SECONDS] == "285"
    assert env[contract.ENV_UPLOADER] == "sidecar"
    assert env[contract.ENV_SPOOL_DIR] == contract.DEFAULT_SPOOL_DIR


def test_last_attempt_on_demand_switches_node_affinity_on_retries() -> None:
    s = spot_stage(last_attempt_on_demand=True, checkpoint=Checkpoint(),
                   retry=Retry(attempts=1, preemptions=5))
    ts = templates(compiled(pipeline(s, cluster=Cluster(profile="karpenter"))))
    assert ts["train-app-0"]["nodeSelector"] == {"karpenter.sh/capacity-type": "spot"}
    # Only the last application attempt's task holds the stage's last possible attempt: the
    # one at which the preemptions spent before it and within it reach the stage's budget.
    last = ts["train-app-1"]
    spent = "asInt(inputs.parameters['preempted-before']) + asInt(retries)"
    assert "nodeSelector" not in last
    assert last["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [{
            "key": "karpenter.sh/capacity-type",
            "operator": f"{{{{={spent} >= 5 ? 'NotIn' : 'In'}}}}", "values": ["spot"]}]}]}
    assert last["tolerations"] == [{
        "key": "karpenter.sh/capacity-type", "operator": "Equal",
        "value": f"{{{{={spent} >= 5 ? 'durapipe-on-demand' : 'spot'}}}}",
        "effect": "NoSchedule"}]
    assert last["podSpecPatch"] == '{"terminationGracePeriodSeconds":300}'


def test_last_attempt_without_retries_is_on_demand_outright() -> None:
    s = spot_stage(last_attempt_on_demand=True, retry=Retry(attempts=1, preemptions=0))
    ts = templates(compiled(pipeline(s, cluster=Cluster(profile="gke"))))
    assert ts["train-app-0"]["nodeSelector"] == {"cloud.google.com/gke-spot": "true"}
    last = ts["train-app-1"]
    # GKE on-demand nodes carry no gke-spot label: a nodeSelector could not ask for them.
    assert "nodeSelector" not in last and "tolerations" not in last
    assert last["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "cloud.google.com/gke-spot", "operator": "NotIn", "values": ["true"]},
            {"key": "cloud.google.com/gke-preemptible", "operator": "NotIn", "values": ["true"]},
        ]}]}


def test_the_pipelines_own_on_demand_labels_are_required_as_written() -> None:
    s = spot_stage(last_attempt_on_demand=True, retry=Retry(attempts=1, preemptions=0))
    cluster = Cluster(spot_selector={"pool": "cheap"}, on_demand_selector={"pool": "steady"})
    last = templates(compiled(pipeline(s, cluster=cluster)))["train-app-1"]
    assert last["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "pool", "operator": "In", "values": ["steady"]}]}]}


# -- scheduling -------------------------------------------------------------------------------


def test_spot_selector_and_tolerations_per_profile() -> None:
    gke = templates(compiled(pipeline(spot_stage(), cluster=Cluster(profile="gke"))))["train"]
    assert gke["nodeSelector"] == {"cloud.google.com/gke-spot": "true"}
    assert gke["tolerations"] == [
        {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
        {"key": "cloud.google.com/gke-preemptible", "operator": "Equal", "value": "true",
         "effect": "NoSchedule"},
    ]
    generic = templates(compiled(pipeline(spot_stage())))["train"]
    assert [t["key"] for t in generic["tolerations"]] == [
        "node.kubernetes.io/capacity-type", "cloud.google.com/gke-spot",
        "cloud.google.com/gke-preemptible", "eks.amazonaws.com/capacityType",
        "karpenter.sh/capacity-type", "kubernetes.azure.com/scalesetpriority",
    ]
    aks = templates(compiled(pipeline(spot_stage(), cluster=Cluster(profile="aks"))))["train"]
    assert aks["nodeSelector"] == {"kubernetes.azure.com/scalesetpriority": "spot"}
    custom = Cluster(spot_selector={"pool": "cheap"})
    assert templates(compiled(pipeline(spot_stage(), cluster=custom)))["train"]["nodeSelector"] == {
        "pool": "cheap"}


def test_gpu_types_without_a_wait_are_any_of_with_preference_in_order() -> None:
    s = stage(resources=Resources(gpu=fallback_gpu(wait=None)))
    t = templates(compiled(pipeline(s)))["train"]
    aff = t["affinity"]["nodeAffinity"]
    terms = aff["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                             "values": ["NVIDIA-H100-80GB-HBM3",
                                                        "NVIDIA-A100-SXM4-80GB"]}]}]
    prefs = aff["preferredDuringSchedulingIgnoredDuringExecution"]
    assert [(p["weight"], p["preference"]["matchExpressions"][0]["values"]) for p in prefs] == [
        (100, ["NVIDIA-H100-80GB-HBM3"]), (90, ["NVIDIA-A100-SXM4-80GB"])]
    assert t["container"]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in t["tolerations"]


def test_gpu_fallback_unrolls_types_with_pending_timeout_on_all_but_the_last() -> None:
    gpu = Gpu(count=8, types=(GpuChoice(type="H100", count=8), GpuChoice(type="A100-80GB", count=8),
                              GpuChoice(type="A100", count=16)), fallback_after=1800)
    ts = templates(compiled(pipeline(stage(resources=Resources(gpu=gpu)), cluster=Cluster(profile="gke"))))
    grid = {t["name"]: t for t in ts["train"]["dag"]["tasks"]}
    assert list(grid) == ["train-h100", "train-h100-retry", "train-a100-80gb",
                          "train-a100-80gb-retry", "train-a100", "train-done"]
    assert grid["train-a100-80gb"]["depends"] == "train-h100.Failed || train-h100.Errored"
    assert grid["train-a100-80gb"]["when"] == (
        "{{=(tasks['train-h100'].status == 'Failed' && "
        "(get(tasks['train-h100'], 'exitCode') ?? '') in ['', '-1'] && "
        "(get(tasks['train-h100'], 'hostNodeName') ?? '') == '')}}"
    )
    # The probe (first attempt on a waiting type) has pendingTimeout and no retryStrategy,
    # because Argo never times out a Pending attempt of a template that has one.
    h100, a100_80, a100 = (resolved(ts, t) for t in ("train-h100", "train-a100-80gb", "train-a100"))
    assert h100["pendingTimeout"] == "30m"
    assert "retryStrategy" not in h100
    assert env_of(h100)[contract.ENV_ATTEMPT] == "0"
    assert a100_80["pendingTimeout"] == "30m"
    assert "pendingTimeout" not in a100
    # The last type's task and the -retry tasks run one pod template: each retries what is
    # left of the stage's budget, the preemptions spent before it passed by the task.
    assert a100["retryStrategy"]["limit"] == "{{=3 - asInt(inputs.parameters['preempted-before'])}}"
    assert pod(ts, "train-a100") is pod(ts, "train-h100-retry")
    assert [p for p in grid["train-a100"]["arguments"]["parameters"]
            if p["name"] == "preempted-before"] == [{"name": "preempted-before", "value": "0"}]
    # The two probes run one pod template, and so do the two -retry tasks: each task passes
    # its GPU type, the type's node label value and its count.
    assert pod(ts, "train-h100") is pod(ts, "train-a100-80gb")
    assert pod(ts, "train-h100-retry") is pod(ts, "train-a100-80gb-retry")
    # The rest of the type's attempts: a -retry task after a probe that ran and was preempted.
    retry_leaf = resolved(ts, "train-h100-retry")
    assert "pendingTimeout" not in retry_leaf
    # after the probe's preemption, one of the stage's three is spent.
    assert [p for p in grid["train-h100-retry"]["arguments"]["parameters"]
            if p["name"] == "preempted-before"] == [{"name": "preempted-before", "value": "1"}]
    assert env_of(retry_leaf)[contract.ENV_ATTEMPT] == (
        "{{=asInt(inputs.parameters.attempt) + asInt(inputs.parameters['preempted-before'])"
        " + asInt(retries)}}")
    assert first_attempt(ts, "train-h100-retry") == "0"
    assert grid["train-h100-retry"]["depends"] == "train-h100.Failed || train-h100.Errored"
    assert grid["train-h100-retry"]["when"] == (
        "{{=((tasks['train-h100'].status == 'Error') || (tasks['train-h100'].status == 'Failed'"
        " && ((get(tasks['train-h100'], 'exitCode') ?? '') == '143' || "
        "((get(tasks['train-h100'], 'exitCode') ?? '') in ['', '-1'] && "
        "!((get(tasks['train-h100'], 'hostNodeName') ?? '') == '')))))}}"
    )
    assert grid["train-done"]["depends"] == " || ".join(
        f"{n}.Succeeded" for n in list(grid)[:-1])
    assert h100["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert a100["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-tesla-a100"}
    (a100_patched,) = json.loads(a100["podSpecPatch"])["containers"]
    assert a100_patched["resources"]["limits"]["nvidia.com/gpu"] == "16"
    assert env_of(a100)[contract.ENV_GPU_TYPE] == "A100"
    assert env_of(a100_80)[contract.ENV_GPU_TYPE] == "A100-80GB"
    (patched,) = json.loads(a100_80["podSpecPatch"])["containers"]
    assert patched["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_app_failure_condition_with_a_ladder() -> None:
    rule = Retry(attempts=2, on_oom=OnOom(memory=(GI, 2 * GI)))
    assert retry.app_failure_condition("p", rule.gpu_oom, has_ladder=True) == (
        "tasks['p'].status == 'Failed' && "
        "!((get(tasks['p'], 'exitCode') ?? '') in ['', '-1', '143', '137', '86'])"
    )


def test_ladder_and_application_attempts_link_same_attempt_one_rung_up() -> None:
    s = stage(retry=Retry(attempts=1, preemptions=1, on_oom=OnOom(memory=(GI, 2 * GI))))
    grid = {t["name"]: t for t in templates(compiled(pipeline(s)))["train"]["dag"]["tasks"]}
    assert grid["train-mem-2gi-app-1"]["depends"] == (
        "(train-mem-1gi-app-1.Failed || train-mem-1gi-app-1.Errored) || "
        "(train-mem-2gi-app-0.Failed || train-mem-2gi-app-0.Errored)")


def test_gpu_fallback_cannot_target_argo_3_7() -> None:
    s = stage(resources=Resources(gpu=fallback_gpu()))
    result = compile_pipeline(pipeline(s), CompileOptions(argo_version="3.7"))
    assert [d.code for d in result.diagnostics] == ["P0401"]
    assert result.documents == []
    # Everything else lowers for 3.7 unchanged.
    assert compiled(prep_train_eval(), argo_version="3.7").documents == compiled(
        prep_train_eval()).documents


def test_gpu_counts_that_differ_need_a_wait() -> None:
    gpu = Gpu(types=(GpuChoice(type="H100", count=8), GpuChoice(type="A100", count=16)))
    assert codes(pipeline(stage(resources=Resources(gpu=gpu)))) == ["P0406"]


def test_unknown_gpu_type_is_diagnosed() -> None:
    gpu = Gpu(types=(GpuChoice(type="MI300X", count=8),))
    assert codes(pipeline(stage(resources=Resources(gpu=gpu)))) == ["P0406"]


def test_resources_are_strings_in_kubernetes_units() -> None:
    # Model quantities are canonical: millicores and bytes.
    s = stage(resources=Resources(cpu=500_000, memory=64 * GI, ephemeral_storage=100 * GI))
    res = templates(compiled(pipeline(s)))["train"]["container"]["resources"]
    assert res == {
        "requests": {"cpu": "500", "memory": "64Gi", "ephemeral-storage": "100Gi"},
        "limits": {"memory": "64Gi", "ephemeral-storage": "100Gi"},
    }
    half = stage(resources=Resources(cpu=500))
    assert templates(compiled(pipeline(half)))["train"]["container"]["resources"] == {
        "requests": {"cpu": "500m"}}


def test_timeout_is_per_attempt_active_deadline() -> None:
    t = templates(compiled(pipeline(stage(timeout=12 * 3600))))["train"]
    assert t["activeDeadlineSeconds"] == "43200"


# -- caching and data edges -------------------------------------------------------------------


def test_memoize_key_inputs_are_exact() -> None:
    ts = templates(compiled(prep_train_eval()))
    prep = ts["prep"]["memoize"]
    static = memo.static_digest(
        image="ghcr.io/acme/prep:1",
        command=["python", "-m", "prep", "--epochs", "${params.epochs}", "--out=${params.out}"],
        env={"MODE": "fast", "TOKEN": "secret:hf/token"},
        salt="v2",
    )
    key = ("sprig.sha256sum(toJson({'params': {'epochs': workflow.parameters['epochs'], "
           "'out': workflow.parameters['out']} , 'static': '" + static + "', 'upstream': {} }))")
    assert prep == {
        # "} }", never "}}": Argo would end the {{= tag there.
        "key": "{{=" + key + "}}",
        "maxAge": "168h",
        # The entry's ConfigMap: one of 16, by the key's first hex digit (naming.CACHE_SHARDS).
        "cache": {"configMap": {"name": "durapipe-cache-demo-{{=sprig.substr(0, 1, " + key
                                + ")}}"}},
    }
    train = ts["train"]
    # The hash of prep's output, then the record of what the key is made of, which Argo
    # evaluates from the same reads (what `status` explains a miss with).
    given, record = train["inputs"]["parameters"]
    assert given == {"name": "prep-data-hash"}
    assert record["name"] == memo.COMPONENTS_PARAM
    assert record["value"] == memo.components_expression(
        "train", cache_static(prep_train_eval().stages[1]),
        cache_parts(prep_train_eval().stages[1]), [], {"prep.data": "prep-data-hash"})
    assert {"name": memo.COMPONENTS_PARAM, "valueFrom": {
        "expression": f"inputs.parameters['{memo.COMPONENTS_PARAM}']"}} in \
        train["outputs"]["parameters"]
    assert "'upstream': {'prep.data': inputs.parameters['prep-data-hash']}" in train["memoize"]["key"]
    assert train["memoize"]["maxAge"] == ""
    main = templates(compiled(prep_train_eval()))["main"]["dag"]["tasks"]
    assert main[1]["arguments"] == {
        "parameters": [{"name": "prep-data-hash",
                        "value": "{{tasks.prep.outputs.parameters.data-hash}}"}],
        "artifacts": [{"name": "in-prep-data", "from": "{{tasks.prep.outputs.artifacts.data}}"}],
    }
    # A cached pod stage: the cache on a one-task DAG, the outputs read from its pod.
    assert ts["prep-pod"]["outputs"]["parameters"] == [{"name": "data-hash", "valueFrom": {
        "path": "/var/run/durapipe/outputs/data.hash", "default": ""}}]
    assert ts["prep"]["outputs"]["parameters"][0] == {"name": "data-hash", "valueFrom": {
        "parameter": "{{tasks.prep-pod.outputs.parameters.data-hash}}"}}
    assert "memoize" not in ts["prep-pod"] and "retryStrategy" not in ts["prep"]
    assert main[2]["depends"] == "train"


def test_cache_key_ignores_resources_and_retries_but_not_image_salt_or_env() -> None:
    def key(**kw: Any) -> str:
        s = stage(cache=Cache(version=kw.pop("salt", "")), **kw)
        return str(templates(compiled(pipeline(s)))["train"]["memoize"]["key"])

    base = key()
    assert key(resources=Resources(cpu=64, memory=GI)) == base
    assert key(retry=Retry(attempts=5)) == base
    assert key(image="ghcr.io/acme/train:2.0") != base
    assert key(salt="v2") != base
    assert key(env={"LR": "0.1"}) != base


def test_runtime_key_matches_go_json_encoding() -> None:
    # Go's encoding/json sorts map keys, emits no spaces and escapes <, > and &.
    record = '{"params":{"a":"x\\u003cy"},"static":"ab","upstream":{"p.d":"h"}}'
    import hashlib

    assert memo.runtime_key("ab", {"a": "x<y"}, {"p.d": "h"}) == hashlib.sha256(
        record.encode()).hexdigest()


def test_declared_inputs_reach_the_runtime_and_command_refs_become_paths() -> None:
    ts = templates(compiled(prep_train_eval()))
    assert ts["train-pod"]["container"]["command"][-1] == "/var/run/durapipe/inputs/prep/data"
    assert env_of(ts["eval-pod"])["DURAPIPE_INPUTS"] == '{"model":"/var/run/durapipe/inputs/train/model"}'
    assert ts["prep-pod"]["container"]["command"][-2:] == [
        "{{workflow.parameters.epochs}}", "--out={{workflow.parameters.out}}"]


# -- JobSet -----------------------------------------------------------------------------------


def test_multi_node_jobset_manifest() -> None:
    s = stage("pretrain", command=("python", "-m", "trainer", "--steps", "100"),
              distributed=Distributed(replicas=4, procs_per_node=8, max_restarts=2),
              resources=Resources(gpu=Gpu(count=8, types=(GpuChoice(type="H100", count=8),))),
              checkpoint=Checkpoint(), interruptible=True, timeout=3600)
    t = templates(compiled(pipeline(s, storage="s3://b/p")))["pretrain"]
    res = t["resource"]
    assert res["action"] == "create"
    assert res["setOwnerReference"] is True
    assert res["successCondition"] == "status.terminalState == Completed"
    assert res["failureCondition"] == "status.terminalState == Failed"
    manifest = yaml.safe_load(res["manifest"])
    assert manifest["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert manifest["metadata"]["generateName"] == "{{workflow.name}}-pretrain-"
    spec = manifest["spec"]
    assert spec["failurePolicy"] == {"maxRestarts": 2, "rules": [{
        "name": "HostMaintenance", "action": "RestartJobSetAndIgnoreMaxRestarts",
        "onJobFailureReasons": ["PodFailurePolicy"]}]}
    (rjob,) = spec["replicatedJobs"]
    job = rjob["template"]["spec"]
    assert (job["parallelism"], job["completions"], job["completionMode"], job["backoffLimit"]) == (
        4, 4, "Indexed", 0)
    assert job["activeDeadlineSeconds"] == 3600
    assert job["podFailurePolicy"]["rules"][0]["onPodConditions"] == [
        {"type": "DisruptionTarget", "status": "True"}]
    pod = job["template"]["spec"]
    main = pod["containers"][0]
    assert main["command"] == [
        "python3", "/var/run/durapipe/bin/durapipe-runtime.pyz", "exec", "--", "torchrun",
        "--nnodes=4", "--nproc_per_node=8", "--node_rank=$(JOB_COMPLETION_INDEX)",
        "--master_addr=$(DURAPIPE_JOBSET_NAME)-node-0-0.$(DURAPIPE_JOBSET_NAME)",
        "--master_port=29500", "--module", "trainer", "--steps", "100",
    ]
    env = {e["name"]: e for e in main["env"]}
    assert env["DURAPIPE_ATTEMPT"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['jobset.sigs.k8s.io/restart-attempt']")
    assert pod["restartPolicy"] == "Never"
    assert pod["terminationGracePeriodSeconds"] == 300
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    # A Job pod completes when its regular containers have: the uploader is a native sidecar.
    assert [c["name"] for c in pod["containers"]] == ["main"]
    assert [(c["name"], c.get("restartPolicy")) for c in pod["initContainers"]] == [
        ("durapipe-preflight", None), ("durapipe-uploader", "Always")]


@pytest.mark.parametrize(("command", "program"), [
    (("python", "-m", "trainer", "--steps", "100"), ("trainer", ["--steps", "100"], True, False)),
    (("python3", "train.py"), ("train.py", [], False, False)),
    (("/opt/bin/train", "--x"), ("/opt/bin/train", ["--x"], False, True)),
])
def test_torchrun_reads_the_compiled_launch_as_meant(
        command: tuple[str, ...], program: tuple[str, list[str], bool, bool]) -> None:
    """The launch line through the installed torch's own torchrun parser, with the variables
    the kubelet expands set as on node 1 of a JobSet ``js``.  (The real node runs Debian's
    torch 1.13, which knows only the underscore spelling: tests/realnode/test_multinode.py.)"""
    run = pytest.importorskip("torch.distributed.run", reason="torch (the ml extra) is needed")
    s = stage(command=command, distributed=Distributed(replicas=3, procs_per_node=2),
              resources=Resources(cpu=4))
    manifest = yaml.safe_load(templates(compiled(pipeline(s)))["train"]["resource"]["manifest"])
    command_line = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
        "spec"]["containers"][0]["command"]
    argv = command_line[command_line.index("torchrun") + 1:]
    expanded = [a.replace("$(JOB_COMPLETION_INDEX)", "1").replace("$(DURAPIPE_JOBSET_NAME)", "js")
                for a in argv]
    args = run.get_args_parser().parse_args(expanded)
    assert (args.nnodes, args.nproc_per_node, args.node_rank) == ("3", "2", 1)
    assert (args.master_addr, args.master_port) == ("js-node-0-0.js", 29500)
    assert (args.training_script, args.training_script_args, args.module, args.no_python) == \
        program


#: JobSet v0.12.0's webhook, ../shared/jobset/v0.12.0/src/pkg/webhooks/jobset_webhook.go:418
#: (``ruleNameFmt``, checked in ``validateFailurePolicy``), with its length bounds (1-128).
JOBSET_RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")


def test_jobset_failure_policy_rule_names_pass_jobsets_webhook() -> None:
    shared = Path(__file__).resolve().parents[2].parent / "shared" / "jobset" / "v0.12.0" / "src"
    webhook = shared / "pkg" / "webhooks" / "jobset_webhook.go"
    if webhook.exists():  # the copy above is the webhook's own pattern
        assert 'ruleNameFmt       = "' + JOBSET_RULE_NAME.pattern + '"' in webhook.read_text()
    s = stage(distributed=Distributed(replicas=2, restart_on_maintenance=True),
              resources=Resources(cpu=4))
    manifest = yaml.safe_load(templates(compiled(pipeline(s)))["train"]["resource"]["manifest"])
    names = [r["name"] for r in manifest["spec"]["failurePolicy"]["rules"]]
    assert names and all(JOBSET_RULE_NAME.match(n) and len(n) <= 128 for n in names)
    assert not JOBSET_RULE_NAME.match("host-maintenance")  # what was refused


def test_maintenance_restarts_count_when_asked() -> None:
    s = stage(distributed=Distributed(replicas=2, restart_on_maintenance=False),
              resources=Resources(cpu=4))
    manifest = yaml.safe_load(templates(compiled(pipeline(s)))["train"]["resource"]["manifest"])
    assert manifest["spec"]["failurePolicy"] == {"maxRestarts": 0}
    assert "podFailurePolicy" not in manifest["spec"]["replicatedJobs"][0]["template"]["spec"]
    command = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"][0]["command"]
    assert command[-2:] == ["--master_port=29500", "train.py"]


def test_multi_node_stage_rejects_outputs_and_ladders() -> None:
    s = stage(distributed=Distributed(replicas=2), outputs={"m": "/m"},
              retry=Retry(on_oom=OnOom(memory=(GI, 2 * GI))))
    assert codes(pipeline(s)) == ["P0407", "P0407"]


# -- names, escaping, kinds -------------------------------------------------------------------


@pytest.mark.parametrize("text", ["{{workflow.name}}", "a{{=1+1}}b"])
def test_argo_templating_in_user_text_is_refused(text: str) -> None:
    assert codes(pipeline(stage(command=("echo", text)))) == ["P0404"]
    assert codes(pipeline(stage(env={"X": text}))) == ["P0404"]
    assert codes(pipeline(stage(image=text))) == ["P0404"]
    assert codes(pipeline(stage(), params=(Param(name="p", type="str", default=text),))) == ["P0404"]
    assert codes(pipeline(stage(annotations={"note": text}))) == ["P0404"]
    assert codes(pipeline(stage(), storage="s3://b/" + text)) == ["P0404"]


def test_brace_before_a_reference_is_refused_but_plain_braces_pass() -> None:
    before = Interp(parts=("{", Ref(path=("params", "p"))))
    p = (Param(name="p", type="str", default="x"),)
    assert codes(pipeline(stage(command=("echo", before)), params=p)) == ["P0404"]
    fine = stage(command=("python", "-c", "print({'a': 1})", "}}"))
    assert codes(pipeline(fine)) == []


def test_bare_stage_reference_in_a_command_is_diagnosed() -> None:
    # The front end's reference rules run on a model built in code (P0301: a stage is not a
    # value); the lowering adds that it has nothing to put there (P0405).
    s = stage("b", command=("echo", Ref(path=("a",))))
    assert codes(pipeline(stage("a"), s)) == ["P0301", "P0405"]


def test_unknown_references_and_cycles_of_a_model_built_in_code_are_the_front_ends() -> None:
    a = stage("a", command=("echo", Ref(path=("b", "outputs", "x"))), outputs={"y": "/y"})
    b = stage("b", command=("echo", Ref(path=("a", "outputs", "y")), Ref(path=("params", "n"))),
              outputs={"x": "/x"})
    result = compile_pipeline(pipeline(a, b), CompileOptions())
    assert sorted((d.code, d.message) for d in result.diagnostics) == [
        ("P0301", "unknown param `params.n`"),
        ("P0302", "dependency cycle: a -> b -> a"),
    ] and result.documents == []


def test_generated_name_collision_is_diagnosed() -> None:
    p = pipeline(stage(resources=Resources(gpu=fallback_gpu())), stage("train-h100"))
    assert codes(p) == ["P0402"]


def test_names_that_argo_reserves_or_forbids_are_prefixed() -> None:
    ts = templates(compiled(pipeline(stage("main"), stage("1st", needs=("main",)))))
    tasks = ts["main"]["dag"]["tasks"]
    assert [(t["name"], t.get("depends")) for t in tasks] == [
        ("stage-main", None), ("stage-1st", "stage-main")]


def test_output_kinds() -> None:
    p = pipeline(stage(), namespace="ml", schedules=("0 3 * * *",), timezone="Europe/Paris",
                 labels={"team": "nlp"})
    once = pipeline(stage(), namespace="ml", labels={"team": "nlp"})
    (wf,) = compiled(once).documents
    assert wf["kind"] == "Workflow" and wf["metadata"]["generateName"] == "demo-"
    assert wf["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "durapipe",
                                        "durapipe.dev/pipeline": "demo", "team": "nlp"}
    (tmpl,) = compiled(once, kind="template").documents
    assert tmpl["kind"] == "WorkflowTemplate" and tmpl["metadata"]["name"] == "demo"
    # A schedule implies a CronWorkflow (it used to be dropped into a plain Workflow), and
    # another kind asked for is P0345 rather than a silent loss.
    (cron,) = compiled(p).documents
    assert cron == compiled(p, kind="cron").documents[0]
    assert codes(p, kind="template") == ["P0345"] and codes(p, kind="workflow") == ["P0345"]
    assert cron["kind"] == "CronWorkflow"
    assert list(cron["spec"])[:3] == ["schedules", "timezone", "concurrencyPolicy"]
    assert cron["spec"]["schedules"] == ["0 3 * * *"]
    assert cron["spec"]["workflowSpec"]["entrypoint"] == "main"
    assert codes(pipeline(stage()), kind="cron") == ["P0408"]


def test_params_become_arguments_with_string_defaults() -> None:
    p = pipeline(stage(), params=(Param(name="lr", type="float", default=2e-5),
                                  Param(name="flag", type="bool", default=True),
                                  Param(name="req", type="str")))
    (wf,) = compiled(p).documents
    assert wf["spec"]["arguments"] == {"parameters": [
        {"name": "lr", "value": "2e-05"}, {"name": "flag", "value": "true"}, {"name": "req"}]}


def test_secrets_are_secret_key_refs_only() -> None:
    t = templates(compiled(prep_train_eval()))["prep-pod"]
    assert {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in t[
        "container"]["env"]


def test_script_stage_runs_through_the_wrapper() -> None:
    s = stage(command=None, script="echo hi\n")
    t = templates(compiled(pipeline(s)))["train"]
    assert t["script"]["command"][-2:] == ["--", "sh"]
    assert t["script"]["source"] == "echo hi\n"


def test_jobset_conditions_are_the_ones_argo_executor_evaluates_in_the_harness() -> None:
    # tests/argo/scenarios/jobset-conditions.yaml runs these conditions through Argo's own
    # executor code; this keeps the proof tied to what the compiler emits.
    from pathlib import Path

    from durapipe.compiler import argo_jobset as jobset

    scenario = Path(__file__).resolve().parents[1] / "argo" / "scenarios" / "jobset-conditions.yaml"
    text = scenario.read_text(encoding="utf-8")
    assert f"successCondition: {jobset.SUCCESS_CONDITION}\n" in text
    assert f"failureCondition: {jobset.FAILURE_CONDITION}\n" in text


def test_stages_share_one_wait_and_one_join_and_a_stage_cannot_take_their_names() -> None:
    retrying = Retry(attempts=2, backoff=30)
    p = pipeline(stage("a", retry=retrying), stage("durapipe-wait", retry=retrying),
                 stage("durapipe-join", retry=retrying))
    (doc,) = compiled(p).documents
    names = [t["name"] for t in doc["spec"]["templates"]]
    # One copy of each, after every stage's own templates.
    assert names.count("durapipe-wait") == names.count("durapipe-join") == 1
    assert names[-2:] == ["durapipe-join", "durapipe-wait"]
    assert {"stage-durapipe-wait", "stage-durapipe-join"} <= set(names)
    main = {t["name"]: t for t in doc["spec"]["templates"]}["main"]
    assert [t["name"] for t in main["dag"]["tasks"]] == [
        "a", "stage-durapipe-wait", "stage-durapipe-join"]
