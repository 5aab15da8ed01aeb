"""Entry points of the front end: parse, convert to data, validate, check; results plus
diagnostics."""

from __future__ import annotations

import os
import stat

from durapipe.dsl import diagnostics as dg
from durapipe.dsl import tree_to_data as td
from durapipe.dsl import parser, validate
from durapipe.dsl.heap import gc_paused as gc_paused  # re-exported: the LSP pauses it too
from durapipe.dsl.result import LoadResult as LoadResult  # re-exported: durapipe.dsl's API
from durapipe.dsl.result import finish
from durapipe.dsl.source import MAX_SOURCE_BYTES, Source, Span
from durapipe.dsl.syntax import File, ParamsBlock


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
    converted = td.tree_to_data(syntax)
    result = finish(converted.data, converted.source_map, Span(source, 0, 0),
                    diagnostics + converted.diagnostics)
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
