"""Assembly: stage templates into the entrypoint DAG and the document of the chosen kind.

A pipeline within Argo's limits (200 templates per object, 200 tasks per DAG) becomes one
object.  A bigger one is cut, in topological order, into parts: each part is a
WorkflowTemplate holding a ``part`` DAG over its stages, and the entrypoint DAG calls the parts
through ``templateRef``.  Data crossing a cut travels as part outputs and inputs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from durapipe.compiler import naming
from durapipe.compiler.argo_pod import LABEL_PIPELINE, MANAGED_BY
from durapipe.compiler.argo_stage import LoweredStage
from durapipe.compiler.argo_text import artifact_input_name, hash_param_name
from durapipe.compiler.context import Context
from durapipe.compiler.plan import param_value
from durapipe.dsl.model import Pipeline

Json = dict[str, Any]

API_VERSION = "argoproj.io/v1alpha1"
PART_TEMPLATE = "part"
#: Kubernetes' limit on one object (etcd), which Argo inherits.
MAX_OBJECT_BYTES = 1024 * 1024


def arguments(ctx: Context) -> Json:
    params: list[Json] = []
    for i, param in enumerate(ctx.pipeline.params):
        entry: Json = {"name": param.name}
        if param.default is not None:
            entry["value"] = param_value(param.default)
        if param.description:
            entry["description"] = param.description
        params.append(entry)
    return {"parameters": params} if params else {}


@dataclass
class UpstreamRefs:
    """Where the tasks of one DAG find upstream outputs: a sibling task's outputs, or (across
    a cut between parts) the DAG's own inputs."""

    #: (stage, output) -> (hash parameter expression, artifact expression)
    refs: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)


def task_for(lowered: LoweredStage, upstream: UpstreamRefs, local_deps: list[str]) -> Json:
    entry: Json = {"name": lowered.plan.task, "template": lowered.plan.task}
    if local_deps:
        entry["depends"] = " && ".join(sorted(local_deps))
    params = [
        {"name": lowered.hash_inputs[key], "value": upstream.refs[key][0]}
        for key in sorted(lowered.hash_inputs)
    ]
    arts = [
        {"name": artifact_input_name(s, o), "from": upstream.refs[(s, o)][1]}
        for s, o in sorted(lowered.plan.upstream)
    ]
    set_arguments(entry, params, arts)
    return entry


def set_arguments(task: Json, parameters: list[Json], artifacts: list[Json]) -> None:
    """A DAG task's ``arguments``, with empty lists left out (and no key when both are)."""
    args: Json = {}
    if parameters:
        args["parameters"] = parameters
    if artifacts:
        args["artifacts"] = artifacts
    if args:
        task["arguments"] = args


def local_refs(output: str, task: str) -> tuple[str, str]:
    return (
        "{{tasks." + task + ".outputs.parameters." + hash_param_name(output) + "}}",
        "{{tasks." + task + ".outputs.artifacts." + output + "}}",
    )


def check_names(ctx: Context, lowered: list[LoweredStage]) -> None:
    # name -> (who made it, the stage's index: None for the entrypoint)
    seen: dict[str, tuple[str, int | None]] = {naming.ENTRYPOINT: ("the entrypoint DAG", None)}
    for item in lowered:
        for template in item.templates:
            name = str(template["name"])
            owner = f"stage `{item.plan.stage.name}`"
            if name in seen and seen[name][0] != owner:
                first, index = seen[name]
                ctx.error(
                    "P0402",
                    f"generated template name `{name}` of {owner} collides with {first}",
                    ("stages", item.plan.index, "name"),
                    help="rename one of the stages",
                    related=(("stages", index, "name"), f"`{name}` is also made for this "
                             "stage") if index is not None else None,
                )
            seen.setdefault(name, (owner, item.plan.index))
            if len(name) > naming.MAX_ARGO_NAME or not naming.ARGO_NAME_RE.match(name):
                ctx.error("P0402", f"generated name `{name}` is not a valid Argo name",
                          ("stages", item.plan.index, "name"))


def metadata(ctx: Context, kind: str, name: str) -> Json:
    pipeline = ctx.pipeline
    meta: Json = {}
    if kind == "Workflow" and not ctx.options.fixed_names:
        meta["generateName"] = f"{name}-"
        limit = naming.MAX_WORKFLOW_NAME - naming.GENERATE_NAME_SUFFIX
    else:
        meta["name"] = name
        limit = naming.MAX_CRON_NAME if kind == "CronWorkflow" else naming.MAX_WORKFLOW_NAME
    if len(name) > limit:
        ctx.error("P0402", f"{kind} name `{name}` is longer than {limit} characters",
                  ("name",))
    if pipeline.namespace:
        meta["namespace"] = pipeline.namespace
    labels = {**MANAGED_BY, LABEL_PIPELINE: pipeline.name, **pipeline.labels}
    meta["labels"] = dict(sorted(labels.items()))
    if pipeline.annotations:
        meta["annotations"] = dict(sorted(pipeline.annotations.items()))
    return meta


