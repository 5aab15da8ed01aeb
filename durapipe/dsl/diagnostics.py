"""Diagnostics: one data model, collected by phases, rendered for terminals and tools."""

from __future__ import annotations

import difflib
import enum
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from durapipe.dsl import codes
from durapipe.dsl.source import Source, Span


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class Label:
    """A span with a short message shown under it; the first label of a diagnostic is primary."""

    span: Span
    message: str = ""
    #: The text under the label is a secret: where the source line is shown, it is masked.
    masked: bool = False


SubjectKind = Literal["block", "attribute", "param", "stage"]


@dataclass(frozen=True)
class Subject:
    """What a diagnostic is about: a block kind, an attribute, a param or a stage, by name."""

    kind: SubjectKind
    name: str


@dataclass(frozen=True)
class Diagnostic:
    code: str
    message: str
    labels: tuple[Label, ...] = ()
    help: str | None = None
    notes: tuple[str, ...] = ()
    #: Where the diagnostic came from when there is no source span (the Python builder's caller).
    location: str | None = None
    severity: Severity = field(default=Severity.ERROR)
    #: What the diagnostic is about, for the phases that weigh one diagnostic against another
    #: (a missing attribute that a typo explains); never rendered.
    about: Subject | None = field(default=None, compare=False)
    #: The name a "did you mean" hint suggests.
    suggestion: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.code not in codes.CODES:
            raise ValueError(f"diagnostic code {self.code} is not in the registry")

    @property
    def span(self) -> Span | None:
        return self.labels[0].span if self.labels else None

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def sort_key(self) -> tuple[str, int, int, str, str]:
        span = self.span
        if span is None:
            return (self.location or "", 0, 0, self.code, self.message)
        return (*span.sort_key(), self.code, self.message)

    def where(self) -> str:
        if self.span is not None:
            return str(self.span)
        return self.location or "<input>"


def error(
    code: str,
    message: str,
    span: Span | None,
    label: str = "",
    *,
    help: str | None = None,
    notes: Iterable[str] = (),
    extra: Iterable[Label] = (),
    about: Subject | None = None,
    suggestion: str | None = None,
) -> Diagnostic:
    labels = ((Label(span, label),) if span is not None else ()) + tuple(extra)
    return Diagnostic(code, message, labels, help, tuple(notes), about=about,
                      suggestion=suggestion)


