"""The language's vocabulary for an editor, derived from the front end rather than copied.

Block and attribute names come from the lowering tables (``lower.STAGE_SCHEMA`` and
``lower.PIPELINE_SCHEMA``), what each one holds from the model's annotations (units, bounds,
``Literal`` choices), its documentation from the ``#:`` comments and docstrings of
``durapipe/dsl/model.py``, and the keywords from the grammar's terminals.  A name added to the
language therefore shows up in completion and hover without touching this module.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from durapipe import grammars
from durapipe.dsl import tree_to_data as td
from durapipe.dsl import model, units
from durapipe.dsl.typecheck import Bounds, Convert, MinItems

Unit = Literal["bytes", "millicpu", "seconds"]
_UNITS: dict[object, Unit] = {units.parse_bytes: "bytes", units.parse_millicpu: "millicpu",
                              units.parse_seconds: "seconds"}
_UNIT_WORDS: dict[Unit, str] = {"bytes": "a memory size such as `16Gi`",
                                "millicpu": "a CPU amount in cores such as `8` or `0.5`",
                                "seconds": "a duration such as `30m` or `1h30m`"}


@dataclass(frozen=True)
class Entry:
    """One name allowed in a block: an attribute, a nested block or a map of pairs."""

    name: str
    #: Where it is written, from the top-level block: ``("stage", "retry", "attempts")``.
    path: tuple[str, ...]
    kind: Literal["attribute", "block", "map"]
    doc: str = ""
    #: What the value is, in the language's words (``an integer from 0 to 100``).
    type_text: str = ""
    default: str | None = None
    choices: tuple[str, ...] = ()
    unit: Unit | None = None
    boolean: bool = False
    #: A block that may also be written ``name = true``.
    flag: bool = False
    children: dict[str, Entry] = field(default_factory=dict)

    @property
    def dotted(self) -> str:
        return ".".join(self.path[1:]) or self.path[0]


@functools.lru_cache(maxsize=1)
def keywords() -> tuple[str, ...]:
    """The grammar's keyword terminals (``PIPELINE: "pipeline"``), in grammar order."""
    return tuple(re.findall(r'^[A-Z_]+: "([a-z]+)"$', grammars.read(), re.MULTILINE))


def top_level_keywords() -> tuple[str, ...]:
    """Keywords that open a top-level block (the grammar's ``_toplevel`` alternatives)."""
    match = re.search(r"^_toplevel:(.*)$", grammars.read(), re.MULTILINE)
    names = [n.strip() for n in match.group(1).split("|")] if match else []
    return tuple(k for k in keywords() if k in names)


@functools.lru_cache(maxsize=1)
def _field_docs() -> dict[tuple[str, str], str]:
    """``(class, field) -> text`` of the ``#:`` comment lines above each model field."""
    try:
        text = inspect.getsource(model)
    except (OSError, TypeError):  # no source shipped: names still complete, undocumented
        return {}
    lines = text.splitlines()
    docs: dict[tuple[str, str], str] = {}
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                comment: list[str] = []
                row = item.lineno - 2
                while row >= 0 and lines[row].strip().startswith("#:"):
                    comment.insert(0, lines[row].strip()[2:].strip())
                    row -= 1
                if comment:
                    docs[(node.name, item.target.id)] = " ".join(comment)
    return docs


def _unwrap(annotation: Any) -> tuple[Any, list[object], bool]:
    """The annotation without ``Annotated`` and ``None``: base type, markers, optional."""
    markers: list[object] = []
    optional = False
    while True:
        if typing.get_origin(annotation) is typing.Annotated:
            markers.extend(annotation.__metadata__)
            annotation = typing.get_args(annotation)[0]
            continue
        origin = typing.get_origin(annotation)
        if origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(members) < len(typing.get_args(annotation)):
                optional = True
            if len(members) == 1:
                annotation = members[0]
                continue
        return annotation, markers, optional


def _describe(annotation: Any, markers: list[object]) -> tuple[str, Unit | None,
                                                                tuple[str, ...], bool]:
    """Words for a value's type, with its unit, its choices and whether it is a boolean."""
    unit = next((_UNITS.get(m.parse) for m in markers if isinstance(m, Convert)), None)
    bounds = next((m for m in markers if isinstance(m, Bounds)), None)
    origin = typing.get_origin(annotation)
    if unit is not None:
        return _UNIT_WORDS[unit], unit, (), False
    if origin is Literal:
        choices = tuple(str(c) for c in typing.get_args(annotation))
        return "one of " + ", ".join(f'`"{c}"`' for c in choices), None, choices, False
    if annotation is bool:
        return "`true` or `false`", None, (), True
    if annotation is int:
        words = "an integer"
        if bounds is not None:
            low = bounds.ge if bounds.ge is not None else (
                bounds.gt + 1 if bounds.gt is not None else None)
            if low is not None and bounds.le is not None:
                words += f" from {low} to {bounds.le}"
            elif low is not None:
                words += f" of at least {low}"
        return words, None, (), False
    if annotation is str:
        return "a string", None, (), False
    if origin is tuple:
        item, item_markers, _ = _unwrap(typing.get_args(annotation)[0])
        inner, inner_unit, _, _ = _describe(item, item_markers)
        least = next((m.count for m in markers if isinstance(m, MinItems)), 0)
        if dataclasses.is_dataclass(item) and not hasattr(item, "described_as"):
            inner = "entries"
        words = f"a list of {inner}" + (f" (at least {least})" if least else "")
        return words.replace("list of a ", "list of ").replace("list of an ", "list of "), \
            inner_unit, (), False
    if origin is dict:
        return "`key = value` pairs", None, (), False
    if dataclasses.is_dataclass(annotation):
        return str(getattr(annotation, "described_as", "a block")), None, (), False
    return "a value", None, (), False


