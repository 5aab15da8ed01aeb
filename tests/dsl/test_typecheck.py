"""typecheck: plain data -> model instances, every problem with its location."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

import pytest

from durapipe.dsl import model, typecheck
from durapipe.dsl.typecheck import Bounds, Convert, MinItems, Problem


def _parse_size(value: object) -> int:
    if isinstance(value, str) and value.endswith("k"):
        return int(value[:-1]) * 1000
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError(f"{value!r} is not a size")


@dataclass(frozen=True, kw_only=True)
class Leaf:
    described_as = "a leaf block"

    tag: str


@dataclass(frozen=True, kw_only=True)
class Record:
    name: str
    count: Annotated[int, Bounds(ge=1, le=10)] = 1
    ratio: float = 0.5
    flag: bool = False
    mode: Literal["a", "b", "c"] = "a"
    level: Literal[1, 2] = 1
    size: Annotated[int, Convert(_parse_size), Bounds(gt=0)] | None = None
    items: Annotated[tuple[str, ...], MinItems(1)] = ("x",)
    labels: dict[str, str] = field(default_factory=dict)
    leaf: Leaf | None = None
    either: str | Leaf = ""
    maybe: int | None = None


def problems(data: object) -> list[tuple[tuple[object, ...], str, str]]:
    built, found = typecheck.build(Record, data)
    assert (built is None) == bool(found)
    return [(p.loc, p.kind, p.message) for p in found]


def test_valid_data_builds_an_equal_frozen_instance_with_defaults() -> None:
    built, found = typecheck.build(Record, {
        "name": "n", "count": 3, "ratio": 2, "size": "4k", "items": ["a", "b"],
        "labels": {"k": "v"}, "leaf": {"tag": "t"}, "either": {"tag": "u"}})
    assert found == []
    assert built == Record(name="n", count=3, ratio=2.0, size=4000, items=("a", "b"),
                           labels={"k": "v"}, leaf=Leaf(tag="t"), either=Leaf(tag="u"))
    assert isinstance(built.ratio, float) and isinstance(built.items, tuple)
    with pytest.raises(AttributeError):
        built.name = "changed"  # type: ignore[misc]


def test_an_instance_is_taken_as_it_is() -> None:
    leaf = Leaf(tag="t")
    built, _ = typecheck.build(Record, {"name": "n", "leaf": leaf})
    assert built.leaf is leaf


def test_missing_and_unknown_fields() -> None:
    assert problems({"nmae": "n"}) == [
        (("name",), "missing", "field required"),
        (("nmae",), "unknown", "unknown field"),
    ]


@pytest.mark.parametrize(("value", "message"), [
    (True, "expected a whole number, got `true`"),  # a boolean is not a count
    ("3", 'expected a whole number, got the string "3"'),  # nor is a string of digits
    (2.0, "expected a whole number, got the number 2.0"),
])
def test_counts_are_exactly_integers(value: object, message: str) -> None:
    assert problems({"name": "n", "count": value}) == [(("count",), "type", message)]


def test_flags_are_exactly_booleans_and_strings_exactly_strings() -> None:
    assert problems({"name": 1, "flag": 1}) == [
        (("name",), "type", "expected a string, got the number 1"),
        (("flag",), "type", "expected `true` or `false`, got the number 1"),
    ]


@pytest.mark.parametrize(("field_name", "value", "message"), [
    ("count", 0, "must be at least 1, got 0"),
    ("count", 11, "must be at most 10, got 11"),
    ("size", 0, "must be more than 0, got 0"),
    ("items", [], "must list at least 1 item, got an empty list"),
])
def test_bounds(field_name: str, value: object, message: str) -> None:
    assert problems({"name": "n", field_name: value}) == [((field_name,), "range", message)]


def test_choices_compare_type_as_well_as_value() -> None:
    assert problems({"name": "n", "mode": "d"}) == [
        (("mode",), "choice", 'expected one of "a", "b" or "c", got the string "d"')]
    # `True == 1` in Python, but `true` is not the choice `1`.
    assert problems({"name": "n", "level": True}) == [
        (("level",), "choice", "expected one of 1 or 2, got `true`")]
    assert problems({"name": "n", "level": 2}) == []


def test_conversion_runs_first_and_reports_its_own_message() -> None:
    assert problems({"name": "n", "size": "lots"}) == [
        (("size",), "convert", "'lots' is not a size")]
    assert problems({"name": "n", "size": None}) == []  # optional: None is not converted


def test_containers_report_each_bad_item_at_its_own_location() -> None:
    assert problems({"name": "n", "items": ["a", 2, "c", None],
                     "labels": {"k": 1, "ok": "v"}}) == [
        (("items", 1), "type", "expected a string, got the number 2"),
        (("items", 3), "type", "expected a string, got nothing"),
        (("labels", "k"), "type", "expected a string, got the number 1"),
    ]
    assert problems({"name": "n", "items": "a", "labels": ["k"]}) == [
        (("items",), "type", 'expected a list, got the string "a"'),
        (("labels",), "type", "expected a block, got a list"),
    ]


def test_nested_blocks_have_nested_locations_and_their_own_phrase() -> None:
    assert problems({"name": "n", "leaf": {"tag": 1, "x": 2}}) == [
        (("leaf", "tag"), "type", "expected a string, got the number 1"),
        (("leaf", "x"), "unknown", "unknown field"),
    ]
    assert problems({"name": "n", "leaf": "t"}) == [
        (("leaf",), "type", 'expected a leaf block, got the string "t"')]


def test_a_union_takes_the_first_member_that_accepts_and_reports_the_first_complaint() -> None:
    built, _ = typecheck.build(Record, {"name": "n", "either": "s"})
    assert built.either == "s"
    assert problems({"name": "n", "either": 5}) == [
        (("either",), "type", "expected a string, got the number 5")]


def test_values_are_shown_in_the_language_s_terms() -> None:
    assert typecheck.shown("x" * 41) == "a string"
    assert typecheck.quoted('say "hi"\n') == '"say \\"hi\\"\\n"'
    assert typecheck.shown(model.Secret(name="n", key="k")) == 'a `secret("name", "key")` call'


def test_problems_carry_the_offending_value() -> None:
    ref = model.Ref(path=("params", "x"))
    _, found = typecheck.build(Record, {"name": ref})
    assert found == [Problem(("name",), "type", "expected a string, got `params.x`", ref)]


def test_an_unsupported_annotation_is_a_programming_error() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Odd:
        values: list[int]

    with pytest.raises(TypeError, match="does not support"):
        typecheck.build(Odd, {"values": []})


def test_the_pipeline_model_keeps_its_rules() -> None:
    """The model's own annotations: strict counts, unit conversion, ladders of one or more."""
    data = {"name": "p", "stages": [{
        "name": "s", "image": "i",
        "resources": {"memory": "1Gi", "cpu": "500m", "gpu": {"count": 0}},
        "retry": {"attempts": True, "on_oom": {"memory": []}},
    }]}
    _, found = typecheck.build(model.Pipeline, data)
    assert [(p.loc, p.kind) for p in found] == [
        (("stages", 0, "resources", "gpu", "count"), "range"),
        (("stages", 0, "retry", "attempts"), "type"),
        (("stages", 0, "retry", "on_oom", "memory"), "range"),
    ]
    del data["stages"][0]["resources"]["gpu"]  # type: ignore[index]
    data["stages"][0]["retry"] = {"on_oom": {"memory": ["256Gi", "1Ti"]}}  # type: ignore[index]
    built, found = typecheck.build(model.Pipeline, data)
    assert found == []
    stage = built.stages[0]
    assert stage.resources.memory == 2**30 and stage.resources.cpu == 500
    assert stage.retry.on_oom.memory == (256 * 2**30, 2**40)
    assert stage.retry.attempts == 0 and stage.retry.preemptions == 3
