"""The YAML emitter: every value round-trips through a YAML 1.1 parser unchanged, key order is
the order the compiler built, and nothing in the output depends on the run."""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durapipe.compiler.serialize import dump_document, scalar, to_yaml

keys = st.text(min_size=1, max_size=12)  # includes newlines, controls, astral planes
scalars = st.one_of(st.text(max_size=40), st.integers(-(2**40), 2**40), st.booleans(), st.none())
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(keys, values, max_size=6))
def test_any_document_round_trips(doc: dict[str, Any]) -> None:
    assert yaml.safe_load(dump_document(doc) if doc else "{}") == doc


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_any_string_round_trips_as_a_string(text: str) -> None:
    assert yaml.safe_load(dump_document({"k": text})) == {"k": text}


def test_strings_that_look_like_other_types_are_quoted() -> None:
    for text in ("true", "No", "on", "null", "~", "3", "0o17", "1e3", "2026-11-29", "0x1F", "",
                 "- a", "a: b", "#c", "*x", "&y", "!t", "{}", "[]", "|", ">", "@a", "`b", "%c",
                 " lead", "trail ", "yes", "Y", "=", "<<"):
        out = dump_document({"k": text})
        assert yaml.safe_load(out) == {"k": text}, out
        assert scalar(text).startswith('"'), text


def test_multi_line_text_is_a_literal_block() -> None:
    doc = {"manifest": "a: 1\nb:\n  - c\n"}
    assert dump_document(doc) == "manifest: |\n  a: 1\n  b:\n    - c\n"


def test_key_order_is_preserved_and_header_is_commented() -> None:
    out = to_yaml([{"z": 1, "a": [{"name": "x", "b": {}}]}], "line one\nline two")
    assert out == "# line one\n# line two\n---\nz: 1\na:\n  - name: x\n    b: {}\n"


def test_characters_yaml_may_not_hold_raw_are_escaped() -> None:
    for text in ("\x7f", "\x85x", "\ufeff", "\x00", "a\u2028b", "\U0001f600", "a\rb", "x\ty"):
        out = dump_document({"k": text})
        assert yaml.safe_load(out) == {"k": text}, out


def test_keys_with_a_trailing_newline_are_quoted() -> None:
    assert yaml.safe_load(dump_document({"O\n": {"a\n": 1}})) == {"O\n": {"a\n": 1}}
