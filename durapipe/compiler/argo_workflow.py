"""Assembly: stage templates into the entrypoint DAG and the document of the chosen kind.

A pipeline within Argo's limits (200 templates per object, 200 tasks per DAG) becomes one
object.  A bigger one is cut, in topological order, into parts: each part is a
WorkflowTemplate holding a ``part`` DAG over its stages, and each runs as a child Workflow of
its own, which the run's entrypoint DAG creates through a ``resource`` template and waits for.
Not ``templateRef``: a running Workflow copies every template it resolves by reference into
``status.storedTemplates``, and 2,000 stages' worth is past the 1 MiB Argo can store (the run
ends ``Error``).  Data crossing a cut travels as the child's global output parameters.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from durapipe.compiler import naming
from durapipe.compiler.argo_pod import LABEL_PIPELINE, MANAGED_BY, RESUME_FROM_PARAM
from durapipe.compiler.argo_stage import SHARED_TEMPLATES, LoweredStage
from durapipe.compiler.argo_text import artifact_input_name, hash_param_name
from durapipe.compiler.context import CompileContext
from durapipe.compiler.plan import kubelet_literal, param_value
from durapipe.dsl.model import Pipeline

Json = dict[str, Any]

API_VERSION = "argoproj.io/v1alpha1"
PART_TEMPLATE = "part"
#: On a part's WorkflowTemplate and its child Workflows: which part.
LABEL_PART = "durapipe.dev/part"
#: On a child Workflow: the run that created it.
LABEL_PARENT = "durapipe.dev/parent-workflow"
#: The stage templates of one part take at most this much.  A running child Workflow holds its
#: WorkflowTemplate's spec twice (``status.storedWorkflowTemplateSpec``, and template by
#: template in ``status.storedTemplates``) beside its arguments, global outputs and node
#: status: a 456 KB part made a 975 KB child on the e2e control plane.  And Argo v4.1.2
#: validates a new Workflow from a WorkflowTemplate by resolving each of its templates through
#: a live GET of the whole WorkflowTemplate (``validate.Workflow``), so a child's start costs
#: (templates x size), quadratic in the part: smaller parts keep that, summed over the
#: pipeline, proportional to the part size.
MAX_PART_BYTES = 128 * 1024
RAW_OPEN, RAW_CLOSE = "@@raw:", "@@"
#: Kubernetes' limit on one object (etcd), which Argo inherits.
MAX_OBJECT_BYTES = 1024 * 1024


def arguments(ctx: CompileContext) -> Json:
    """The Workflow's parameters with their defaults.  Argo puts a value as it stands here into
    the container's command, args and env, which the kubelet expands (``$(NAME)``), so a
    default is written as :func:`kubelet_literal` text: the program gets the default as
    written, as under ``durapipe run``.  A value given at submit time replaces it unescaped
    (the documented exception: it is the submitter's text for the kubelet)."""
    params: list[Json] = []
    for param in ctx.pipeline.params:
        entry: Json = {"name": param.name}
        if param.default is not None:
            entry["value"] = kubelet_literal(param_value(param.default))
        if param.description:
            entry["description"] = param.description
        params.append(entry)
    if checkpoints(ctx.pipeline):
        params.append({"name": RESUME_FROM_PARAM, "value": ""})
    return {"parameters": params} if params else {}


def checkpoints(pipeline: Pipeline) -> bool:
    """Whether a stage checkpoints: its pods read ``RESUME_FROM_PARAM``, so the Workflow
    declares it (empty: no earlier run's lines)."""
    return any(stage.checkpoint is not None for stage in pipeline.stages)


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


def set_arguments(task: Json, parameters: list[Json], artifacts: list[Any]) -> None:
    """A DAG task's ``arguments``, with empty lists left out (and no key when both are).
    ``artifacts`` are dicts, or in a child Workflow's manifest ``_raw`` markers."""
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


def check_names(ctx: CompileContext, lowered: list[LoweredStage]) -> None:
    # name -> (who made it, the stage's index: None for the entrypoint)
    seen: dict[str, tuple[str, int | None]] = {naming.ENTRYPOINT: ("the entrypoint DAG", None)}
    seen.update((name, ("a template every stage shares", None)) for name in SHARED_TEMPLATES)
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


def metadata(ctx: CompileContext, kind: str, name: str) -> Json:
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


def workflow_spec(ctx: CompileContext, templates: list[Json]) -> Json:
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


def document(ctx: CompileContext, kind: str, templates: list[Json]) -> Json:
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


def single_object(ctx: CompileContext, kind: str, lowered: list[LoweredStage]) -> list[Json]:
    tasks = dag_tasks(lowered, UpstreamRefs())
    templates: list[Json] = [{"name": naming.ENTRYPOINT, "dag": {"tasks": tasks}}]
    for item in lowered:
        templates.extend(item.templates)
    return [document(ctx, kind, templates + shared_templates(lowered))]


def shared_templates(lowered: list[LoweredStage]) -> list[Json]:
    """One copy of each shared template the stages use, last and in a fixed order."""
    used = set().union(*(item.shared for item in lowered))
    return [copy.deepcopy(t) for name, t in SHARED_TEMPLATES.items() if name in used]


def split_parts(ctx: CompileContext, lowered: list[LoweredStage]) -> list[list[LoweredStage]]:
    budget_templates = ctx.options.max_templates - 2  # the child's entrypoint and the part DAG
    budget_tasks = ctx.options.max_tasks
    parts: list[list[LoweredStage]] = [[]]
    count = nbytes = 0
    shared: set[str] = set()  # the shared templates the part holds, one copy each
    for item in lowered:
        size = len(item.templates) + len(item.shared - shared)
        item_bytes = len(json.dumps(item.templates, separators=(",", ":")))
        if parts[-1] and (count + size > budget_templates or len(parts[-1]) >= budget_tasks
                          or nbytes + item_bytes > MAX_PART_BYTES):
            parts.append([])
            count = nbytes = 0
            shared = set()
            size = len(item.templates) + len(item.shared)
        parts[-1].append(item)
        shared |= item.shared
        count += size
        nbytes += item_bytes
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

    def hashes_into(self, i: int) -> list[Edge]:
        """The edges into part ``i`` whose content hash crosses with them, sorted."""
        return sorted(k for k in self.imports[i] if k in self.hash_needed)


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


def exported_hash(s: str, o: str) -> str:
    return f"{s}-{o}-hash"


def exported_artifact(s: str, o: str) -> str:
    """The parameter that carries artifact ``(s, o)`` across a cut, as its JSON."""
    return f"{artifact_input_name(s, o)}-artifact"


def part_interface(cuts: Cuts, i: int, tasks_of: dict[str, str]) -> Json:
    """The ``inputs`` and ``outputs`` of part ``i``'s DAG template.

    Outputs are global (``globalName``), so they reach the child Workflow's
    ``status.outputs.parameters``, where the run reads them.  Only parameters: Argo resolves a
    DAG's output artifact to its source artifact and drops the ``globalName`` on the way
    (``getTemplateOutputsFromScope``), so an artifact crosses as its JSON (``toJson``), which
    names its location in whatever repository it was saved to.
    """
    out: Json = part_inputs(cuts, i)
    exports = sorted(cuts.exports[i])
    if exports:
        params: list[Json] = []
        for s, o in exports:
            if (s, o) in cuts.hash_needed:
                params.append({"name": exported_hash(s, o), "globalName": exported_hash(s, o),
                               "valueFrom": {"parameter": local_refs(o, tasks_of[s])[0]}})
            params.append({"name": exported_artifact(s, o), "globalName": exported_artifact(s, o),
                           "valueFrom": {"expression": f"toJson(tasks['{tasks_of[s]}'].outputs"
                                                       f".artifacts['{o}'])"}})
        out["outputs"] = {"parameters": params}
    return out


def child_entry(cuts: Cuts, i: int) -> Json:
    """The child Workflow's entrypoint: a DAG whose one task is the part.  The part must be a
    task (not the entrypoint itself) because Argo exports only task nodes' outputs to the
    workflow's global outputs; its inputs come from the Workflow's ``arguments``."""
    task: Json = {"name": PART_TEMPLATE, "template": PART_TEMPLATE}
    hashes = cuts.hashes_into(i)
    set_arguments(
        task,
        [{"name": exported_hash(s, o), "value": "{{inputs.parameters." + exported_hash(s, o)
          + "}}"} for s, o in hashes],
        [{"name": artifact_input_name(s, o), "from": "{{inputs.artifacts."
          + artifact_input_name(s, o) + "}}"} for s, o in sorted(cuts.imports[i])])
    return {"name": naming.ENTRYPOINT, **part_inputs(cuts, i), "dag": {"tasks": [task]}}


def part_inputs(cuts: Cuts, i: int) -> Json:
    """``{"inputs": ...}`` of part ``i``'s templates: the hashes and artifacts it imports."""
    inputs: Json = {}
    hashes = cuts.hashes_into(i)
    if hashes:
        inputs["parameters"] = [{"name": exported_hash(s, o)} for s, o in hashes]
    if cuts.imports[i]:
        inputs["artifacts"] = [{"name": artifact_input_name(s, o)}
                               for s, o in sorted(cuts.imports[i])]
    return {"inputs": inputs} if inputs else {}


def part_document(ctx: CompileContext, i: int, part: list[LoweredStage], cuts: Cuts,
                  tasks_of: dict[str, str]) -> Json:
    """The WorkflowTemplate of part ``i``: the child's entrypoint, the part DAG, then its
    stages' templates.  The child runs under the pipeline's account and pull secrets."""
    upstream = UpstreamRefs()
    for s, o in cuts.imports[i]:
        upstream.refs[(s, o)] = (
            "{{inputs.parameters." + exported_hash(s, o) + "}}",
            "{{inputs.artifacts." + artifact_input_name(s, o) + "}}",
        )
    dag: Json = {"name": PART_TEMPLATE, **part_interface(cuts, i, tasks_of)}
    dag["dag"] = {"tasks": dag_tasks(part, upstream)}
    templates = [child_entry(cuts, i), dag]
    for item in part:
        templates.extend(item.templates)
    templates.extend(shared_templates(part))
    meta = metadata(ctx, "WorkflowTemplate", naming.part_name(ctx.pipeline.name, i))
    meta["labels"] = dict(sorted({**meta["labels"], LABEL_PART: str(i)}.items()))
    return {"apiVersion": API_VERSION, "kind": "WorkflowTemplate", "metadata": meta,
            "spec": workflow_spec(ctx, templates)}


def _raw(expression: str) -> str:
    """A marker for a JSON value of the manifest that Argo fills in as an expression (no
    name or label the marker could meet holds ``@``)."""
    return RAW_OPEN + expression + RAW_CLOSE


def part_manifest(ctx: CompileContext, i: int, cuts: Cuts) -> str:
    """The child Workflow of part ``i``, as JSON text with Argo expressions in it.

    Values that are JSON of their own (a parameter as ``toJson`` quotes it, an artifact's JSON)
    are spliced in unquoted with ``{{=...}}``, so no value can break the manifest."""
    pipeline = ctx.pipeline
    labels = {**MANAGED_BY, LABEL_PIPELINE: pipeline.name, **pipeline.labels,
              LABEL_PARENT: "{{workflow.name}}", LABEL_PART: str(i)}
    params: list[Json] = [
        {"name": p.name, "value": _raw("toJson(workflow.parameters['" + p.name + "'])")}
        for p in pipeline.params]
    if checkpoints(pipeline):
        params.append({"name": RESUME_FROM_PARAM,
                       "value": _raw("toJson(workflow.parameters['" + RESUME_FROM_PARAM + "'])")})
    hashes = cuts.hashes_into(i)
    params += [{"name": exported_hash(s, o),
                "value": "{{inputs.parameters." + exported_hash(s, o) + "}}"}
               for s, o in hashes]
    arts = [_raw("inputs.parameters['" + exported_artifact(s, o) + "']")
            for s, o in sorted(cuts.imports[i])]
    spec: Json = {"workflowTemplateRef": {"name": naming.part_name(pipeline.name, i)}}
    set_arguments(spec, params, arts)
    manifest: Json = {
        "apiVersion": API_VERSION, "kind": "Workflow",
        "metadata": {"generateName": "{{workflow.name}}-part-" + str(i) + "-",
                     "namespace": "{{workflow.namespace}}", "labels": dict(sorted(labels.items()))},
        "spec": spec,
    }
    text = json.dumps(manifest, separators=(",", ":"))
    return text.replace(f'"{RAW_OPEN}', "{{=").replace(f'{RAW_CLOSE}"', "}}")


def part_call(ctx: CompileContext, i: int, cuts: Cuts) -> Json:
    """The run's template for part ``i``: create its child Workflow, wait for its end, read the
    data its later parts need from the child's global outputs."""
    hashes = cuts.hashes_into(i)
    inputs = [{"name": exported_hash(s, o)} for s, o in hashes]
    inputs += [{"name": exported_artifact(s, o)} for s, o in sorted(cuts.imports[i])]
    template: Json = {"name": f"part-{i}"}
    if inputs:
        template["inputs"] = {"parameters": inputs}
    outputs: list[Json] = []
    for s, o in sorted(cuts.exports[i]):
        if (s, o) in cuts.hash_needed:
            outputs.append({"name": exported_hash(s, o), "valueFrom": {
                "jqFilter": global_output(exported_hash(s, o))}})
        # The artifact is renamed to the input it becomes in the next child's arguments.
        outputs.append({"name": exported_artifact(s, o), "valueFrom": {
            "jqFilter": global_output(exported_artifact(s, o)) + " | fromjson | del(.path)"
                        + f' | .name = "{artifact_input_name(s, o)}"'}})
    if outputs:
        template["outputs"] = {"parameters": outputs}
    template["resource"] = {
        "action": "create",
        "setOwnerReference": True,
        "successCondition": "status.phase == Succeeded",
        "failureCondition": "status.phase in (Failed, Error)",
        "manifest": part_manifest(ctx, i, cuts),
    }
    return template


def global_output(name: str) -> str:
    return f'.status.outputs.parameters[] | select(.name == "{name}") | .value'


def part_task(i: int, cuts: Cuts) -> Json:
    """The entrypoint's task calling part ``i``."""
    entry: Json = {"name": f"part-{i}", "template": f"part-{i}"}
    if cuts.part_deps[i]:
        entry["depends"] = " && ".join(f"part-{d}" for d in sorted(cuts.part_deps[i]))

    def ref(s: str, name: str) -> str:
        return "{{tasks.part-" + str(cuts.part_of[s]) + ".outputs.parameters." + name + "}}"

    hashes = cuts.hashes_into(i)
    params = [{"name": exported_hash(s, o), "value": ref(s, exported_hash(s, o))}
              for s, o in hashes]
    params += [{"name": exported_artifact(s, o), "value": ref(s, exported_artifact(s, o))}
               for s, o in sorted(cuts.imports[i])]
    set_arguments(entry, params, [])
    return entry


def split_objects(ctx: CompileContext, kind: str, lowered: list[LoweredStage]) -> list[Json]:
    parts = split_parts(ctx, lowered)
    if len(parts) + 1 > ctx.options.max_templates or len(parts) > ctx.options.max_tasks:
        ctx.error("P0403", f"pipeline needs {len(parts)} parts, more than Argo's "
                  f"{ctx.options.max_tasks} tasks in the entrypoint DAG", ("stages",))
    cuts = find_cuts(parts)
    tasks_of = {item.plan.stage.name: item.plan.task for item in lowered}
    documents = [part_document(ctx, i, part, cuts, tasks_of) for i, part in enumerate(parts)]
    main_tasks = [part_task(i, cuts) for i in range(len(parts))]
    templates = [{"name": naming.ENTRYPOINT, "dag": {"tasks": main_tasks}}]
    templates += [part_call(ctx, i, cuts) for i in range(len(parts))]
    return [*documents, document(ctx, kind, templates)]


def creates_workflows(documents: list[Json]) -> bool:
    """Whether the run creates child Workflows (a split pipeline), which its pods' account
    must then be allowed to do."""
    return any(d["kind"] == "WorkflowTemplate" and LABEL_PART in d["metadata"]["labels"]
               for d in documents)


def check_sizes(ctx: CompileContext, documents: list[Json]) -> None:
    for doc in documents:
        size = len(json.dumps(doc, separators=(",", ":")).encode("utf-8"))
        if size > MAX_OBJECT_BYTES:
            name = doc["metadata"].get("name") or doc["metadata"].get("generateName")
            ctx.error("P0403", f"{doc['kind']} `{name}` would be {size} bytes, over Argo's "
                      "1 MiB object limit", ())


def assemble(ctx: CompileContext, kind: str, lowered: list[LoweredStage]) -> list[Json]:
    check_names(ctx, lowered)
    n_templates = 1 + sum(len(item.templates) for item in lowered) + len(shared_templates(lowered))
    if n_templates <= ctx.options.max_templates and len(lowered) <= ctx.options.max_tasks:
        documents = single_object(ctx, kind, lowered)
    else:
        documents = split_objects(ctx, kind, lowered)
    check_sizes(ctx, documents)
    return documents
