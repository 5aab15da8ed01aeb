"""Lowerings durapipe does not have yet, applied by hand to the fleet pipeline's compiled
Workflow, so that the benchmarks can measure what building one would save before anyone
builds it (issue 26: Argo's controller CPU, durapipe's output against minimal Workflows).

``fold_application_budget``: each stage's application budget counted by one ``retryStrategy``
over both budgets, as it could be if the runtime counted application failures itself (Argo's
expression sees only ``lastRetry``; docs/performance.md, "Fleet scale", says how the count
could be carried and what it must guard against). prep and eval become one task each; train
keeps its H100 probe, the A100 task it falls back to and the join. Memoization, the contract,
the preemption carry and the fallback are kept. The result runs the same work with the same
fates (a first train pod failing with exit 1 is retried in its task), but it is not what a
real lowering would write: it is an upper bound of the saving, with no budget kept exactly.

``fold_to_floor``: the fold, and then everything else a hand-made lowering of the same
features could leave out: no preemption count carried between tasks (``DURAPIPE_ATTEMPT`` is
the task's own ``{{retries}}``), eval (one task, not memoized) its pod template alone in
``main`` instead of inside a stage DAG, and each memoized stage's cache key and shard evaluated
once, by the task that starts the stage, instead of in ``memoize``, its shard name and the
checkpoint keys. (A memoized stage keeps its DAG: memoize on a retried pod template leaves a
cached run Running for ever in Argo v4.1.2, docs/lowering.md, "Caching". And "once" is per
pass: Argo resolves a running task's arguments again on every pass, dag.go
``executeDAGTask``, so the key moves out of the stage's templates, not out of ``operate``.)
Every feature the fleet pipeline declares is still there (memoization, checkpointing, the
fallback timer, the runtime's contract); what it gives up is exactness (the stage-wide
budgets). It is the cheapest form of these features found by hand on Argo v4.1.2, a floor for
lowerings along these lines, not a lowering to build.

The ``floor-without-*`` forms then drop one feature each from the floor, to say what each
feature costs Argo by itself: memoization, the GPU fallback (train one task on H100), the
runtime's contract in the pod (its environment, init container, uploader sidecar and volumes).
They are not the same work: they answer how much of the gap the features themselves are.

``WHAT_IFS`` names them all for the benchmarks' ``--what-if`` and ``--forms``.

The template and task names are those ``durapipe compile`` gives ``FLEET_PIPELINE`` (a
KeyError names the one that changed).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

#: Tries per pod task: the fleet pipeline's 1 application retry and 2 preemptions.
FOLDED_LIMIT = "3"
#: What the application retry waits: the fleet pipeline's backoff.
FOLDED_BACKOFF = "10s"


def templates_by_name(wf: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in wf["spec"]["templates"]}


def read_parameters_by(outputs: dict[str, Any], expression: Callable[[str], str]) -> None:
    """Point every output parameter a stage's DAG selects from its tasks at ``expression``
    of the parameter's name (what a stage passes through from its inputs stays)."""
    for param in outputs["parameters"]:
        if "tasks[" in param["valueFrom"].get("expression", ""):
            param["valueFrom"] = {"expression": expression(param["name"])}


