"""The durapipe compiler: a validated ``Pipeline`` to Argo Workflows YAML.

>>> from durapipe.dsl.model import Pipeline, Stage
>>> p = Pipeline(name="hello", stages=(Stage(name="say", image="busybox", command=("echo",)),))
>>> result = compile_pipeline(p, CompileOptions())
>>> [d["kind"] for d in result.documents], result.diagnostics
(['Workflow'], [])

The compile path imports neither hera nor PyYAML; see ``docs/lowering.md`` for what each
construct becomes and why.
"""

from __future__ import annotations

from typing import Any

from durapipe.compiler.options import ARGO_VERSIONS, CompileOptions, CompileResult
from durapipe.compiler.serialize import to_yaml as _to_yaml

__all__ = ["ARGO_VERSIONS", "CompileOptions", "CompileResult", "compile_pipeline", "header",
           "to_yaml"]


def compile_pipeline(pipeline: Any, options: CompileOptions | None = None) -> CompileResult:
    """Lower ``pipeline`` (a ``durapipe.dsl.model.Pipeline``) to Argo documents.

    One input contract: a model's references and stage graph are checked by the front end's
    rules (``validate.check_references``: unknown references P0301, cycles P0302), already
    done for a model from ``durapipe.dsl.load`` or the builder, done here for one built in
    code; the lowering then reports only what Argo cannot carry.  User errors come back as
    diagnostics, never as exceptions; ``documents`` is empty when any diagnostic is an error.
    """
    from durapipe.dsl.heap import gc_paused

    with gc_paused():
        return _compile(pipeline, options)


def _compile(pipeline: Any, options: CompileOptions | None) -> CompileResult:
    from durapipe.compiler import argo_stage, argo_workflow, plan
    from durapipe.compiler.context import CompileContext
    from durapipe.dsl import catalog
    from durapipe.dsl.diagnostics import sort_unique
    from durapipe.dsl.validate import check_references

    options = options or CompileOptions()
    profile = catalog.PROFILES[pipeline.cluster.profile]
    ctx = CompileContext(pipeline=pipeline, options=options, profile=profile)
    ctx.diagnostics.extend(check_references(pipeline, options.source_map or {}))
    kind = options.kind or pipeline.output_kind
    if kind != "cron" and pipeline.schedules:
        from durapipe.dsl.source import lookup
        from durapipe.dsl.validate import schedule_conflict

        ctx.diagnostics.append(schedule_conflict(kind, lookup(options.source_map or {}, (
            "kind",) if options.kind is None else ("schedules",))))
    if kind == "cron" and not pipeline.schedules:
        ctx.error("P0408", f"pipeline `{pipeline.name}` is compiled as a CronWorkflow but has "
                  "no `schedule`", ("schedules",), help="add `schedule = \"0 3 * * *\"` or "
                  "choose `--kind workflow`")
    if not pipeline.stages:
        ctx.error("P0202", f"pipeline `{pipeline.name}` has no stages; Argo needs at least one "
                  "task", ("stages",))
    if pipeline.limits is not None or any(s.limits is not None for s in pipeline.stages):
        from durapipe.plan.bound_render import limit_diagnostics

        ctx.diagnostics.extend(limit_diagnostics(pipeline, options.source_map))
    planned = plan.plan_pipeline(pipeline,
                                 checkpoint_grace_seconds=options.checkpoint_grace_seconds)
    lowered = [argo_stage.lower_stage(ctx, stage) for stage in planned.stages]
    documents = argo_workflow.assemble(ctx, kind, lowered)
    if pipeline.checkpoint_gc is not None and pipeline.storage:
        from durapipe.compiler.checkpoint_gc import cron_workflow

        documents.append(cron_workflow(ctx, pipeline.checkpoint_gc))
    diagnostics = sort_unique(ctx.diagnostics)
    if any(d.is_error for d in diagnostics):
        return CompileResult(diagnostics=diagnostics)
    runtime_objects = []
    if options.runtime_image is None:
        from durapipe.compiler import runtime_delivery

        runtime_objects.append(runtime_delivery.configmap(ctx))
    return CompileResult(documents=documents, runtime_objects=runtime_objects,
                         diagnostics=diagnostics)


#: The second line of a file in a directory durapipe manages (``-o DIR/``,
#: :mod:`durapipe.compiler.managed`), which a single stream (stdout, ``-o FILE``) never has.
MANAGED_LINE = "Do not edit: change the source and run `durapipe compile` into this directory."


def header(source: str | None, *, managed: bool = False) -> str:
    """The comment that heads every compiled file: source and durapipe version, nothing else
    (``managed``: a file of ``-o DIR/``, whose source is recorded relative to the directory)."""
    from durapipe import __version__

    # The extension is dropped so that a `.pipe` file and its builder `.py` twin compile to
    # byte-identical output.
    if source:
        for suffix in (".pipe", ".py"):
            source = source.removesuffix(suffix)
    origin = f" from {source}" if source else ""
    return (
        f"Generated by durapipe {__version__}{origin}.\n"
        + (MANAGED_LINE if managed else
           "Do not edit: change the source and run `durapipe compile`.")
    )


def to_yaml(documents: list[dict[str, Any]], header: str = "") -> str:
    """Deterministic multi-document YAML (see :mod:`durapipe.compiler.serialize`)."""
    return _to_yaml(documents, header)
