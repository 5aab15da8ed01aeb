"""Building syntax nodes (``durapipe.dsl.syntax``) from lark's parse tree."""

from __future__ import annotations

import math
import re
import sys

import lark

from durapipe.dsl import syntax as st
from durapipe.dsl.diagnostics import error
from durapipe.dsl.parse_recovery import ParseState, span_of
from durapipe.dsl.source import Span

_ESCAPES = {"\\": "\\", '"': '"', "n": "\n", "t": "\t", "r": "\r"}
_SPECIAL_RE = re.compile(r"[\\$]")
_REF_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*")


class TreeBuilder:
    def __init__(self, state: ParseState):
        self.state = state
        self.source = state.source

    def span(self, start: int, end: int) -> Span:
        return Span(self.source, start, end)

    def tok_span(self, token: lark.Token) -> Span:
        return span_of(token, self.source)

    def file(self, tree: lark.Tree[lark.Token]) -> st.File:
        items: list[st.TopLevel] = []
        for child in tree.children:
            if not isinstance(child, lark.Tree):
                continue
            if child.data == "params":
                items.append(self.params(child))
            else:
                items.append(self.top_block(child))
        return st.File(self.source, items, sorted(self.state.comments, key=lambda c: c.span.start))

    def _extent(self, node: lark.Tree[lark.Token] | lark.Token) -> tuple[int, int]:
        """The characters a node covers; tokens invented by error repair have no position."""
        if isinstance(node, lark.Token):
            if node.start_pos is None:
                return -1, -1
            return node.start_pos, node.end_pos if node.end_pos is not None else node.start_pos
        starts, ends = [], []
        for child in node.children:
            if isinstance(child, (lark.Tree, lark.Token)):
                s, e = self._extent(child)
                if s >= 0:
                    starts.append(s)
                    ends.append(e)
        if not starts:
            return -1, -1
        return min(starts), max(ends)

    def top_block(self, tree: lark.Tree[lark.Token]) -> st.Block:
        keyword = tree.children[0]
        assert isinstance(keyword, lark.Token)
        label = None
        rest = tree.children[1:]
        if rest and isinstance(rest[0], lark.Tree) and rest[0].data == "label":
            label_value = self.value(rest[0].children[0])
            if isinstance(label_value, st.StrValue):
                label = label_value
            rest = rest[1:]
        body = rest[0]
        assert isinstance(body, lark.Tree)
        block = self.body(str(keyword), self.tok_span(keyword), body, quoted=False)
        block.label = label
        block.span = self.span(keyword.start_pos or 0, block.span.end)
        return block

    def body(self, name: str, name_span: Span, body: lark.Tree[lark.Token],
             quoted: bool) -> st.Block:
        tokens = [c for c in body.children if isinstance(c, lark.Token)]
        open_tok = tokens[0]
        close = tokens[-1] if len(tokens) > 1 else None
        end = (close.end_pos if close is not None and close.end_pos is not None
               else self._extent(body)[1])
        end = max(end, name_span.end)
        block = st.Block(self.span(name_span.start, end), name, name_span,
                         self.tok_span(open_tok), quoted_key=quoted)
        for member in body.children:
            if isinstance(member, lark.Tree):
                block.members.append(self.member(member))
        return block

    def key(self, tree: lark.Tree[lark.Token]) -> tuple[str, Span, bool]:
        token = tree.children[0]
        assert isinstance(token, lark.Token)
        if token.type == "STRING":
            parts = self.string_parts(token)
            return "".join(p for p in parts if isinstance(p, str)), self.tok_span(token), True
        return str(token), self.tok_span(token), False

    def member(self, tree: lark.Tree[lark.Token]) -> st.Attribute | st.Block:
        key_tree = tree.children[0]
        assert isinstance(key_tree, lark.Tree)
        name, name_span, quoted = self.key(key_tree)
        if tree.data == "block":
            body = tree.children[1]
            assert isinstance(body, lark.Tree)
            return self.body(name, name_span, body, quoted)
        value = self.value(tree.children[2])
        return st.Attribute(self.span(name_span.start, value.span.end), name, name_span, value,
                            quoted)

    def params(self, tree: lark.Tree[lark.Token]) -> st.ParamsBlock:
        keyword = tree.children[0]
        assert isinstance(keyword, lark.Token)
        decls = []
        for child in tree.children:
            if isinstance(child, lark.Tree) and child.data == "param":
                name, _colon, type_tok, *rest = child.children
                assert isinstance(name, lark.Token) and isinstance(type_tok, lark.Token)
                default = self.value(rest[1]) if len(rest) == 2 else None
                end = default.span.end if default else (type_tok.end_pos or 0)
                decls.append(st.ParamDecl(self.span(name.start_pos or 0, end), str(name),
                                          self.tok_span(name), str(type_tok),
                                          self.tok_span(type_tok), default))
        start, end = self._extent(tree)
        return st.ParamsBlock(self.span(max(start, 0), max(end, 0)), self.tok_span(keyword), decls)

    def value(self, node: lark.Tree[lark.Token] | lark.Token) -> st.Value:
        if isinstance(node, lark.Token):  # pragma: no cover - every value is a tree
            raise TypeError(node)
        kind = node.data
        children = node.children
        start, end = self._extent(node)
        span = self.span(max(start, 0), max(end, 0))
        first = children[0] if children else None
        if kind == "string":
            assert isinstance(first, lark.Token)
            return st.StrValue(span, self.string_parts(first))
        if kind == "sq_string":
            assert isinstance(first, lark.Token)
            self.state.diagnostics.append(error(
                "P0105", "strings use double quotes", span, "single-quoted",
                help=f'write "{str(first)[1:-1]}"'))
            return st.StrValue(span, [str(first)[1:-1]])
        if kind == "open_string":  # reported by the post-lexer (RecoveringPostLexer.open_string)
            assert isinstance(first, lark.Token)
            return st.StrValue(span, [str(first)[1:]])
        if kind == "heredoc":
            assert isinstance(first, lark.Token)
            return self.heredoc(first, span)
        if kind == "number":
            raw = str(first)
            number: int | float = float(raw) if any(c in raw for c in ".eE") else int(raw)
            # An int beyond a float's range (309+ digits) cannot reach math.isinf.
            if (math.isinf(number) if isinstance(number, float)
                    else abs(number) > sys.float_info.max):
                self.state.diagnostics.append(error(
                    "P0111", f"the number `{raw}` is too large", span, "reads as infinity",
                    help="write the value you mean; sizes and durations take units (1Ti, 7d)"))
                number = 0
            return st.NumberValue(span, number, raw)
        if kind == "unit":
            return st.UnitValue(span, str(first))
        if kind in ("true", "false"):
            return st.BoolValue(span, kind == "true")
        if kind == "list":
            items = [self.value(c) for c in children if isinstance(c, lark.Tree)]
            return st.ListValue(span, items)
        if kind == "call":
            assert isinstance(first, lark.Token)
            args = [self.value(c) for c in children if isinstance(c, lark.Tree)]
            return st.CallValue(span, str(first), self.tok_span(first), args)
        if kind == "ref":
            path = tuple(str(c) for c in children
                         if isinstance(c, lark.Token) and c.type == "NAME")
            return st.RefValue(span, path)
        raise TypeError(f"unknown value node {kind}")  # pragma: no cover - grammar is closed

    def heredoc(self, token: lark.Token, span: Span) -> st.StrValue:
        text = str(token)
        header, _, rest = text.partition("\n")
        indented = header.startswith("<<-")
        tag = header[3:].strip() if indented else header[2:].strip()
        lines = rest.split("\n")[:-1]  # the last line holds the closing tag
        if indented:
            widths = [len(ln) - len(ln.lstrip(" \t")) for ln in lines if ln.strip()]
            cut = min(widths, default=0)
            lines = [ln[cut:] for ln in lines]
        body = "".join(ln + "\n" for ln in lines)
        return st.StrValue(span, [body], heredoc=True, tag=("-" if indented else "") + tag)

    def string_parts(self, token: lark.Token) -> list[str | st.RefValue]:
        """Decode escapes and split ``${ref}`` interpolations of a double-quoted string."""
        raw = str(token)
        base = (token.start_pos or 0) + 1
        inner = raw[1:-1]
        parts: list[str | st.RefValue] = []
        buf: list[str] = []
        i = 0
        while i < len(inner):
            ch = inner[i]
            if ch == "\\":
                nxt = inner[i + 1] if i + 1 < len(inner) else ""
                if nxt in _ESCAPES:
                    buf.append(_ESCAPES[nxt])
                    i += 2
                    continue
                if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", inner[i + 2:i + 6]):
                    buf.append(chr(int(inner[i + 2:i + 6], 16)))
                    i += 6
                    continue
                self.state.diagnostics.append(error(
                    "P0110", f"invalid escape sequence `\\{nxt}`",
                    self.span(base + i, base + i + 2), "not a known escape",
                    help="write `\\\\` for a backslash"))
                buf.append(nxt)
                i += 2
                continue
            if inner.startswith("$${", i):
                buf.append("${")
                i += 3
                continue
            if inner.startswith("${", i):
                close = inner.find("}", i + 2)
                body = inner[i + 2:close] if close != -1 else ""
                span = self.span(base + i, base + (close + 1 if close != -1 else len(inner)))
                if close == -1 or not _REF_RE.fullmatch(body.strip()):
                    self.state.diagnostics.append(error(
                        "P0108", "`${...}` must hold one reference such as `params.lr`",
                        span, "invalid interpolation",
                        help="write `$${` for a literal `${`"))
                    buf.append(inner[i:close + 1] if close != -1 else inner[i:])
                    i = close + 1 if close != -1 else len(inner)
                    continue
                if buf:
                    parts.append("".join(buf))
                    buf = []
                parts.append(st.RefValue(span, tuple(body.strip().split("."))))
                i = close + 1
                continue
            # Plain text up to the next `\\` or `$`, in one step (strings can be megabytes).
            match = _SPECIAL_RE.search(inner, i + 1)
            nxt_special = match.start() if match else len(inner)
            buf.append(inner[i:nxt_special])
            i = nxt_special
        if buf or not parts:
            parts.append("".join(buf))
        return parts
