"""The builder takes any Python value for any attribute and answers with diagnostics.

A Python caller can pass what no ``.pipe`` file can hold (a generator, bytes, a set, an
object); each is a mistake to report through ``PipelineError``, never another exception.
"""

from __future__ import annotations

import decimal
import pathlib
from typing import Any

import pytest

from durapipe.dsl import builder as b
from durapipe.dsl import tree_to_data as td
from durapipe.dsl.diagnostics import PipelineError
from tests.vocabulary import schema_paths


def _values() -> list[Any]:
    """Fresh each time: a generator is used up once read."""
    return [
        set(), {"a"}, frozenset({"a"}), b"x", bytearray(b"x"), object(), 1j, float("nan"),
        float("inf"), lambda: 1, (i for i in range(2)), range(3), {1: "a"}, {"a": {"b": 1}},
        [[1]], ["a", None], decimal.Decimal("1.5"), pathlib.Path("/x"), None, True, -1,
        10**30, "", "x" * 10_000, b.Resources(cpu=1), b.secret("a", "b"), type, ...,
    ]


#: The builder's class for each nested block.
_SECTIONS: dict[str, Any] = {
    "resources": b.Resources, "gpu": b.Gpu, "retry": b.Retry, "on_oom": b.OnOom,
    "cache": b.Cache, "checkpoint": b.Checkpoint, "distributed": b.Distributed,
    "affinity": b.Affinity, "limits": b.Limits,
}


PATHS = [path for path, _ in schema_paths(td.STAGE_SCHEMA)]


def _stage_attributes(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """``{"resources": Resources(gpu=Gpu(count=value))}`` for ("resources", "gpu", "count")."""
    nested = value
    for depth in range(len(path) - 1, 0, -1):
        nested = _SECTIONS[path[depth - 1]](**{path[depth]: nested})
    attributes = {path[0]: nested}
    attributes.setdefault("image", "ghcr.io/acme/x:1")
    if "command" not in attributes and "script" not in attributes:
        attributes["command"] = ["true"]
    return attributes


def test_every_block_is_reached() -> None:
    assert ("resources", "gpu", "count") in PATHS and ("retry", "on_oom", "memory") in PATHS
    built = b.Pipeline("demo", storage="s3://b/p")
    built.stage("s", **_stage_attributes(("resources", "gpu", "count"), 2))
    assert built.build().stages[0].resources.gpu.count == 2  # type: ignore[union-attr]


@pytest.mark.parametrize("path", PATHS, ids=".".join)
def test_any_python_value_gets_diagnostics_not_a_crash(path: tuple[str, ...]) -> None:
    for value in _values():
        pipeline = b.Pipeline("demo", storage="s3://b/p")
        pipeline.stage("s", **_stage_attributes(path, value))
        try:
            pipeline.build()
        except PipelineError as error:
            assert any(d.code.startswith("P") for d in error.diagnostics)


def test_a_python_value_is_named_by_its_type() -> None:
    pipeline = b.Pipeline("demo", storage="s3://b/p")
    pipeline.stage("s", image=b"img", command=(a for a in "xy"), resources={1: "a"})
    with pytest.raises(PipelineError) as info:
        pipeline.build()
    assert sorted(d.message for d in info.value.diagnostics) == [
        "`command` has the wrong type: expected a list, got a Python `generator`",
        "`image` has the wrong type: expected a string, got a Python `bytes`",
        "unknown attribute `1` in `resources`",
    ]
