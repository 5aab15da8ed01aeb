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
    templates = {t["name"]: t for t in wf["spec"]["templates"]}
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
