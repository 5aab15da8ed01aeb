"""What loading a pipeline yields, and the phases every front end ends with.

Below both front ends (``load`` for ``.pipe`` text, ``builder`` for Python), so that each hands
its plain data to :func:`finish` without importing the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from durapipe.dsl import diagnostics as dg
from durapipe.dsl import validate
from durapipe.dsl.model import Pipeline
from durapipe.dsl.source import SourceMap, Span
from durapipe.dsl.syntax import File


@dataclass
class LoadResult:
    pipeline: Pipeline | None
    diagnostics: list[dg.Diagnostic]
    source_map: SourceMap = field(default_factory=dict)
    syntax: File | None = None

    @property
    def ok(self) -> bool:
        return self.pipeline is not None and not dg.has_errors(self.diagnostics)


def finish(data: dict[str, object], source_map: SourceMap, fallback: Span | None,
           diagnostics: list[dg.Diagnostic]) -> LoadResult:
    """Validate converted data and run the semantic checks; shared with the builder."""
    pipeline, errors = validate.model_from_data(data, source_map, fallback)
    reported = diagnostics  # by parsing and converting: what the later phases may follow from
    diagnostics = diagnostics + validate.drop_consequences(errors, reported)
    no_pipeline = dg.Subject("block", "pipeline")
    if pipeline is not None and not any(d.about == no_pipeline for d in diagnostics):
        checked = validate.check(pipeline, source_map, fallback, data)
        diagnostics += validate.drop_consequences(checked, reported)
    diagnostics = dg.sort_unique(diagnostics)
    if dg.has_errors(diagnostics) or pipeline is None:
        return LoadResult(None, diagnostics, source_map)
    validate.mark_checked(pipeline)
    return LoadResult(pipeline, diagnostics, source_map)
