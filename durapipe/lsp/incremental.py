"""Parse a large file block by block, re-parsing only the top-level blocks an edit changed.

Parsing is most of what the front end costs on a big file, and an edit changes one block.  The
text is cut where a top-level keyword opens a block at brace depth 0 (outside strings,
heredocs and comments), exactly where the parser itself returns to the top level, so each
piece parses as it would in the whole file.  Pieces are parsed on their own (keyed by their
text, so a piece that only moved is not parsed again) and their trees are moved to their
place in the whole file; lowering and validation then run on the whole tree as usual.

The first version of a file is parsed whole (one parse is much cheaper than one per piece) and
its pieces remembered from that tree.  Where a piece hit something whose effect is not local (a heredoc without its end, the limit on
syntax errors, a file past the size limit) the whole file is parsed the ordinary way instead.
``tests/lsp/test_incremental.py`` checks that both ways give identical diagnostics on every
example and case file.
"""

from __future__ import annotations

import bisect
import re
from collections import OrderedDict
from dataclasses import replace

from durapipe.dsl import parser
from durapipe.dsl import syntax as st
from durapipe.dsl.diagnostics import Diagnostic, Label
from durapipe.dsl.source import MAX_SOURCE_BYTES, Source, Span, utf8_size

_SCAN_RE = re.compile(r"""
    "(?:[^"\\\n]|\\.)*"?
  | '[^'\n]*'?
  | \#[^\n]* | //[^\n]*
  | <<-?(?P<tag>[A-Za-z_][A-Za-z0-9_]*)[ \t]*\n(?:.*\n)*?[ \t]*(?P=tag)(?![A-Za-z0-9_])
  | (?P<brace>[{}])
  | ^(?P<top>[ \t]*(?:pipeline|stage|params|defaults))\b(?=[ \t]*["{])
""", re.VERBOSE | re.MULTILINE)

#: Pieces kept parsed, by text: a 2,000-stage file has about that many.
CACHE_SIZE = 20_000


def pieces(text: str) -> list[int]:
    """Offsets where a piece starts (the first is always 0)."""
    starts = [0]
    depth = 0
    for m in _SCAN_RE.finditer(text):
        brace = m.group("brace")
        if brace == "{":
            depth += 1
        elif brace == "}":
            depth = max(0, depth - 1)
        elif m.group("top") is not None and depth == 0 and m.start() > 0:
            starts.append(m.start())
    return starts


class _Shift:
    """Copies of a piece's syntax nodes and diagnostics, moved to ``base`` in ``source``."""

    def __init__(self, source: Source, base: int):
        self.source = source
        self.base = base

    def span(self, span: Span) -> Span:
        return Span(self.source, span.start + self.base, span.end + self.base)

    def value(self, v: st.Value) -> st.Value:
        if isinstance(v, st.StrValue):
            return st.StrValue(self.span(v.span), [
                p if isinstance(p, str) else st.RefValue(self.span(p.span), p.path)
                for p in v.parts], v.heredoc, v.tag)
        if isinstance(v, st.NumberValue):
            return st.NumberValue(self.span(v.span), v.value, v.raw)
        if isinstance(v, st.UnitValue):
            return st.UnitValue(self.span(v.span), v.raw)
        if isinstance(v, st.BoolValue):
            return st.BoolValue(self.span(v.span), v.value)
        if isinstance(v, st.ListValue):
            return st.ListValue(self.span(v.span), [self.value(i) for i in v.items])
        if isinstance(v, st.CallValue):
            return st.CallValue(self.span(v.span), v.name, self.span(v.name_span),
                                [self.value(a) for a in v.args])
        return st.RefValue(self.span(v.span), v.path)

    def member(self, m: st.Attribute | st.Block) -> st.Attribute | st.Block:
        if isinstance(m, st.Attribute):
            return st.Attribute(self.span(m.span), m.key, self.span(m.key_span),
                                self.value(m.value), m.quoted_key)
        label = self.value(m.label) if m.label is not None else None
        assert label is None or isinstance(label, st.StrValue)
        return st.Block(self.span(m.span), m.name, self.span(m.name_span),
                        self.span(m.open_span), label, [self.member(c) for c in m.members],
                        m.quoted_key)

    def item(self, item: st.TopLevel) -> st.TopLevel:
        if isinstance(item, st.ParamsBlock):
            return st.ParamsBlock(self.span(item.span), self.span(item.name_span), [
                st.ParamDecl(self.span(d.span), d.name, self.span(d.name_span), d.type,
                             self.span(d.type_span),
                             self.value(d.default) if d.default is not None else None)
                for d in item.params])
        moved = self.member(item)
        assert isinstance(moved, st.Block)
        return moved

    def diagnostic(self, d: Diagnostic) -> Diagnostic:
        return replace(d, labels=tuple(Label(self.span(lb.span), lb.message)
                                       for lb in d.labels))


