"""Entry points of the front end: parse, lower, validate, check; results plus diagnostics."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from durapipe.dsl import diagnostics as dg
from durapipe.dsl import lower as lw
from durapipe.dsl import parser, validate
from durapipe.dsl.heap import gc_paused as gc_paused  # re-exported: the LSP pauses it too
from durapipe.dsl.model import Pipeline
from durapipe.dsl.source import MAX_SOURCE_BYTES, Source, SourceMap, Span
from durapipe.dsl.syntax import File, ParamsBlock


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
    """Validate lowered data and run the semantic checks; shared with the builder."""
    pipeline, errors = validate.model_from_data(data, source_map, fallback)
    reported = diagnostics  # by parsing and lowering: what the later phases may follow from
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


def loads(text: str, path: str = "<input>") -> LoadResult:
    """Load a pipeline from ``.pipe`` text."""
    with gc_paused():
        return _loads(text, path)


def _loads(text: str, path: str) -> LoadResult:
    syntax, diagnostics = parser.parse(Source(path, text))
    return from_syntax(syntax, diagnostics)


def from_syntax(syntax: File | None, diagnostics: list[dg.Diagnostic]) -> LoadResult:
    """The phases after parsing, on a parsed file and the parser's diagnostics."""
    if syntax is None:
        return LoadResult(None, dg.sort_unique(diagnostics))
    with gc_paused():
        return _from_syntax(syntax, diagnostics)


def _from_syntax(syntax: File, diagnostics: list[dg.Diagnostic]) -> LoadResult:
    source = syntax.source
    lowered = lw.lower(syntax)
    result = finish(lowered.data, lowered.source_map, Span(source, 0, 0),
                    diagnostics + lowered.diagnostics)
    result.diagnostics = validate.drop_missing_after_mistakes(result.diagnostics, [
        ("params", None, item.span) if isinstance(item, ParamsBlock)
        else (item.name, item.label.text if item.label else None, item.span)
        for item in syntax.items])
    result.syntax = syntax
    return result


#: How much of a refused file's first line the diagnostic shows (its renderer cuts it anyway).
_SHOWN_BYTES = 1000


def read_source(path: str | os.PathLike[str]) -> tuple[Source | None, list[dg.Diagnostic]]:
    """Read a file as UTF-8, turning every I/O problem into a diagnostic.  A file over
    :data:`MAX_SOURCE_BYTES` is refused after reading one byte more than that, so neither a
    huge file nor an endless one (``/dev/zero``, a pipe) costs more."""
    shown = str(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_SOURCE_BYTES + 1)
            status = os.fstat(handle.fileno())
    except OSError as exc:
        return None, [dg.Diagnostic("P0001", f"cannot read {shown}: {exc.strerror or exc}",
                                    location=shown)]
    if len(raw) > MAX_SOURCE_BYTES:
        newline = raw.find(b"\n", 0, _SHOWN_BYTES)
        first_line = raw[:newline if newline >= 0 else _SHOWN_BYTES].decode("utf-8", "replace")
        size = status.st_size if stat.S_ISREG(status.st_mode) else None
        return None, [parser.too_large(Source(shown, first_line), size)]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, [dg.Diagnostic(
            "P0002", f"{shown} is not UTF-8 text (invalid byte at offset {exc.start})",
            location=shown, help="is this a binary file?")]
    return Source(shown, text), []


def load_path(path: str | os.PathLike[str]) -> LoadResult:
    """Load a ``.pipe`` file, or a Python module exposing ``pipeline`` (builder API)."""
    if str(path).endswith(".py"):
        from durapipe.dsl import builder

        return builder.load_module(path)
    source, diagnostics = read_source(path)
    if source is None:
        return LoadResult(None, diagnostics)
    return loads(source.text, source.path)