def fold_application_budget(workflow: dict[str, Any]) -> dict[str, Any]:
    """A copy of the fleet Workflow with every application attempt folded into the retry
    of the task before it (see the module's docstring)."""
    wf = copy.deepcopy(workflow)
    templates = templates_by_name(wf)
    retry = copy.deepcopy(templates["train-pod"]["retryStrategy"])
    retry["limit"] = FOLDED_LIMIT
    retry["expression"] = "lastRetry.exitCode == '1' || " + retry["expression"]
    retry["backoff"] = {"duration": FOLDED_BACKOFF}

    for stage in ("prep", "eval"):
        first = templates[stage]["dag"]["tasks"][0]
        templates[stage]["dag"]["tasks"] = [first]
        for param in first["arguments"].get("parameters", []):
            if param["name"] == "preempted-before":
                param["value"] = "0"
        outputs = templates[stage]["outputs"]
        task = first["name"]
        read_parameters_by(outputs, lambda name: f"tasks['{task}'].outputs.parameters['{name}']")
        for artifact in outputs.get("artifacts", []):
            artifact.pop("fromExpression", None)
            artifact["from"] = f"{{{{tasks.{task}.outputs.artifacts.{artifact['name']}}}}}"
        templates[f"{stage}-pod"]["retryStrategy"] = copy.deepcopy(retry)

    probe, fallback, join = "train-h100", "train-a100-80gb-app-0", "train-done"
    dag = templates["train"]["dag"]
    dag["tasks"] = [t for t in dag["tasks"] if t["name"] in (probe, fallback, join)]
    next(t for t in dag["tasks"] if t["name"] == join)["depends"] = \
        f"{probe}.Succeeded || {fallback}.Succeeded"
    templates[probe]["retryStrategy"] = copy.deepcopy(retry)
    templates["train-pod"]["retryStrategy"] = copy.deepcopy(retry)

    def either(what: str) -> str:
        return (f"tasks['{probe}'].status == 'Succeeded' ? tasks['{probe}'].outputs.{what} "
                f": tasks['{fallback}'].outputs.{what}")

    outputs = templates["train"]["outputs"]
    read_parameters_by(outputs, lambda name: either(f"parameters['{name}']"))
    for artifact in outputs.get("artifacts", []):
        artifact.pop("from", None)
        artifact["fromExpression"] = either(f"artifacts['{artifact['name']}']")
    return wf


#: What the fold's preemption carry between tasks consists of (docs/lowering.md, "One
#: preemption budget per stage"); the floor drops it.
CARRY_PARAMETERS = ("attempt", "preempted-before")
CARRY_OUTPUT = "preempted"
#: The parameter naming the stage's cache key once, in the floor.
KEY_PARAMETER = "durapipe-key"
SHARD_PARAMETER = "durapipe-shard"
#: The file a flattened stage's cache record would come from: a container template cannot
#: output an expression, so the record becomes a path whose default is the input.
CACHE_RECORD = "durapipe-cache-inputs"


def _without(items: list[dict[str, Any]], names: tuple[str, ...]) -> list[dict[str, Any]]:
    return [item for item in items if item["name"] not in names]


def drop_preemption_carry(wf: dict[str, Any]) -> None:
    for tmpl in wf["spec"]["templates"]:
        if tmpl.get("inputs", {}).get("parameters"):
            tmpl["inputs"]["parameters"] = _without(tmpl["inputs"]["parameters"],
                                                    CARRY_PARAMETERS)
        if tmpl.get("outputs", {}).get("parameters"):
            tmpl["outputs"]["parameters"] = _without(tmpl["outputs"]["parameters"],
                                                     (CARRY_OUTPUT,))
        for container in [tmpl.get("container"), *tmpl.get("sidecars", [])]:
            for env in (container or {}).get("env", []):
                if env["name"] == "DURAPIPE_ATTEMPT" and "{{=" in env.get("value", ""):
                    env["value"] = "{{retries}}"
        for task in tmpl.get("dag", {}).get("tasks", []):
            if task.get("arguments", {}).get("parameters"):
                task["arguments"]["parameters"] = _without(task["arguments"]["parameters"],
                                                           CARRY_PARAMETERS)


def flatten_single_task_stages(wf: dict[str, Any], stages: tuple[str, ...]) -> None:
    templates = templates_by_name(wf)
    for stage in stages:
        dag, pod = templates[stage], templates[f"{stage}-pod"]
        if "memoize" in dag:
            pod["memoize"] = dag["memoize"]
        pod.setdefault("inputs", {}).setdefault("parameters", []).extend(
            dag.get("inputs", {}).get("parameters", []))
        if any(p["name"] == CACHE_RECORD for p in dag["outputs"]["parameters"]):
            pod["outputs"]["parameters"].append({"name": CACHE_RECORD, "valueFrom": {
                "path": f"/var/run/durapipe/{CACHE_RECORD}",
                "default": f"{{{{inputs.parameters.{CACHE_RECORD}}}}}"}})
        wf["spec"]["templates"].remove(dag)
        for task in templates["main"]["dag"]["tasks"]:
            if task["template"] == stage:
                task["template"] = f"{stage}-pod"


