"""Source text and spans: byte offsets into one file, turned into line and column on demand."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

#: The largest ``.pipe`` text any loader accepts, in bytes of UTF-8: ``check``, ``compile``,
#: ``fmt``, ``run``, ``graph``, ``loads`` and the language server refuse a larger one up front,
#: with one P0003 diagnostic and before parsing.  Twice a generated 10,000-stage pipeline, about
#: as many stages as Argo's limits let one pipeline hold (docs/lowering.md); a 10 MB file took
#: ``check`` 2.5 minutes and 1.3 GB to reach the same verdict after the work.
MAX_SOURCE_BYTES = 4 * 1024 * 1024


def utf8_size(text: str) -> int:
    """How many bytes ``text`` is in UTF-8 (a lone surrogate, which JSON can carry, as 3)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class Source:
    """One input file's text, with a line index built once."""

    path: str
    text: str = field(repr=False)
    _line_starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        starts = [0]
        find = self.text.find
        pos = find("\n")
        while pos != -1:
            starts.append(pos + 1)
            pos = find("\n", pos + 1)
        object.__setattr__(self, "_line_starts", tuple(starts))

    def line_col(self, offset: int) -> tuple[int, int]:
        """1-based line and column of a character offset."""
        offset = max(0, min(offset, len(self.text)))
        line = bisect.bisect_right(self._line_starts, offset) - 1
        return line + 1, offset - self._line_starts[line] + 1

    def line_offset(self, line: int) -> int:
        """The offset of the first character of a 1-based line."""
        return self._line_starts[line - 1]

    def line_text(self, line: int) -> str:
        """The text of a 1-based line, without its newline."""
        start = self._line_starts[line - 1]
        end = self._line_starts[line] - 1 if line < len(self._line_starts) else len(self.text)
        return self.text[start:end]

    @property
    def line_count(self) -> int:
        return len(self._line_starts)


@dataclass(frozen=True)
class Span:
    """A half-open range of characters ``[start, end)`` in a source."""

    source: Source
    start: int
    end: int

    @property
    def line(self) -> int:
        return self.source.line_col(self.start)[0]

    @property
    def column(self) -> int:
        return self.source.line_col(self.start)[1]

    def sort_key(self) -> tuple[str, int, int]:
        return (self.source.path, self.start, self.end)

    def __str__(self) -> str:
        line, col = self.source.line_col(self.start)
        return f"{self.source.path}:{line}:{col}"


#: Where each part of the raw pipeline came from, keyed exactly like the model's field paths
#: (``("stages", 2, "resources", "memory")``).  Keys with a trailing ``"<key>"`` hold the span of
#: a map key or attribute name rather than of its value.
SourceMap = dict[tuple[object, ...], Span]

KEY = "<key>"


def lookup(source_map: SourceMap, loc: tuple[object, ...]) -> Span | None:
    """The span of ``loc`` or of its nearest recorded ancestor."""
    for end in range(len(loc), -1, -1):
        span = source_map.get(loc[:end])
        if span is not None:
            return span
    return None
