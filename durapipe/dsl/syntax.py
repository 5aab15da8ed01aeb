"""The syntax tree of a ``.pipe`` file: what was written, with a span on every node.

Values are decoded (escapes resolved, interpolation split) but not yet checked against the
schema; that is the job of :mod:`durapipe.dsl.tree_to_data`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from durapipe.dsl.source import Source, Span


@dataclass
class Comment:
    span: Span
    text: str


@dataclass
class StrValue:
    span: Span
    #: Literal text and dotted references (``${a.b}``), in order.
    parts: list[str | RefValue]
    heredoc: bool = False
    #: For heredocs: the tag and whether it was the indented ``<<-`` form (kept by ``fmt``).
    tag: str = ""

    @property
    def text(self) -> str:
        """The literal text, with references shown as ``${...}``."""
        return "".join(p if isinstance(p, str) else "${" + ".".join(p.path) + "}"
                       for p in self.parts)


@dataclass
class NumberValue:
    span: Span
    value: int | float
    raw: str


@dataclass
class UnitValue:
    span: Span
    raw: str


@dataclass
class BoolValue:
    span: Span
    value: bool


@dataclass
class ListValue:
    span: Span
    items: list[Value]


@dataclass
class CallValue:
    span: Span
    name: str
    name_span: Span
    args: list[Value]


@dataclass
class RefValue:
    span: Span
    path: tuple[str, ...]


Value = Union[StrValue, NumberValue, UnitValue, BoolValue, ListValue, CallValue, RefValue]


@dataclass
class Attribute:
    span: Span
    key: str
    key_span: Span
    value: Value
    #: Whether the key was written as a quoted string (``"app.kubernetes.io/name" = ...``).
    quoted_key: bool = False


@dataclass
class Block:
    span: Span
    name: str
    name_span: Span
    #: The opening brace, for "unclosed block" diagnostics.
    open_span: Span
    label: StrValue | None = None
    members: list[Attribute | Block] = field(default_factory=list)
    quoted_key: bool = False


@dataclass
class ParamDecl:
    span: Span
    name: str
    name_span: Span
    type: str
    type_span: Span
    default: Value | None


@dataclass
class ParamsBlock:
    span: Span
    name_span: Span
    params: list[ParamDecl]


TopLevel = Union[Block, ParamsBlock]


@dataclass
class File:
    source: Source
    items: list[TopLevel]
    comments: list[Comment]