def _default(cls: type, name: str) -> str | None:
    for f in dataclasses.fields(cls):
        if f.name == name and f.default is not dataclasses.MISSING:
            value = f.default
            if value is None or dataclasses.is_dataclass(value) or value == ():
                return None
            if isinstance(value, bool):
                return "true" if value else "false"
            return f'"{value}"' if isinstance(value, str) else str(value)
    return None


def _resolve(cls: type, target: tuple[str, ...]) -> tuple[type, str, Any] | None:
    """The class and annotation of the model field at ``target`` below ``cls``."""
    for i, name in enumerate(target):
        hints = typing.get_type_hints(cls, include_extras=True)
        if name not in hints:
            return None
        if i == len(target) - 1:
            return cls, name, hints[name]
        inner, _, _ = _unwrap(hints[name])
        if not dataclasses.is_dataclass(inner):
            return None
        cls = typing.cast(type, inner)
    return None


def _entries(schema: dict[str, td.Kind], cls: type,
             prefix: tuple[str, ...], skip: tuple[str, ...] = ()) -> dict[str, Entry]:
    docs = _field_docs()
    out: dict[str, Entry] = {}
    for name, kind in schema.items():
        if name in skip:
            continue
        path = (*prefix, name)
        found = _resolve(cls, kind.target or (name,))
        if found is None:
            out[name] = Entry(name, path, "attribute")
            continue
        owner, field_name, annotation = found
        base, markers, _ = _unwrap(annotation)
        doc = docs.get((owner.__name__, field_name), "")
        if isinstance(kind, td.BlockSchema):
            block_cls = typing.cast(type, base)
            class_doc = inspect.cleandoc(block_cls.__doc__ or "")
            out[name] = Entry(name, path, "block", doc=doc or class_doc.split("\n\n")[0],
                              flag=kind.flag,
                              children=_entries(kind.schema, block_cls, path))
        elif isinstance(kind, td.Map):
            out[name] = Entry(name, path, "map", doc=doc, type_text="`key = value` pairs")
        elif isinstance(kind, td.Blocks):
            out[name] = Entry(name, path, "map", doc=doc, type_text="named blocks")
        else:
            text, unit, choices, boolean = _describe(base, markers)
            out[name] = Entry(name, path, "attribute", doc=doc, type_text=text,
                              default=_default(owner, field_name), choices=choices, unit=unit,
                              boolean=boolean)
    return out


@functools.lru_cache(maxsize=1)
def blocks() -> dict[str, Entry]:
    """The top-level blocks with everything they allow."""
    return {
        "pipeline": Entry("pipeline", ("pipeline",), "block",
                          doc=inspect.cleandoc(model.Pipeline.__doc__ or "") or
                          "The pipeline: name, namespace, storage, cluster profile.",
                          children=_entries(td.PIPELINE_SCHEMA, model.Pipeline, ("pipeline",))),
        "stage": Entry("stage", ("stage",), "block", doc="One step of the pipeline: a pod.",
                       children=_entries(td.STAGE_SCHEMA, model.Stage, ("stage",))),
        "defaults": Entry("defaults", ("defaults",), "block",
                          doc="Settings every stage starts from; a stage's own settings win "
                              "(blocks merge key by key).",
                          children=_entries(td.STAGE_SCHEMA, model.Stage, ("defaults",),
                                            skip=td.NOT_IN_DEFAULTS)),
        "params": Entry("params", ("params",), "block",
                        doc=inspect.cleandoc(model.Param.__doc__ or "")),
    }


def lookup(path: tuple[str, ...]) -> Entry | None:
    """The entry at ``path`` (``("stage", "retry", "attempts")``), if the language has one."""
    if not path:
        return None
    entry = blocks().get(path[0])
    for name in path[1:]:
        if entry is None:
            return None
        entry = entry.children.get(name)
    return entry


def param_types() -> tuple[str, ...]:
    """The types a param may be declared with (``model.ParamType``)."""
    return tuple(str(a) for a in typing.get_args(model.ParamType))
