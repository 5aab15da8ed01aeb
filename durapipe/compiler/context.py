"""What every phase of the compiler shares: the pipeline, the options and the diagnostics."""

from __future__ import annotations

from dataclasses import dataclass, field

from durapipe.compiler.options import CompileOptions
from durapipe.dsl import catalog
from durapipe.dsl.diagnostics import Diagnostic, Label, Severity
from durapipe.dsl.model import Pipeline
from durapipe.dsl.source import lookup

Loc = tuple[object, ...]


@dataclass
class Context:
    pipeline: Pipeline
    options: CompileOptions
    profile: catalog.ClusterProfile
    diagnostics: list[Diagnostic] = field(default_factory=list)

    def error(self, code: str, message: str, loc: Loc = (), *,
              help: str | None = None, severity: Severity = Severity.ERROR) -> None:
        span = lookup(self.options.source_map, loc) if self.options.source_map else None
        labels = (Label(span),) if span is not None else ()
        where = self.options.source_path
        if span is None and loc:
            where = f"{where or '<pipeline>'}: {'.'.join(str(p) for p in loc)}"
        self.diagnostics.append(
            Diagnostic(code, message, labels, help, location=where, severity=severity)
        )