def workflow_spec(ctx: Context, templates: list[Json]) -> Json:
    spec: Json = {"entrypoint": naming.ENTRYPOINT}
    args = arguments(ctx)
    if args:
        spec["arguments"] = args
    account = ctx.pipeline.service_account or ctx.options.service_account
    if account:
        spec["serviceAccountName"] = account
    if ctx.pipeline.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": n} for n in ctx.pipeline.image_pull_secrets]
    spec["templates"] = templates
    return spec


def document(ctx: Context, kind: str, templates: list[Json]) -> Json:
    pipeline: Pipeline = ctx.pipeline
    spec = workflow_spec(ctx, templates)
    if kind == "cron":
        cron: Json = {"schedules": list(pipeline.schedules)}
        if pipeline.timezone:
            cron["timezone"] = pipeline.timezone
        cron["concurrencyPolicy"] = "Forbid"
        cron["workflowSpec"] = spec
        return {"apiVersion": API_VERSION, "kind": "CronWorkflow",
                "metadata": metadata(ctx, "CronWorkflow", pipeline.name), "spec": cron}
    if kind == "template":
        return {"apiVersion": API_VERSION, "kind": "WorkflowTemplate",
                "metadata": metadata(ctx, "WorkflowTemplate", pipeline.name), "spec": spec}
    return {"apiVersion": API_VERSION, "kind": "Workflow",
            "metadata": metadata(ctx, "Workflow", pipeline.name), "spec": spec}


def dag_tasks(part: list[LoweredStage], upstream: UpstreamRefs) -> list[Json]:
    """The tasks of one DAG over ``part``; data from stages outside it is in ``upstream``."""
    names = {item.plan.stage.name: item.plan.task for item in part}
    tasks: list[Json] = []
    for item in part:
        for s, o in item.plan.upstream:
            if s in names:
                upstream.refs[(s, o)] = local_refs(o, names[s])
        deps = [names[u] for u in item.plan.stage.upstream() if u in names]
        tasks.append(task_for(item, upstream, deps))
    return tasks


def single_object(ctx: Context, kind: str, lowered: list[LoweredStage]) -> list[Json]:
    tasks = dag_tasks(lowered, UpstreamRefs())
    templates: list[Json] = [{"name": naming.ENTRYPOINT, "dag": {"tasks": tasks}}]
    for item in lowered:
        templates.extend(item.templates)
    return [document(ctx, kind, templates)]


def split_parts(ctx: Context, lowered: list[LoweredStage]) -> list[list[LoweredStage]]:
    budget_templates = ctx.options.max_templates - 1  # the part DAG itself
    budget_tasks = ctx.options.max_tasks
    parts: list[list[LoweredStage]] = [[]]
    count = 0
    for item in lowered:
        size = len(item.templates)
        if parts[-1] and (count + size > budget_templates or len(parts[-1]) >= budget_tasks):
            parts.append([])
            count = 0
        parts[-1].append(item)
        count += size
    return parts


Edge = tuple[str, str]


@dataclass
class Cuts:
    """The data and order edges that cross between parts."""

    part_of: dict[str, int]
    #: Per part: the (stage, output) pairs it exports and imports.
    exports: list[set[Edge]]
    imports: list[set[Edge]]
    #: Edges whose content hash a cached stage's key reads.
    hash_needed: set[Edge]
    part_deps: list[set[int]]


def find_cuts(parts: list[list[LoweredStage]]) -> Cuts:
    part_of = {item.plan.stage.name: i for i, part in enumerate(parts) for item in part}
    cuts = Cuts(part_of, [set() for _ in parts], [set() for _ in parts], set(),
                [set() for _ in parts])
    for i, part in enumerate(parts):
        for item in part:
            for u in item.plan.stage.upstream():
                if u in part_of and part_of[u] != i:
                    cuts.part_deps[i].add(part_of[u])
            for s, o in item.plan.upstream:
                if part_of.get(s, i) != i:
                    cuts.exports[part_of[s]].add((s, o))
                    cuts.imports[i].add((s, o))
                    if (s, o) in item.hash_inputs:
                        cuts.hash_needed.add((s, o))
    return cuts


def exported_art(s: str, o: str) -> str:
    return f"{s}-{o}"


def exported_hash(s: str, o: str) -> str:
    return f"{s}-{o}-hash"


