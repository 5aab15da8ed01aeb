"""Completion: what may be written at the cursor, from the text before it.

The text being typed rarely parses, so the context (which block, key or value position, which
attribute) comes from a small lexical scan back to the start of the enclosing top-level block,
not from the syntax tree.  The scan does not touch the parser, so completion never waits for
an analysis, and it reads only the current block: a 2,000-stage file costs what one stage does.
Names that are defined elsewhere in the file (stages, params, outputs) come from the last
finished :class:`~durapipe.lsp.analysis.Analysis`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from durapipe.dsl import catalog
from durapipe.lsp import vocabulary as vocab
from durapipe.lsp.analysis import Analysis

_TOP_RE = re.compile(r'[ \t]*(pipeline|stage|params|defaults)\b(?=[ \t]*["{])')
_TOKEN_RE = re.compile(r"""
    (?P<heredoc><<-?(?P<tag>[A-Za-z_][A-Za-z0-9_]*)[ \t]*\n(?:.*\n)*?[ \t]*(?P=tag)(?![A-Za-z0-9_]))
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<open>"(?:[^"\\\n]|\\.)*)
  | (?P<sq>'[^'\n]*')
  | (?P<comment>\#[^\n]*|//[^\n]*)
  | (?P<word>[A-Za-z0-9_.][A-Za-z0-9_.\-]*)
  | (?P<punct>[{}\[\]()=:,])
  | (?P<space>\s+)
  | (?P<other>.)
""", re.VERBOSE)
_PARTIAL_RE = re.compile(r"[A-Za-z0-9_.\-]*\Z")


@dataclass
class CursorContext:
    kind: Literal["top", "key", "value", "param_type", "none"]
    #: The enclosing blocks from the top level: ``("stage", "resources", "gpu")``.
    path: tuple[str, ...] = ()
    #: In a value: the attribute it belongs to.
    attribute: str = ""
    #: The word being typed, up to the cursor.
    prefix: str = ""
    #: Inside a string literal (and after ``${`` in it, for references).
    in_string: bool = False
    in_interpolation: bool = False
    #: Names already set in the innermost block (not offered again).
    present: set[str] = field(default_factory=set)
    #: The stage being written, if any (it does not need itself).
    stage: str = ""


def _block_start(text: str, offset: int) -> int:
    """The start of the line that opens the top-level block around ``offset``."""
    end = offset
    while True:
        start = text.rfind("\n", 0, end) + 1
        if _TOP_RE.match(text, start):
            return start
        if start == 0:
            return 0
        end = start - 1


def context_at(text: str, offset: int) -> CursorContext:
    start = _block_start(text, offset)
    line_start = text.rfind("\n", 0, offset) + 1
    # A string open at the cursor: complete inside it (GPU types, `${...}` references).
    in_string = False
    in_interp = False
    prefix = _PARTIAL_RE.search(text, line_start, offset)
    word = prefix.group() if prefix else ""
    scan_end = offset - len(word)
    stack: list[str] = []
    present: list[set[str]] = [set()]
    state = "key"  # key | after_key | value | label | param_name | param_colon | param_value
    key = ""
    attribute = ""
    depth = 0
    pending_top = ""
    stage = ""
    for m in _TOKEN_RE.finditer(text, start, scan_end):
        kind = m.lastgroup
        tok = m.group()
        if kind in ("space", "comment"):
            continue
        if kind == "open":
            if m.end() >= scan_end:
                in_string = True
                inner = text[m.start() + 1:offset]
                open_interp = inner.rfind("${")
                in_interp = open_interp != -1 and "}" not in inner[open_interp:]
                word = inner[open_interp + 2:] if in_interp else inner
                break
            kind = "string"  # an unterminated string earlier on: read it as a value
        if not stack:  # top level: `keyword "label" {`
            if kind == "word" and tok in vocab.top_level_keywords():
                pending_top, stage = tok, ""
            elif kind == "string" and pending_top == "stage":
                stage = tok[1:-1]
            elif tok == "{" and pending_top:
                stack.append(pending_top)
                present.append(set())
                state = "param_name" if pending_top == "params" else "key"
                pending_top = ""
            continue
        if stack[-1] == "params":  # `name: type = default`, repeated
            if tok == "}":
                stack.pop()
                present.pop()
                state = "key"
            elif state == "param_name" and kind == "word":
                state = "param_colon"
            elif state == "param_colon" and tok == ":":
                state = "param_type"
            elif state == "param_type" and kind == "word":
                state = "param_after"
            elif state == "param_after":
                state = "param_value" if tok == "=" else "param_colon"
            elif state == "param_value":
                state = "param_name"
            continue
        if state == "value":
            if tok in ("[", "("):
                depth += 1
                continue
            if tok in ("]", ")"):
                depth = max(0, depth - 1)
                if depth == 0:
                    state = "key"
                continue
            if tok == "," and depth > 0:
                continue
            if depth > 0:
                continue
            if tok == "}":
                stack.pop()
                present.pop()
                state = "key"
                continue
            # One value token ends the value; a `(` may follow (a call).
            state = "after_value"
            continue
        if state == "after_value":
            if tok == "(":
                state, depth = "value", 1
                continue
            state = "key"
        if tok == "}":
            if len(stack) > 0:
                stack.pop()
                present.pop()
            state = "key"
            continue
        if state == "key" and kind in ("word", "string"):
            key = tok.strip('"')
            present[-1].add(key)
            state = "after_key"
            continue
        if state == "after_key":
            if tok == "=" or tok == ":":  # `:` is the P0101 mistake; complete as if `=`
                state, attribute, depth = "value", key, 0
                continue
            if tok == "{":
                stack.append(key)
                present.append(set())
                state = "key"
                continue
            state = "key"
    if not stack:
        if in_string:
            return CursorContext("none")
        return CursorContext("top" if state == "key" else "none", prefix=word)
    if stack[-1] == "params":
        if state == "param_type":
            return CursorContext("param_type", ("params",), prefix=word)
        if state == "param_value":
            return CursorContext("value", ("params",), prefix=word, in_string=in_string,
                           in_interpolation=in_interp)
        return CursorContext("none", ("params",))
    path = tuple(stack)
    if state == "value":
        return CursorContext("value", path, attribute, word, in_string, in_interp, stage=stage)
    if in_string:
        return CursorContext("none", path)
    if state in ("key", "after_value"):
        return CursorContext("key", path, prefix=word, present=present[-1])
    return CursorContext("none", path)


@dataclass(frozen=True)
class Item:
    label: str
    kind: Literal["keyword", "block", "attribute", "value", "gpu", "stage", "param", "output",
                  "type"]
    detail: str = ""
    documentation: str = ""
    #: Text to insert when it differs from the label (a block's `name { }`).
    insert: str | None = None


def complete(text: str, offset: int, analysis: Analysis | None) -> list[Item]:
    ctx = context_at(text, offset)
    if ctx.kind == "top":
        return [Item(k, "keyword", f"`{k}` block", vocab.blocks()[k].doc)
                for k in vocab.top_level_keywords()]
    if ctx.kind == "param_type":
        return [Item(t, "type") for t in vocab.param_types()]
    if ctx.kind == "key":
        entry = vocab.lookup(ctx.path)
        if entry is None or entry.kind != "block":
            return []
        items = []
        for name, child in entry.children.items():
            if name in ctx.present:
                continue
            if child.kind == "attribute":
                items.append(Item(name, "attribute", child.type_text, child.doc))
            else:
                items.append(Item(name, "block", child.kind, child.doc, insert=f"{name} {{ }}"))
        return items
    if ctx.kind == "value":
        return _values(ctx, analysis)
    return []


def _values(ctx: CursorContext, analysis: Analysis | None) -> list[Item]:
    entry = vocab.lookup((*ctx.path, ctx.attribute)) if ctx.attribute else None
    quote = "" if ctx.in_string else '"'
    if ctx.in_string and not ctx.in_interpolation:
        if ctx.path[-1:] == ("gpu",) and ctx.attribute == "types":
            return _gpu_types(analysis, "")
        if entry is not None and entry.choices:
            return [Item(c, "value", entry.type_text) for c in entry.choices]
        return []
    if not ctx.in_string and entry is not None:
        if entry.boolean:
            return [Item(k, "keyword") for k in ("true", "false")]
        if entry.choices:
            return [Item(f'"{c}"', "value", entry.type_text) for c in entry.choices]
        if ctx.path[-1:] == ("gpu",) and ctx.attribute == "types":
            return _gpu_types(analysis, quote)
        if ctx.attribute == "needs":
            downstream = _downstream(analysis, ctx.stage)
            return [Item(s, "stage") for s in (analysis.stage_names() if analysis else [])
                    if s != ctx.stage and s not in downstream]
    return _references(ctx.prefix, analysis)


def _downstream(analysis: Analysis | None, stage: str | None) -> set[str]:
    """The stages that depend on ``stage``, directly or not: naming one in its ``needs``
    would make a cycle (P0302).  Empty where the file does not build a model."""
    if analysis is None or analysis.pipeline is None or stage is None:
        return set()
    dependents: dict[str, set[str]] = {}
    for other in analysis.pipeline.stages:
        for upstream in other.upstream():
            dependents.setdefault(upstream, set()).add(other.name)
    found: set[str] = set()
    todo = [stage]
    while todo:
        for nxt in dependents.get(todo.pop(), set()):
            if nxt not in found:
                found.add(nxt)
                todo.append(nxt)
    return found


def _gpu_types(analysis: Analysis | None, quote: str) -> list[Item]:
    profile = "generic"
    extra: dict[str, str] = {}
    if analysis is not None and analysis.pipeline is not None:
        profile = analysis.pipeline.cluster.profile
        extra = analysis.pipeline.cluster.gpu_products
    labels = catalog.PROFILES[profile].gpu_products
    return [Item(f"{quote}{t}{quote}", "gpu", f"{profile}: {labels.get(t, extra.get(t, ''))}")
            for t in catalog.known_gpu_types(profile, extra)]


def _references(prefix: str, analysis: Analysis | None) -> list[Item]:
    if analysis is None:
        return []
    head, dot, _ = prefix.rpartition(".")
    if not dot:
        items = [Item("params", "keyword", "params.NAME: a pipeline parameter")]
        items += [Item(s, "stage", "stage") for s in analysis.stage_names()]
        return items
    parts = head.split(".")
    if parts == ["params"]:
        return [Item(p, "param", "param") for p in analysis.param_names()]
    if len(parts) == 1 and parts[0] in analysis.stage_names():
        return [Item("outputs", "keyword", f"outputs of stage `{parts[0]}`")]
    if len(parts) == 2 and parts[1] == "outputs":
        return [Item(o, "output", f"output of `{parts[0]}`")
                for o in analysis.output_names(parts[0])]
    return []