def evaluate_keys_once(wf: dict[str, Any], stages: tuple[str, ...]) -> None:
    """Each memoized stage's cache key and shard evaluated once, by the task of ``main`` that
    starts the stage, and read as plain parameters by ``memoize`` and the checkpoint keys."""
    templates = templates_by_name(wf)
    for stage in stages:
        tmpl = templates[stage]
        starter = next(t for t in templates["main"]["dag"]["tasks"] if t["name"] == stage)
        arguments = starter.setdefault("arguments", {}).setdefault("parameters", [])
        cache = tmpl["memoize"]["cache"]["configMap"]
        for name, value in ((KEY_PARAMETER, tmpl["memoize"]["key"]),
                            (SHARD_PARAMETER, cache["name"])):
            tmpl.setdefault("inputs", {}).setdefault("parameters", []).append({"name": name})
            arguments.append({"name": name, "value": value.replace(
                "inputs.parameters['prep-data-hash']",
                "tasks['prep'].outputs.parameters['data-hash']")})
        plain = f"{{{{inputs.parameters.{KEY_PARAMETER}}}}}"
        tmpl["memoize"]["key"] = plain
        cache["name"] = f"{{{{inputs.parameters.{SHARD_PARAMETER}}}}}"
        for task in tmpl["dag"]["tasks"]:
            for param in task.get("arguments", {}).get("parameters", []):
                if param["name"] == "checkpoint-key":
                    param["value"] = plain


def fold_to_floor(workflow: dict[str, Any]) -> dict[str, Any]:
    """The fold and every saving left after it (see the module's docstring)."""
    wf = fold_application_budget(workflow)
    drop_preemption_carry(wf)
    # Only eval: memoize on a pod template with a retryStrategy leaves a run whose stage hit
    # the cache Running for ever in Argo v4.1.2 (docs/lowering.md, "Caching"; the first floor
    # flattened prep and tests/argo/test_what_if_on_argo.py caught it), so a memoized stage
    # keeps the DAG around its task.
    flatten_single_task_stages(wf, ("eval",))
    evaluate_keys_once(wf, ("prep", "train"))
    return wf


def without_memoization(wf: dict[str, Any]) -> dict[str, Any]:
    wf = copy.deepcopy(wf)
    for tmpl in wf["spec"]["templates"]:
        tmpl.pop("memoize", None)
        for side in ("inputs", "outputs"):
            if tmpl.get(side, {}).get("parameters"):
                tmpl[side]["parameters"] = _without(tmpl[side]["parameters"],
                                                    (CACHE_RECORD, KEY_PARAMETER, SHARD_PARAMETER))
    templates = templates_by_name(wf)
    for task in templates["main"]["dag"]["tasks"]:
        if task.get("arguments", {}).get("parameters"):
            task["arguments"]["parameters"] = _without(task["arguments"]["parameters"],
                                                       (KEY_PARAMETER, SHARD_PARAMETER))
    for task in templates["train"]["dag"]["tasks"]:
        for param in task.get("arguments", {}).get("parameters", []):
            if param["name"] == "checkpoint-key":
                param["value"] = "{{workflow.name}}"
    return wf


def without_fallback(wf: dict[str, Any]) -> dict[str, Any]:
    wf = copy.deepcopy(wf)
    templates = templates_by_name(wf)
    probe = "train-h100"
    train = templates["train"]
    train["dag"]["tasks"] = [t for t in train["dag"]["tasks"] if t["name"] == probe]
    templates[probe].pop("pendingTimeout", None)
    read_parameters_by(train["outputs"],
                       lambda name: f"tasks['{probe}'].outputs.parameters['{name}']")
    return wf


def without_contract(wf: dict[str, Any]) -> dict[str, Any]:
    wf = copy.deepcopy(wf)
    for tmpl in wf["spec"]["templates"]:
        for part in ("initContainers", "sidecars", "volumes", "podSpecPatch"):
            tmpl.pop(part, None)
        if "container" in tmpl:
            tmpl["container"].pop("env", None)
            tmpl["container"].pop("volumeMounts", None)
    return wf


WHAT_IFS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "folded": fold_application_budget,
    "floor": fold_to_floor,
    "floor-without-memoization": lambda wf: without_memoization(fold_to_floor(wf)),
    "floor-without-fallback": lambda wf: without_fallback(fold_to_floor(wf)),
    "floor-without-contract": lambda wf: without_contract(fold_to_floor(wf)),
    "floor-without-all-three": lambda wf: without_contract(without_fallback(
        without_memoization(fold_to_floor(wf)))),
}
