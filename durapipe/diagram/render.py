"""The stage DAG as Mermaid or Graphviz dot text, deterministic like the compiled YAML.

Nodes are the stages in declaration order; an edge is a data dependency (labelled with the
outputs it carries) or a ``needs`` (dashed).  Each label holds what decides how a stage
survives: its retry budgets, its memory (the OOM ladder's rungs), its GPU types in fallback
order, whether its result is cached, and what it can cost at worst (``durapipe bound``).
"""

from __future__ import annotations

from durapipe.diagram import summary
from durapipe.dsl.model import Pipeline, Stage
from durapipe.plan import bound_render
from durapipe.plan.bound import Prices, stage_bound


def edges(pipeline: Pipeline) -> list[tuple[str, str, tuple[str, ...], bool]]:
    """``(upstream, stage, outputs carried, data edge?)`` for every dependency."""
    known = {s.name for s in pipeline.stages}
    out = []
    for stage in pipeline.stages:
        carried: dict[str, list[str]] = {}
        for ref in stage.references():
            if ref.stage is not None and ref.stage in known and ref.stage != stage.name:
                names = carried.setdefault(ref.stage, [])
                if ref.is_output and ref.path[2] not in names:
                    names.append(ref.path[2])
        for upstream in stage.upstream():
            if upstream not in known or upstream == stage.name:
                continue
            out.append((upstream, stage.name, tuple(carried.get(upstream, ())),
                        upstream in carried))
    return out


def label_lines(stage: Stage, prices: Prices | None = None) -> list[str]:
    """The lines of a stage's label; ``prices`` those of its pipeline (the defaults without)."""
    b = summary.budgets(stage)
    retry = f"{b.tries} tr{'ies' if b.tries != 1 else 'y'}, {b.preemptions} preemptions"
    lines = [stage.name, f"retry: {retry}"]
    memory = summary.memory_text(stage)
    if memory:
        lines.append(f"memory: {memory}")
    gpus = summary.gpu_text(stage)
    if gpus:
        lines.append(f"gpu: {gpus}")
    extras = [summary.cache_text(stage)]
    if stage.interruptible:
        extras.append("spot")
    if stage.checkpoint is not None:
        extras.append("checkpointed")
    if stage.distributed is not None:
        extras.append(f"{stage.distributed.replicas} nodes")
    lines.append(", ".join(extras))
    lines.append(bound_render.in_brief(stage_bound(stage, prices)))
    return lines


def _mermaid_text(text: str) -> str:
    # Inside a quoted Mermaid label: quotes and markup characters as entity codes.
    for char, code in (("&", "#amp;"), ('"', "#quot;"), ("<", "#lt;"), (">", "#gt;")):
        text = text.replace(char, code)
    return text


def mermaid(pipeline: Pipeline) -> str:
    ids = {s.name: f"s{i}" for i, s in enumerate(pipeline.stages)}
    out = ["---", f"title: {_mermaid_text(pipeline.name)}", "---", "flowchart TD"]
    prices = Prices.of(pipeline)
    for stage in pipeline.stages:
        first, *rest = label_lines(stage, prices)
        text = "<br/>".join([f"<b>{_mermaid_text(first)}</b>",
                             *(_mermaid_text(line) for line in rest)])
        out.append(f'  {ids[stage.name]}["{text}"]')
    for upstream, name, outputs, data in edges(pipeline):
        if data and outputs:
            out.append(f'  {ids[upstream]} -->|"{_mermaid_text(", ".join(outputs))}"| '
                       f"{ids[name]}")
        elif data:
            out.append(f"  {ids[upstream]} --> {ids[name]}")
        else:
            out.append(f"  {ids[upstream]} -.-> {ids[name]}")
    cached = [ids[s.name] for s in pipeline.stages if s.cache is not None]
    if cached:
        out.append("  classDef cached stroke-width:3px")
        out.append(f"  class {','.join(cached)} cached")
    return "\n".join(out) + "\n"


def _dot_text(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def dot(pipeline: Pipeline) -> str:
    out = [f'digraph "{_dot_text(pipeline.name)}" {{',
           "  rankdir=TB;",
           '  node [shape=box, style="rounded", fontname="Helvetica", fontsize=11];',
           '  edge [fontname="Helvetica", fontsize=10];']
    prices = Prices.of(pipeline)
    for stage in pipeline.stages:
        lines = label_lines(stage, prices)
        label = "\\n".join(_dot_text(line) for line in lines)
        style = ', penwidth=2.5' if stage.cache is not None else ""
        out.append(f'  "{_dot_text(stage.name)}" [label="{label}"{style}];')
    for upstream, name, outputs, data in edges(pipeline):
        attrs = []
        if outputs:
            attrs.append(f'label="{_dot_text(", ".join(outputs))}"')
        if not data:
            attrs.append("style=dashed")
        suffix = f" [{', '.join(attrs)}]" if attrs else ""
        out.append(f'  "{_dot_text(upstream)}" -> "{_dot_text(name)}"{suffix};')
    out.append("}")
    return "\n".join(out) + "\n"
