"""Plain data -> model instances, by the types written on the model's dataclasses.

The model is plain frozen dataclasses (see ``model``); this module reads their annotations and
checks and converts the plain data into them, collecting every problem with its location
(``("stages", 2, "retry", "attempts")``, the same keys as the source map) instead of stopping
at the first.  It understands exactly the annotations the model uses: ``str``, ``int`` and
``bool`` (exact: ``True`` is not a count, ``"3"`` is not a number), ``float``, ``None``,
``Literal``, unions (first matching member wins), ``tuple[X, ...]`` (from a list or tuple),
``dict[str, X]``, nested model classes (from a dict, or an instance as it is), and ``Annotated``
with the markers below.

It is written here rather than taken from a validation library because building such a
library's validators for the model cost more than half of a cold ``durapipe check``
(docs/performance.md); checking a pipeline's data is a small, closed job.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Union

Loc = tuple[str | int, ...]

#: What kind of mistake a problem is; ``validate`` maps each to a diagnostic code.
ProblemKind = Literal["missing", "unknown", "type", "range", "choice", "convert"]


class Problem(NamedTuple):
    """One mistake in the data: where, what kind, a lower-case message, the offending value."""

    loc: Loc
    kind: ProblemKind
    message: str
    value: object = None
    #: For a ``choice`` problem: the values allowed.
    choices: tuple[object, ...] = ()
    #: For a ``convert`` problem: the fix the converter suggests, if any.
    help: str | None = None


@dataclass(frozen=True)
class Convert:
    """Marker: turn the raw value into the annotated type first (unit literals).

    ``parse`` raises ``ValueError`` with a user-facing message for a value it cannot read.
    """

    parse: Callable[[object], object]


@dataclass(frozen=True)
class Bounds:
    """Marker: numeric bounds, checked after conversion."""

    ge: int | None = None
    gt: int | None = None
    le: int | None = None


@dataclass(frozen=True)
class MinItems:
    """Marker: a list must have at least this many items."""

    count: int


#: A checker validates one value at ``loc``: it returns the converted value, or appends to
#: ``problems`` (and its return value is then meaningless).
Checker = Callable[[object, Loc, list[Problem]], object]

_checkers: dict[object, Checker] = {}


def build(cls: type[Any], data: object) -> tuple[Any, list[Problem]]:
    """An instance of the model class ``cls`` from ``data``, or ``None`` and every problem."""
    problems: list[Problem] = []
    value = checker_for(cls)(data, (), problems)
    return (None, problems) if problems else (value, [])


def checker_for(annotation: object) -> Checker:
    """The (cached) checker for a type annotation."""
    found = _checkers.get(annotation)
    if found is None:
        found = _make_checker(annotation)
        _checkers[annotation] = found
    return found


def _make_checker(annotation: object) -> Checker:
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return _record_checker(annotation)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _annotated_checker(checker_for(args[0]), args[1:])
    if origin is Literal:
        return _literal_checker(args)
    if origin is Union or origin is types.UnionType:
        return _union_checker(args)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _tuple_checker(checker_for(args[0]))
    if origin is dict and args and args[0] is str:
        return _dict_checker(checker_for(args[1]))
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    raise TypeError(f"typecheck does not support the annotation {annotation!r}")


def shown(value: object) -> str:
    """A value as a message names it, in the ``.pipe`` language's terms."""
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {quoted(value)}" if len(value) <= 40 else "a string"
    if isinstance(value, (list, tuple)):
        return "a list" if value else "an empty list"
    if isinstance(value, dict):
        return "a block"
    if value is None:
        return "nothing"
    if dataclasses.is_dataclass(value):  # a model value
        if type(value).__str__ is not object.__str__:
            return f"`{value}`"  # it prints as it is written (a reference)
        return str(getattr(type(value), "described_as", "a block"))
    return f"a Python `{type(value).__name__}`"  # from the builder: anything at all


