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
from durapipe.plan.bound import UNBOUNDED_CODES, Figures, PipelineBound, Prices, StageBound

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
                help=f'give it one in a price file: `--prices FILE` with '
                     f'{{"gpu": {{"{stage.detail}": 2.5}}}} (US dollars per GPU-hour)'))
    assert len(pipeline.stages) == len(bound.stages)
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
