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
class CompileContext:
    pipeline: Pipeline
    options: CompileOptions
    profile: catalog.ClusterProfile
    diagnostics: list[Diagnostic] = field(default_factory=list)

    def error(self, code: str, message: str, loc: Loc = (), *,
              help: str | None = None, severity: Severity = Severity.ERROR,
              related: tuple[Loc, str] | None = None) -> None:
        """``related``: a second place the problem involves, and what it is there."""
        sm = self.options.source_map
        span = lookup(sm, loc) if sm else None
        labels: tuple[Label, ...] = (Label(span),) if span is not None else ()
        other = lookup(sm, related[0]) if sm and related is not None else None
        if other is not None and related is not None:
            labels += (Label(other, related[1]),)
        where = self.options.source_path
        if span is None and loc:
            where = f"{where or '<pipeline>'}: {'.'.join(str(p) for p in loc)}"
        self.diagnostics.append(
            Diagnostic(code, message, labels, help, location=where, severity=severity)
        )