def quoted(text: str) -> str:
    """``text`` as a ``.pipe`` string literal."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _scalar(accepts: Callable[[object], bool], expected: str) -> Checker:
    def check(value: object, loc: Loc, problems: list[Problem]) -> object:
        if not accepts(value):
            problems.append(_wrong_type(loc, expected, value))
        return value

    return check


def _wrong_type(loc: Loc, expected: str, value: object) -> Problem:
    return Problem(loc, "type", f"expected {expected}, got {shown(value)}", value)


def _check_float(value: object, loc: Loc, problems: list[Problem]) -> object:
    if isinstance(value, float):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    problems.append(_wrong_type(loc, "a number", value))
    return value


_SCALARS: dict[object, Checker] = {
    str: _scalar(lambda v: isinstance(v, str), "a string"),
    int: _scalar(lambda v: isinstance(v, int) and not isinstance(v, bool), "a whole number"),
    bool: _scalar(lambda v: isinstance(v, bool), "`true` or `false`"),
    float: _check_float,
}


def _literal_checker(choices: tuple[object, ...]) -> Checker:
    shown_choices = [quoted(c) if isinstance(c, str) else str(c) for c in choices]
    expected = shown_choices[0] if len(choices) == 1 else (
        "one of " + ", ".join(shown_choices[:-1]) + " or " + shown_choices[-1])

    def check(value: object, loc: Loc, problems: list[Problem]) -> object:
        # Compare type too: `True == 1`, but `true` is not the choice `1`.
        if not any(value == c and type(value) is type(c) for c in choices):
            problems.append(Problem(loc, "choice", f"expected {expected}, got {shown(value)}",
                                    value, choices))
        return value

    return check


def _union_checker(members: tuple[object, ...]) -> Checker:
    nullable = type(None) in members
    checkers = [checker_for(m) for m in members if m is not type(None)]

    def check(value: object, loc: Loc, problems: list[Problem]) -> object:
        if value is None and nullable:
            return None
        first: list[Problem] | None = None
        for member in checkers:
            tried: list[Problem] = []
            result = member(value, loc, tried)
            if not tried:
                return result
            if first is None:
                first = tried
        # The first member's complaint: the most general type comes first in the model.
        problems.extend(first or ())
        return value

    return check


def _tuple_checker(item: Checker) -> Checker:
    def check(value: object, loc: Loc, problems: list[Problem]) -> object:
        if not isinstance(value, (list, tuple)):
            problems.append(_wrong_type(loc, "a list", value))
            return value
        return tuple(item(v, (*loc, i), problems) for i, v in enumerate(value))

    return check


def _dict_checker(item: Checker) -> Checker:
    def check(value: object, loc: Loc, problems: list[Problem]) -> object:
        if not isinstance(value, dict):
            problems.append(_wrong_type(loc, "a block", value))
            return value
        out: dict[str, object] = {}
        for key, v in value.items():
            if not isinstance(key, str):
                problems.append(_wrong_type((*loc, str(key)), "a string as the key", key))
                continue
            out[key] = item(v, (*loc, key), problems)
        return out

    return check


def _annotated_checker(inner: Checker, markers: tuple[object, ...]) -> Checker:
    converts = [m for m in markers if isinstance(m, Convert)]
    bounds = [m for m in markers if isinstance(m, Bounds)]
    min_items = [m for m in markers if isinstance(m, MinItems)]

    def check(value: object, loc: Loc, problems: list[Problem]) -> object:
        for convert in converts:
            try:
                value = convert.parse(value)
            except ValueError as exc:
                problems.append(Problem(loc, "convert", str(exc), value,
                                        help=getattr(exc, "help", None)))
                return value
        before = len(problems)
        value = inner(value, loc, problems)
        if len(problems) > before:
            return value
        for bound in bounds:
            _check_bounds(bound, value, loc, problems)
        for minimum in min_items:
            if isinstance(value, tuple) and len(value) < minimum.count:
                items = f"{minimum.count} item{'s' if minimum.count != 1 else ''}"
                problems.append(Problem(
                    loc, "range", f"must list at least {items}, got {shown(value)}", value))
        return value

    return check


def _check_bounds(bound: Bounds, value: object, loc: Loc, problems: list[Problem]) -> None:
    if not isinstance(value, (int, float)):
        return
    if bound.ge is not None and value < bound.ge:
        limit = f"at least {bound.ge}"
    elif bound.gt is not None and value <= bound.gt:
        limit = f"more than {bound.gt}"
    elif bound.le is not None and value > bound.le:
        limit = f"at most {bound.le}"
    else:
        return
    problems.append(Problem(loc, "range", f"must be {limit}, got {value}", value))


class _Field(NamedTuple):
    name: str
    check: Checker
    #: A zero-argument factory of the default; ``None`` when the field is required.
    default: Callable[[], object] | None


def _record_checker(cls: type[Any]) -> Checker:
    #: By name, in the class's order; resolved on first use, not at import: most commands
    #: never build most classes.
    fields: dict[str, _Field] | None = None
    #: How a value of this class is called in messages (``a block`` unless the class says).
    phrase = getattr(cls, "described_as", "a block")

    def resolve() -> dict[str, _Field]:
        hints = typing.get_type_hints(cls, include_extras=True)
        out = {}
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                default: Callable[[], object] | None = (lambda d=f.default: d)
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory
            else:
                default = None
            out[f.name] = _Field(f.name, checker_for(hints[f.name]), default)
        return out

    def check(value: object, loc: Loc, problems: list[Problem]) -> object:
        nonlocal fields
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            problems.append(_wrong_type(loc, phrase, value))
            return value
        if fields is None:
            fields = resolve()
        before = len(problems)
        kwargs: dict[str, object] = {}
        for name, field_check, default in fields.values():
            if name in value:
                kwargs[name] = field_check(value[name], (*loc, name), problems)
            elif default is None:
                problems.append(Problem((*loc, name), "missing", "field required"))
            else:
                kwargs[name] = default()
        for key in value:
            if key not in fields:
                problems.append(Problem((*loc, str(key)), "unknown", "unknown field", value[key]))
        if len(problems) > before:
            return value
        return cls(**kwargs)

    return check
