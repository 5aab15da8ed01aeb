"""One analysed ``.pipe`` document: diagnostics, symbols, and what is under a position.

Everything here works on character offsets and the front end's own objects; the server
translates to and from LSP positions.  :func:`analyse` runs the parser (not thread-safe until
the parser is re-entrant), so the server calls it from its single analysis thread only; the
queries on a finished :class:`Analysis` read immutable data and may run anywhere.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from durapipe.dsl import codes, units
from durapipe.dsl import diagnostics as dg
from durapipe.dsl import syntax as st
from durapipe.dsl.load import LoadResult, from_syntax, gc_paused, loads
from durapipe.dsl.model import Pipeline
from durapipe.dsl.source import Source, Span
from durapipe.lsp import vocabulary as vocab
from durapipe.lsp.incremental import PieceParser

SymbolKind = Literal["stage", "param", "output"]
#: ``("stage", "prep")``, ``("param", "lr")``, ``("output", "prep", "data")``.
SymbolId = tuple[str, ...]

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


@dataclass(frozen=True)
class Occurrence:
    """A name in the text: a definition or a reference to one."""

    symbol: SymbolId
    start: int
    end: int
    definition: bool = False


@dataclass
class Analysis:
    text: str
    source: Source
    result: LoadResult
    #: The last pipeline that loaded without errors (this one's, or an earlier version's):
    #: hover keeps showing budgets while the user is half-way through an edit.
    pipeline: Pipeline | None
    occurrences: list[Occurrence] = field(default_factory=list)
    definitions: dict[SymbolId, Occurrence] = field(default_factory=dict)
    _starts: list[int] = field(default_factory=list)

    @property
    def diagnostics(self) -> list[dg.Diagnostic]:
        return self.result.diagnostics

    @property
    def syntax(self) -> st.File | None:
        return self.result.syntax

    def stage_names(self) -> list[str]:
        return [s[1] for s in self.definitions if s[0] == "stage"]

    def param_names(self) -> list[str]:
        return [s[1] for s in self.definitions if s[0] == "param"]

    def output_names(self, stage: str) -> list[str]:
        return [s[2] for s in self.definitions if s[0] == "output" and s[1] == stage]

    def occurrence_at(self, offset: int) -> Occurrence | None:
        """The name that ``offset`` is in or just after (an editor's cursor ends a word)."""
        i = bisect.bisect_right(self._starts, offset) - 1
        while i >= 0:
            occ = self.occurrences[i]
            if occ.start <= offset <= occ.end:
                return occ
            if occ.end < offset - 200:  # names are short; stop scanning far back
                return None
            i -= 1
        return None

    def references(self, symbol: SymbolId, include_definition: bool) -> list[Occurrence]:
        return [o for o in self.occurrences
                if o.symbol == symbol and (include_definition or not o.definition)]


#: Files larger than this are parsed piece by piece (``incremental``), re-parsing only the
#: top-level blocks that changed; smaller ones (the examples, up to about 40 stages) parse
#: whole in well under the 150 ms budget.  At 50,000 characters a 200-stage file (40 kB) was
#: parsed whole on every edit: 255 ms after an edit, against 105 ms piece by piece
#: (``benchmarks/lsp_bench.py``, docs/performance.md).
PIECEWISE_CHARS = 8_000


def analyse(text: str, path: str, previous: Analysis | None = None,
            pieces: PieceParser | None = None) -> Analysis:
    """Run the front end on ``text`` and index its names.  Call from one thread at a time."""
    if pieces is not None and len(text) > PIECEWISE_CHARS:
        with gc_paused():
            result = from_syntax(*pieces.parse(text, path))
    else:
        result = loads(text, path)
    source = result.syntax.source if result.syntax is not None else Source(path, text)
    pipeline = result.pipeline if result.ok else (previous.pipeline if previous else None)
    analysis = Analysis(text, source, result, pipeline)
    if result.syntax is not None:
        _index(analysis, result.syntax)
    return analysis


# -- the index of names -----------------------------------------------------------------------


def _index(analysis: Analysis, file: st.File) -> None:
    found: list[Occurrence] = []
    for item in file.items:
        if isinstance(item, st.ParamsBlock):
            for decl in item.params:
                found.append(Occurrence(("param", decl.name), decl.name_span.start,
                                        decl.name_span.end, definition=True))
                if decl.default is not None:
                    found.extend(_value_refs(decl.default, analysis.text))
            continue
        stage = None
        if item.name == "stage" and item.label is not None:
            stage = item.label.text
            label = item.label.span
            found.append(Occurrence(("stage", stage), label.start + 1,
                                    max(label.start + 1, label.end - 1), definition=True))
        for member in _walk(item):
            if isinstance(member, st.Attribute):
                found.extend(_value_refs(member.value, analysis.text))
            elif stage is not None and member.name == "outputs":
                for entry in member.members:
                    if isinstance(entry, st.Attribute):
                        found.append(Occurrence(("output", stage, entry.key),
                                                entry.key_span.start, entry.key_span.end,
                                                definition=True))
    found.sort(key=lambda o: o.start)
    analysis.occurrences = found
    analysis._starts = [o.start for o in found]
    for occ in found:
        if occ.definition:
            analysis.definitions.setdefault(occ.symbol, occ)


def _walk(block: st.Block) -> Iterator[st.Attribute | st.Block]:
    for member in block.members:
        yield member
        if isinstance(member, st.Block):
            yield from _walk(member)


def _refs_in(value: st.Value) -> Iterator[st.RefValue]:
    if isinstance(value, st.RefValue):
        yield value
    elif isinstance(value, st.StrValue):
        yield from (p for p in value.parts if isinstance(p, st.RefValue))
    elif isinstance(value, st.ListValue):
        for item in value.items:
            yield from _refs_in(item)
    elif isinstance(value, st.CallValue):
        for arg in value.args:
            yield from _refs_in(arg)


def ref_segments(ref: st.RefValue, text: str) -> list[tuple[str, int, int]]:
    """Each name of a dotted reference with its offsets (``${...}`` and spaces skipped)."""
    return [(m.group(), m.start(), m.end())
            for m in _NAME_RE.finditer(text, ref.span.start, ref.span.end)][:len(ref.path)]


def _value_refs(value: st.Value, text: str) -> Iterator[Occurrence]:
    for ref in _refs_in(value):
        segments = ref_segments(ref, text)
        if len(segments) != len(ref.path):
            continue
        if ref.path[0] == "params":
            if len(ref.path) == 2:
                yield Occurrence(("param", ref.path[1]), segments[1][1], segments[1][2])
            continue
        yield Occurrence(("stage", ref.path[0]), segments[0][1], segments[0][2])
        if len(ref.path) == 3 and ref.path[1] == "outputs":
            yield Occurrence(("output", ref.path[0], ref.path[2]), segments[2][1],
                             segments[2][2])


# -- what is at an offset ---------------------------------------------------------------------


@dataclass(frozen=True)
class Hit:
    """The innermost thing at an offset: a member's name, or a value of an attribute."""

    kind: Literal["key", "value", "label", "param"]
    #: Vocabulary path: ``("stage", "retry")`` for a key, the attribute's path for a value.
    path: tuple[str, ...]
    span: Span
    #: The top-level block (a stage's label gives its name) and the value node, if any.
    top: st.TopLevel
    node: st.Value | st.ParamDecl | None = None


def hit_at(analysis: Analysis, offset: int) -> Hit | None:
    file = analysis.syntax
    if file is None:
        return None
    starts = [item.span.start for item in file.items]
    i = bisect.bisect_right(starts, offset) - 1
    if i < 0:
        return None
    item = file.items[i]
    if not item.span.start <= offset <= item.span.end:
        return None
    if isinstance(item, st.ParamsBlock):
        for decl in item.params:
            if decl.span.start <= offset <= decl.span.end:
                return Hit("param", ("params", decl.name), decl.span, item, decl)
        return None
    if item.label is not None and item.label.span.start <= offset <= item.label.span.end:
        return Hit("label", (item.name,), item.label.span, item, item.label)
    if item.name_span.start <= offset <= item.name_span.end:
        return Hit("key", (item.name,), item.name_span, item)
    return _hit_in(item, (item.name,), offset, item)


def _hit_in(block: st.Block, path: tuple[str, ...], offset: int,
            top: st.TopLevel) -> Hit | None:
    for member in block.members:
        if not member.span.start <= offset <= member.span.end:
            continue
        if isinstance(member, st.Attribute):
            here = (*path, member.key)
            if member.key_span.start <= offset <= member.key_span.end:
                return Hit("key", here, member.key_span, top)
            return Hit("value", here, member.value.span, top, _value_at(member.value, offset))
        here = (*path, member.name)
        if member.name_span.start <= offset <= member.name_span.end:
            return Hit("key", here, member.name_span, top)
        return _hit_in(member, here, offset, top)
    return None


def _value_at(value: st.Value, offset: int) -> st.Value:
    if isinstance(value, st.ListValue):
        for item in value.items:
            if item.span.start <= offset <= item.span.end:
                return _value_at(item, offset)
    return value


# -- hover ------------------------------------------------------------------------------------


def _entry_markdown(entry: vocab.Entry) -> str:
    head = f"**`{entry.dotted}`**"
    if entry.kind == "block":
        head += " block" + (" (or `= true`)" if entry.flag else "")
    elif entry.kind == "map":
        head += ": `key = value` pairs"
    elif entry.type_text:
        head += f": {entry.type_text}"
    if entry.default is not None:
        head += f" (default `{entry.default}`)"
    parts = [head]
    if entry.doc:
        parts.append(entry.doc.replace("``", "`"))
    if entry.kind == "block" and entry.children:
        parts.append("Holds: " + ", ".join(f"`{n}`" for n in entry.children))
    return "\n\n".join(parts)


def canonical(raw: str, unit: vocab.Unit | None) -> str | None:
    """A unit literal's canonical value for the attribute's unit (all readings without one)."""
    readings = []
    for kind in ((unit,) if unit else ("bytes", "seconds")):
        try:
            if kind == "bytes":
                value = units.parse_bytes(raw)
                readings.append(f"`{raw}` = {value:,} bytes ({units.format_bytes(value)})")
            elif kind == "seconds":
                value = units.parse_seconds(raw)
                readings.append(f"`{raw}` = {value:,} seconds ({units.format_seconds(value)})")
            elif kind == "millicpu":
                value = units.parse_millicpu(raw)
                readings.append(f"`{raw}` = {value:,} millicores "
                                f"({units.format_millicpu(value)} CPU)")
        except ValueError as exc:
            if unit:
                return f"`{raw}`: {exc}"
    return "\n\n".join(readings) or None


def _describe_symbol(analysis: Analysis, symbol: SymbolId) -> str:
    definition = analysis.definitions.get(symbol)
    if definition is None:
        kind = {"stage": "stage", "param": "param", "output": "output"}[symbol[0]]
        return f"unknown {kind} `{symbol[-1]}`"
    line = analysis.source.line_col(definition.start)[0]
    if symbol[0] == "stage":
        text = f"stage `{symbol[1]}`, defined on line {line}"
        if analysis.pipeline is not None:
            try:
                stage = analysis.pipeline.stage(symbol[1])
            except KeyError:
                return text
            from durapipe.diagram import summary

            facts = [f"image `{stage.image}`"]
            if stage.outputs:
                facts.append("outputs " + ", ".join(f"`{o}`" for o in stage.outputs))
            memory, gpus = summary.memory_text(stage), summary.gpu_text(stage)
            facts += [f"memory {memory}"] if memory else []
            facts += [f"GPUs {gpus}"] if gpus else []
            facts.append(summary.cache_text(stage))
            text += "\n\n" + "; ".join(facts)
            from durapipe.plan import bound_render
            from durapipe.plan.bound import Prices, stage_bound

            brief = bound_render.in_brief(stage_bound(stage, Prices.of(analysis.pipeline)))
            text += f"\n\n{brief} (`durapipe bound` shows how)"
        return text
    if symbol[0] == "output":
        text = f"output `{symbol[2]}` of stage `{symbol[1]}`, declared on line {line}"
        stage_ = analysis.pipeline.stage_names.get(symbol[1]) if analysis.pipeline else None
        written = stage_.outputs.get(symbol[2]) if stage_ is not None else None
        if written is not None:
            text += (f"\n\nwritten by the stage at `{written}`; its content hash is part of "
                     "the cache key of every stage that reads it")
        return text
    decl_text = analysis.source.line_text(line).strip()
    return f"param `{symbol[1]}`, declared on line {line}: `{decl_text}`"


def _whole_reference(hit: Hit | None) -> SymbolId | None:
    """The output or param a reference value at ``hit`` names (``prep.outputs.data``,
    ``params.lr``)."""
    if hit is None or hit.kind != "value" or not isinstance(hit.node, st.RefValue):
        return None
    path = hit.node.path
    if len(path) == 2 and path[0] == "params":
        return ("param", path[1])
    if len(path) == 3 and path[1] == "outputs":
        return ("output", path[0], path[2])
    return None


def hover(analysis: Analysis, offset: int) -> tuple[str, Span | None] | None:
    """Markdown for what is at ``offset`` and the span it describes."""
    parts: list[str] = []
    span: Span | None = None
    occ = analysis.occurrence_at(offset)
    hit = hit_at(analysis, offset)
    whole = _whole_reference(hit)
    if occ is not None and not occ.definition:
        parts.append(_describe_symbol(analysis, occ.symbol))
        span = Span(analysis.source, occ.start, occ.end)
    elif whole is not None and hit is not None:
        # The `outputs` or `params` word of a reference: what the whole reference names.
        parts.append(_describe_symbol(analysis, whole))
        span = hit.node.span if isinstance(hit.node, st.RefValue) else hit.span
    elif hit is not None:
        span = hit.span
        if hit.kind == "key":
            entry = vocab.lookup(hit.path)
            if entry is not None:
                parts.append(_entry_markdown(entry))
            if hit.path[-1] == "retry" and isinstance(hit.top, st.Block):
                parts.extend(_retry_budgets(analysis, hit.top))
        elif hit.kind == "label" and isinstance(hit.top, st.Block) and hit.top.label:
            if hit.top.name == "stage":
                parts.append(_describe_symbol(analysis, ("stage", hit.top.label.text)))
        elif hit.kind == "param" and isinstance(hit.node, st.ParamDecl):
            parts.append(_describe_symbol(analysis, ("param", hit.node.name)))
        elif hit.kind == "value" and isinstance(hit.node, (st.UnitValue, st.NumberValue)):
            entry = vocab.lookup(hit.path)
            if entry is not None and (entry.unit or isinstance(hit.node, st.UnitValue)):
                text = canonical(hit.node.raw, entry.unit)
                if text:
                    parts.append(text)
                    span = hit.node.span
    for diag in analysis.diagnostics:
        d_span = diag.span
        if d_span is not None and d_span.start <= offset <= max(d_span.end, d_span.start + 1):
            parts.append(explain(diag.code))
            span = span or d_span
    if not parts:
        return None
    return "\n\n---\n\n".join(parts), span


def explain(code: str) -> str:
    """``durapipe explain CODE`` as Markdown."""
    entry = codes.CODES[code]
    return f"**{entry.code}**: {entry.title}\n\n{entry.explanation.strip()}"


def _retry_budgets(analysis: Analysis, top: st.Block) -> list[str]:
    from durapipe.diagram import summary

    if top.name != "stage" or top.label is None:
        return []
    if analysis.pipeline is None:
        return ["*Budgets are shown once the file has no errors.*"]
    try:
        stage = analysis.pipeline.stage(top.label.text)
    except KeyError:
        return ["*Budgets are shown once the file has no errors.*"]
    lines = summary.budget_lines(stage)
    return [f"**Compiles to** (stage `{stage.name}`):\n\n" + "\n".join(f"- {ln}" for ln in lines)]


# -- document symbols -------------------------------------------------------------------------


@dataclass
class Symbol:
    name: str
    detail: str
    kind: Literal["pipeline", "stage", "params", "param", "defaults", "block", "attribute"]
    span: Span
    selection: Span
    children: list[Symbol] = field(default_factory=list)


def symbols(analysis: Analysis) -> list[Symbol]:
    file = analysis.syntax
    if file is None:
        return []
    out: list[Symbol] = []
    for item in file.items:
        if isinstance(item, st.ParamsBlock):
            out.append(Symbol("params", "", "params", item.span, item.name_span, [
                Symbol(d.name, d.type, "param", d.span, d.name_span) for d in item.params]))
            continue
        name = item.label.text if item.label else item.name
        kind: Literal["pipeline", "stage", "defaults"] = (
            "pipeline" if item.name == "pipeline" else
            "stage" if item.name == "stage" else "defaults")
        selection = item.label.span if item.label else item.name_span
        out.append(Symbol(name or item.name, item.name, kind, item.span, selection,
                          _member_symbols(item)))
    return out


def _member_symbols(block: st.Block) -> list[Symbol]:
    out = []
    for member in block.members:
        if isinstance(member, st.Block):
            out.append(Symbol(member.name, "", "block", member.span, member.name_span,
                              _member_symbols(member)))
        else:
            out.append(Symbol(member.key, "", "attribute", member.span, member.key_span))
    return out
