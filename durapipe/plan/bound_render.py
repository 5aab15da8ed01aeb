"""``durapipe bound`` output: a table for people, JSON for tools, diagnostics for the unbounded.

``bound`` computes; this module only words it, so a change of layout cannot change a number.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from durapipe.dsl import diagnostics as dg
from durapipe.dsl import units
from durapipe.dsl.model import Pipeline
from durapipe.dsl.source import SourceMap, lookup
from durapipe.plan.bound import (
    UNBOUNDED_CODES,
    Figure,
    Figures,
    PipelineBound,
    Prices,
    StageBound,
    dominant_budget,
    figure_of,
    pipeline_bound,
)

#: Where each reason for no bound points, under the stage's field path.
_WHERE: dict[str, tuple[str, ...]] = {
    "no_timeout": ("timeout",),
    "restarts_without_budget": ("distributed", "restart_on_maintenance"),
    "unpriced_gpu": ("resources", "gpu", "types"),
}


def unbounded_diagnostics(pipeline: Pipeline, bound: PipelineBound,
                          source_map: SourceMap | None = None) -> list[dg.Diagnostic]:
    """One error per stage whose worst case has no bound, pointing at the setting to add."""
    found: list[dg.Diagnostic] = []
    for index, stage in enumerate(bound.stages):
        if stage.unbounded is None:
            continue
        span = lookup(source_map or {}, ("stages", index, *_WHERE[stage.unbounded]))
        code = UNBOUNDED_CODES[stage.unbounded]
        if stage.unbounded == "no_timeout":
            found.append(dg.error(
                code, f"stage `{stage.stage}` has no `timeout`: its worst case is unbounded",
                span, "an attempt may run for ever",
                help="give the stage the longest an attempt may run, e.g. `timeout = 24h`"))
        elif stage.unbounded == "restarts_without_budget":
            found.append(dg.error(
                code, f"stage `{stage.stage}` restarts on every preemption without a budget: "
                      "its worst case is unbounded",
                span, "preemptions restart the group without spending `max_restarts`",
                help="set `restart_on_maintenance = false` in `distributed` so preemptions "
                     "spend `max_restarts`"))
        else:
            found.append(dg.error(
                code, f"stage `{stage.stage}`: GPU type `{stage.detail}` has no price",
                span, "no price for this type",
                help=f'give it one in the pipeline, `prices {{ gpu {{ {stage.detail} = 2.5 }} }}` '
                     f'(US dollars per GPU-hour), or in a price file: `--prices FILE` with '
                     f'{{"gpu": {{"{stage.detail}": 2.5}}}}'))
    assert len(pipeline.stages) == len(bound.stages)
    return found


_LIMITS: tuple[Figure, ...] = ("max_wall", "max_gpu_hours", "max_cost")
_WORDS: dict[Figure, str] = {"max_wall": "wall time", "max_gpu_hours": "GPU-hours",
                             "max_cost": "cost"}


def _amount(limit: Figure, value: float) -> str:
    if limit == "max_wall":
        return _hours(value)
    return f"${_num(value)}" if limit == "max_cost" else _num(value)


def _budget_words(stage_name: str, budget: str, saved: float, limit: Figure) -> str:
    if budget == "timeout":
        return f"lower `timeout` of stage `{stage_name}`: every worst-case attempt runs to it"
    return (f"lower `{budget}` of stage `{stage_name}` (it adds {_amount(limit, saved)} to "
            f"the worst case), or its `timeout`, which every attempt runs to")


def limit_diagnostics(pipeline: Pipeline, source_map: SourceMap | None = None,
                      prices: Prices | None = None) -> list[dg.Diagnostic]:
    """What ``check`` and ``compile`` refuse: a worst case above a ``limits`` ceiling (P0354
    for a stage's own, P0355 for the pipeline's), and a stage whose worst case a ceiling
    cannot be checked against (P0350-P0352).  Nothing when no ``limits`` block is written."""
    limited = [i for i, s in enumerate(pipeline.stages) if s.limits is not None]
    if pipeline.limits is None and not limited:
        return []
    sm = source_map or {}
    prices = prices or Prices.of(pipeline)
    bound = pipeline_bound(pipeline, prices)
    found: list[dg.Diagnostic] = []
    unbounded = unbounded_diagnostics(pipeline, bound, source_map)
    if pipeline.limits is not None:
        found += unbounded
    else:
        names = {pipeline.stages[i].name for i in limited}
        found += [d for d, s in zip(unbounded, [b for b in bound.stages if b.unbounded])
                  if s.stage in names]
    for index in limited:
        stage, own = pipeline.stages[index], bound.stages[index]
        limits = stage.limits
        if own.worst is None or limits is None:
            continue
        for limit in _LIMITS:
            ceiling = getattr(limits, limit)
            value = figure_of(own.worst, limit)
            if ceiling is None or value <= ceiling:
                continue
            budget, saved = dominant_budget(stage, limit, prices)
            found.append(dg.error(
                "P0354", f"stage `{stage.name}`: worst-case {_WORDS[limit]} "
                         f"{_amount(limit, value)} exceeds `limits.{limit}` "
                         f"({_amount(limit, ceiling)})",
                lookup(sm, ("stages", index, "limits", limit)), "the ceiling",
                help=_budget_words(stage.name, budget, saved, limit),
                notes=["`durapipe bound` shows how each figure is made up"]))
    if pipeline.limits is not None and bound.worst is not None:
        for limit in _LIMITS:
            ceiling = getattr(pipeline.limits, limit)
            value = figure_of(bound.worst, limit)
            if ceiling is None or value <= ceiling:
                continue
            pool = [b for b in bound.stages if limit != "max_wall"
                    or b.stage in bound.critical_path]
            top = max(pool, key=lambda b: figure_of(b.worst, limit) if b.worst else 0.0)
            stage = next(s for s in pipeline.stages if s.name == top.stage)
            budget, saved = dominant_budget(stage, limit, prices)
            where = " along the critical path " + " -> ".join(bound.critical_path) \
                if limit == "max_wall" else ""
            found.append(dg.error(
                "P0355", f"the pipeline's worst-case {_WORDS[limit]}{where} "
                         f"{_amount(limit, value)} exceeds `limits.{limit}` "
                         f"({_amount(limit, ceiling)}); stage `{stage.name}` dominates "
                         f"({_amount(limit, figure_of(top.worst, limit) if top.worst else 0)})",
                lookup(sm, ("limits", limit)), "the ceiling",
                help=_budget_words(stage.name, budget, saved, limit),
                notes=["`durapipe bound` shows how each figure is made up"]))
    return found


def _hours(seconds: float) -> str:
    whole = math.ceil(seconds)
    return units.format_seconds(whole)


def _num(value: float) -> str:
    return f"{value:,.2f}"


def _cells(name: str, worst: Figures | None, best: Figures | None) -> list[str]:
    if worst is None or best is None:
        return [name, "unbounded", "", "", "", ""]
    return [name, f"{worst.attempts} / {best.attempts}",
            f"{_hours(worst.wall_seconds)} / {_hours(best.wall_seconds)}",
            f"{_num(worst.gpu_hours)} / {_num(best.gpu_hours)}",
            f"{_num(worst.node_hours)} / {_num(best.node_hours)}",
            f"{_num(worst.cost)} / {_num(best.cost)}"]


def table(bound: PipelineBound) -> str:
    """Each stage and the pipeline: worst / best, in columns."""
    header = ["stage", "attempts", "wall", "GPU-hours", "node-hours", "cost (USD)"]
    rows = [_cells(s.stage, s.worst, s.best) for s in bound.stages]
    rows.append(_cells("pipeline", bound.worst, bound.best))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths))).rstrip()
             for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.insert(len(lines) - 1, "  ".join("-" * w for w in widths))
    out = ["worst case / best case (first attempt succeeds on the first GPU type)", "",
           *lines]
    if bound.worst is not None:
        out += ["", "critical path: " + " -> ".join(bound.critical_path)]
        for label, by_type in (("GPU-hours", bound.worst.gpu_hours_by_type),
                               ("node-hours", bound.worst.node_hours_by_type)):
            if by_type:
                out.append(f"worst {label} by type: " + ", ".join(
                    f"{k} {_num(v)}" for k, v in by_type.items()))
    return "\n".join(out) + "\n"


_REASONS: dict[str, str] = {
    "no_timeout": "no timeout",
    "restarts_without_budget": "preemptions restart it without a budget",
    "unpriced_gpu": "GPU type {detail} has no price",
}


def in_brief(stage: StageBound) -> str:
    """One line of a stage's bound, for a graph's label and an editor's hover (plain text:
    Mermaid and dot labels take no Markdown)."""
    worst, best = stage.worst, stage.best
    if worst is None or best is None or stage.unbounded is not None:
        reason = _REASONS[stage.unbounded or "no_timeout"].format(detail=stage.detail)
        return f"worst case: unbounded ({reason})"
    text = f"worst case: {_hours(worst.wall_seconds)}"
    if worst.gpu_hours:
        text += f", {_num(worst.gpu_hours)} GPU-h"
    return text + f", ${_num(worst.cost)} (best {_hours(best.wall_seconds)})"


def _figures(figures: Figures | None) -> dict[str, object] | None:
    if figures is None:
        return None
    return {"attempts": figures.attempts, "wall_seconds": figures.wall_seconds,
            "gpu_hours": figures.gpu_hours, "node_hours": figures.node_hours,
            "cost_usd": round(figures.cost, 6),
            "gpu_hours_by_type": figures.gpu_hours_by_type,
            "node_hours_by_type": figures.node_hours_by_type}


def _stage(stage: StageBound) -> dict[str, object]:
    return {"stage": stage.stage, "worst": _figures(stage.worst), "best": _figures(stage.best),
            "unbounded": None if stage.unbounded is None else {
                "reason": stage.unbounded, "code": UNBOUNDED_CODES[stage.unbounded],
                **({"gpu_type": stage.detail} if stage.detail else {})}}


def to_json(bound: PipelineBound, prices: Prices) -> str:
    data: Mapping[str, object] = {
        "stages": [_stage(s) for s in bound.stages],
        "pipeline": {"worst": _figures(bound.worst), "best": _figures(bound.best),
                     "critical_path": list(bound.critical_path)},
        "prices": {"gpu_hour": dict(sorted(prices.gpu.items())), "cpu_hour": prices.cpu_hour,
                   "memory_gib_hour": prices.memory_gib_hour},
    }
    return json.dumps(data, indent=2, sort_keys=False) + "\n"