def part_interface(cuts: Cuts, i: int, tasks_of: dict[str, str]) -> Json:
    """The ``inputs`` and ``outputs`` of part ``i``'s DAG template."""
    out: Json = {}
    inputs: Json = {}
    hashes = sorted(k for k in cuts.imports[i] if k in cuts.hash_needed)
    if hashes:
        inputs["parameters"] = [{"name": exported_hash(s, o)} for s, o in hashes]
    if cuts.imports[i]:
        inputs["artifacts"] = [{"name": artifact_input_name(s, o)}
                               for s, o in sorted(cuts.imports[i])]
    if inputs:
        out["inputs"] = inputs
    exports = sorted(cuts.exports[i])
    if exports:
        out_params = [
            {"name": exported_hash(s, o), "valueFrom": {
                "parameter": local_refs(o, tasks_of[s])[0]}}
            for s, o in exports if (s, o) in cuts.hash_needed
        ]
        outputs: Json = {}
        if out_params:
            outputs["parameters"] = out_params
        outputs["artifacts"] = [
            {"name": exported_art(s, o), "from": local_refs(o, tasks_of[s])[1]}
            for s, o in exports
        ]
        out["outputs"] = outputs
    return out


def part_document(ctx: Context, i: int, part: list[LoweredStage], cuts: Cuts,
                  tasks_of: dict[str, str]) -> Json:
    """The WorkflowTemplate of part ``i``: its DAG, then its stages' templates."""
    upstream = UpstreamRefs()
    for s, o in cuts.imports[i]:
        upstream.refs[(s, o)] = (
            "{{inputs.parameters." + exported_hash(s, o) + "}}",
            "{{inputs.artifacts." + artifact_input_name(s, o) + "}}",
        )
    dag: Json = {"name": PART_TEMPLATE, **part_interface(cuts, i, tasks_of)}
    dag["dag"] = {"tasks": dag_tasks(part, upstream)}
    templates = [dag]
    for item in part:
        templates.extend(item.templates)
    spec: Json = {}
    args = arguments(ctx)
    if args:
        spec["arguments"] = args
    spec["templates"] = templates
    return {
        "apiVersion": API_VERSION,
        "kind": "WorkflowTemplate",
        "metadata": metadata(ctx, "WorkflowTemplate", naming.part_name(ctx.pipeline.name, i)),
        "spec": spec,
    }


def part_task(ctx: Context, i: int, cuts: Cuts) -> Json:
    """The entrypoint's task calling part ``i``."""
    entry: Json = {"name": f"part-{i}", "templateRef": {
        "name": naming.part_name(ctx.pipeline.name, i), "template": PART_TEMPLATE}}
    if cuts.part_deps[i]:
        entry["depends"] = " && ".join(f"part-{d}" for d in sorted(cuts.part_deps[i]))
    hashes = sorted(k for k in cuts.imports[i] if k in cuts.hash_needed)
    call_params = [
        {"name": exported_hash(s, o),
         "value": "{{tasks.part-" + str(cuts.part_of[s]) + ".outputs.parameters."
                  + exported_hash(s, o) + "}}"}
        for s, o in hashes
    ]
    call_arts = [
        {"name": artifact_input_name(s, o),
         "from": "{{tasks.part-" + str(cuts.part_of[s]) + ".outputs.artifacts."
                 + exported_art(s, o) + "}}"}
        for s, o in sorted(cuts.imports[i])
    ]
    set_arguments(entry, call_params, call_arts)
    return entry


def split_objects(ctx: Context, kind: str, lowered: list[LoweredStage]) -> list[Json]:
    parts = split_parts(ctx, lowered)
    if len(parts) > ctx.options.max_tasks:
        ctx.error("P0403", f"pipeline needs {len(parts)} parts, more than Argo's "
                  f"{ctx.options.max_tasks} tasks in the entrypoint DAG", ("stages",))
    cuts = find_cuts(parts)
    tasks_of = {item.plan.stage.name: item.plan.task for item in lowered}
    documents = [part_document(ctx, i, part, cuts, tasks_of) for i, part in enumerate(parts)]
    main_tasks = [part_task(ctx, i, cuts) for i in range(len(parts))]
    main = document(ctx, kind, [{"name": naming.ENTRYPOINT, "dag": {"tasks": main_tasks}}])
    return [*documents, main]


def check_sizes(ctx: Context, documents: list[Json]) -> None:
    for doc in documents:
        size = len(json.dumps(doc, separators=(",", ":")).encode("utf-8"))
        if size > MAX_OBJECT_BYTES:
            name = doc["metadata"].get("name") or doc["metadata"].get("generateName")
            ctx.error("P0403", f"{doc['kind']} `{name}` would be {size} bytes, over Argo's "
                      "1 MiB object limit", ())


def assemble(ctx: Context, kind: str, lowered: list[LoweredStage]) -> list[Json]:
    check_names(ctx, lowered)
    n_templates = 1 + sum(len(item.templates) for item in lowered)
    if n_templates <= ctx.options.max_templates and len(lowered) <= ctx.options.max_tasks:
        documents = single_object(ctx, kind, lowered)
    else:
        documents = split_objects(ctx, kind, lowered)
    check_sizes(ctx, documents)
    return documents