#: A parsed piece, the newlines its source had before it (see ``_piece``), its diagnostics.
_Parsed = tuple[st.File, int, list[Diagnostic]]


class PieceParser:
    """Parses files piece by piece, remembering the pieces of earlier versions."""

    def __init__(self, seed_from_whole: bool = True) -> None:
        self.cache: OrderedDict[str, _Parsed] = OrderedDict()
        #: Parse the first version whole and remember its pieces from that tree (tests turn
        #: it off to parse every piece on its own).
        self.seed_from_whole = seed_from_whole

    def _piece(self, text: str, path: str, lines_before: int) -> _Parsed | None:
        hit = self.cache.get(text)
        if hit is not None and (not hit[2] or hit[1] == lines_before):
            self.cache.move_to_end(text)
            return hit
        # The piece is parsed after as many newlines as precede it in the file, so that line
        # numbers inside messages ("add `}` before line 7") are the file's.  A piece with no
        # diagnostics has no such numbers and is reused wherever it moves.
        file, diagnostics = parser.parse(Source(path, "\n" * lines_before + text))
        if file is None or any(d.code == "P0003" or d.code == "P0107" and "heredoc" in d.message
                               for d in diagnostics):
            return None  # the whole file's parse gives up or refuses: let it say so
        parsed = (file, lines_before, diagnostics)
        self.cache[text] = parsed
        while len(self.cache) > CACHE_SIZE:
            self.cache.popitem(last=False)
        return parsed

    def _seed(self, file: st.File, diagnostics: list[Diagnostic], starts: list[int]) -> None:
        """Remember the pieces of a whole-file parse: one parse of the whole file costs far
        less than one per piece, so the first version of a file is parsed whole."""
        text = file.source.text
        bounds = [*starts[1:], len(text)]
        items = iter(file.items)
        comments = iter(file.comments)
        item = next(items, None)
        comment = next(comments, None)
        broken = {bisect.bisect_right(starts, d.span.start) - 1 for d in diagnostics
                  if d.span is not None}
        for k, (start, end) in enumerate(zip(starts, bounds)):
            mine: list[st.TopLevel] = []
            while item is not None and item.span.start < end:
                mine.append(item)
                item = next(items, None)
            notes: list[st.Comment] = []
            while comment is not None and comment.span.start < end:
                notes.append(comment)
                comment = next(comments, None)
            if k in broken or text[start:end] in self.cache:
                continue
            shift = _Shift(Source(file.source.path, text[start:end]), -start)
            piece = st.File(shift.source, [shift.item(i) for i in mine],
                            [st.Comment(shift.span(c.span), c.text) for c in notes])
            self.cache[text[start:end]] = (piece, 0, [])

    def parse(self, text: str, path: str) -> tuple[st.File | None, list[Diagnostic]]:
        """What ``parser.parse`` gives for the whole text, from (mostly cached) pieces."""
        source = Source(path, text)
        if utf8_size(text) > MAX_SOURCE_BYTES:
            return parser.parse(source)
        starts = pieces(text)
        if self.seed_from_whole and not self.cache:
            whole, found = parser.parse(source)
            if whole is not None:
                self._seed(whole, found, starts)
            return whole, found
        items: list[st.TopLevel] = []
        comments: list[st.Comment] = []
        diagnostics: list[Diagnostic] = []
        lines_before = 0
        for start, end in zip(starts, [*starts[1:], len(text)]):
            piece = text[start:end]
            parsed = self._piece(piece, path, lines_before)
            lines_before += piece.count("\n")
            if parsed is None:
                return parser.parse(source)
            file, pad, found = parsed
            shift = _Shift(source, start - pad)
            items.extend(shift.item(i) for i in file.items)
            comments.extend(st.Comment(shift.span(c.span), c.text) for c in file.comments)
            diagnostics.extend(shift.diagnostic(d) for d in found)
        if len(diagnostics) >= parser.MAX_SYNTAX_ERRORS:
            return parser.parse(source)  # the whole file's limit, not each piece's
        return st.File(source, items, comments), diagnostics