def warning(code: str, message: str, span: Span | None, label: str = "", *,
            help: str | None = None, masked: bool = False) -> Diagnostic:
    labels = (Label(span, label, masked),) if span is not None else ()
    return Diagnostic(code, message, labels, help, severity=Severity.WARNING)


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice closest to ``word``, if one is close enough to be a likely typo."""
    choices = list(choices)
    lowered = {c.lower(): c for c in choices}
    if word.lower() in lowered and lowered[word.lower()] != word:
        return lowered[word.lower()]
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """A hint naming the closest choice, if one is close enough to be a likely typo."""
    name = closest(word, choices)
    return f"did you mean `{name}`?" if name is not None else None


def sort_unique(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    """Diagnostics in source order, each reported once."""
    seen: set[tuple[object, ...]] = set()
    out = []
    for diag in sorted(diagnostics, key=Diagnostic.sort_key):
        key = (diag.sort_key(), diag.severity)
        if key not in seen:
            seen.add(key)
            out.append(diag)
    return out


def has_errors(diagnostics: Iterable[Diagnostic]) -> bool:
    return any(d.is_error for d in diagnostics)


# -- rendering --------------------------------------------------------------------------------

_TAB = "    "
#: Control characters other than tab are shown as U+FFFD so they cannot move the cursor.
_CONTROLS = {c: "\ufffd" for c in [*range(0x09), *range(0x0a, 0x20), 0x7f]}
#: Source lines longer than this are shown as a window around the labels (minified or
#: generated files can have lines of megabytes, and each diagnostic prints its line).
MAX_SHOWN_LINE = 200
_WINDOW_LEAD = 60


def _expand(line: str) -> str:
    return line.replace("\t", _TAB).translate(_CONTROLS)


def _line_window(source: Source, labels: Sequence[Label]) -> tuple[int, str, str, str]:
    """For the line of ``labels``: the offset of its first shown character, the shown text,
    and the cut marks before and after it."""
    line_start = labels[0].span.start - (source.line_col(labels[0].span.start)[1] - 1)
    end = _line_end(source, line_start)
    if end > line_start and source.text[end - 1] == "\r":
        end -= 1  # a CRLF file
    if end - line_start <= MAX_SHOWN_LINE:
        return line_start, source.text[line_start:end], "", ""
    first = min(lb.span.start for lb in labels)
    lo = max(line_start, first - _WINDOW_LEAD)
    hi = min(end, lo + MAX_SHOWN_LINE)
    return lo, source.text[lo:hi], "..." if lo > line_start else "", "..." if hi < end else ""


def _mask(text: str, shown_from: int, labels: Sequence[Label]) -> str:
    """``text`` with the characters under masked labels replaced by ``*`` (same width, so the
    carets still line up)."""
    for label in labels:
        if label.masked:
            lo = max(0, label.span.start - shown_from)
            hi = min(len(text), label.span.end - shown_from)
            if lo < hi:
                text = text[:lo] + "*" * (hi - lo) + text[hi:]
    return text


def _line_end(source: Source, line_start: int) -> int:
    end = source.text.find("\n", line_start)
    return len(source.text) if end == -1 else end


def render_human(diag: Diagnostic, color: bool = False) -> str:
    """rustc-style text: header, location, source lines with carets, help and notes."""
    bold, red, yellow, blue, reset = (
        ("\x1b[1m", "\x1b[31m", "\x1b[33m", "\x1b[34m", "\x1b[0m") if color else ("",) * 5
    )
    tint = red if diag.is_error else yellow
    out = [f"{bold}{tint}{diag.severity.value}[{diag.code}]{reset}{bold}: {diag.message}{reset}"]
    if not diag.labels:
        out.append(f"  --> {diag.where()}")
        gutter = "  "
    else:
        lines = sorted({label.span.line for label in diag.labels})
        width = len(str(lines[-1]))
        gutter = " " * width
        out.append(f"{gutter}{blue}-->{reset} {diag.where()}")
        out.append(f"{gutter} {blue}|{reset}")
        by_line: dict[int, list[Label]] = {}
        for label in sorted(diag.labels, key=lambda lb: lb.span.start):
            by_line.setdefault(label.span.line, []).append(label)
        for line in lines:
            source = by_line[line][0].span.source
            shown_from, text, lead, tail = _line_window(source, by_line[line])
            text = _mask(text, shown_from, by_line[line])
            out.append(f"{blue}{line:>{width}} |{reset} {lead}{_expand(text)}{tail}".rstrip())
            for label in by_line[line]:
                span = label.span
                col = span.start - shown_from  # 0-based, in the shown text
                end = min(span.end - shown_from, len(text))
                prefix = lead + _expand(text[:col])
                carets = "^" * max(1, len(_expand(text[col:max(end, col + 1)])))
                marker = f"{' ' * len(prefix)}{tint}{carets}{reset}"
                out.append(f"{gutter} {blue}|{reset} {marker} {label.message}".rstrip())
        out.append(f"{gutter} {blue}|{reset}")
    if diag.help:
        out.append(f"{gutter} {blue}={reset} {bold}help{reset}: {diag.help}")
    for note in diag.notes:
        out.append(f"{gutter} {blue}={reset} {bold}note{reset}: {note}")
    return "\n".join(out)


def render_short(diag: Diagnostic) -> str:
    return f"{diag.where()}: {diag.severity.value}[{diag.code}]: {diag.message}"


def to_json(diag: Diagnostic) -> dict[str, object]:
    """LSP-like record: 1-based line/column, exclusive end."""
    record: dict[str, object] = {
        "code": diag.code,
        "severity": diag.severity.value,
        "message": diag.message,
        "help": diag.help,
        "notes": list(diag.notes),
    }
    if diag.span is not None:
        span = diag.span
        end_line, end_col = span.source.line_col(span.end)
        record.update(
            file=span.source.path,
            line=span.line,
            column=span.column,
            end_line=end_line,
            end_column=end_col,
        )
    else:
        record.update(file=diag.location, line=None, column=None, end_line=None, end_column=None)
    record["labels"] = [
        {"line": lb.span.line, "column": lb.span.column, "message": lb.message}
        for lb in diag.labels
    ]
    return record


def render(diagnostics: Sequence[Diagnostic], fmt: str = "human", color: bool = False) -> str:
    if fmt == "json":
        return json.dumps([to_json(d) for d in diagnostics], indent=2, sort_keys=True)
    if fmt == "short":
        return "\n".join(render_short(d) for d in diagnostics)
    return "\n\n".join(render_human(d, color) for d in diagnostics)


class PipelineError(Exception):
    """Raised at the API boundary (builder, ``load``) when a pipeline has errors."""

    def __init__(self, diagnostics: Sequence[Diagnostic]):
        self.diagnostics = list(diagnostics)
        super().__init__("\n\n" + render(self.diagnostics))
