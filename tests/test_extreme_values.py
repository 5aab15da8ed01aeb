"""Every attribute of the language, given every awkward value, gets diagnostics, never a crash.

Random fuzzing (tests/dsl/test_fuzz.py) rarely puts `1e309` exactly where a CPU amount goes;
this walks the block vocabulary itself, so each attribute meets each value once: through
``check`` and, where the file is valid, through ``compile`` and the YAML writer.
"""

from __future__ import annotations

import pytest

from durapipe.compiler import compile_pipeline, to_yaml
from durapipe.dsl import loads
from durapipe.dsl import tree_to_data as td
from durapipe.dsl.diagnostics import render
from tests.vocabulary import Kind, schema_paths

VALUES = [
    "1e309", "-1e309", "99999999999999999999999", "9" * 400, "-1", "0", "0.5", "1e-300", '"x"', '""',
    "true", "[]", "[1e309]", '["a", 2]', 'secret("s", "k")', "params.p", "pre.outputs.out",
    "256Gi", "0s", '"${params.p}"', '"{{workflow.name}}"',
]


def _attribute_paths(schema: dict[str, Kind]) -> list[tuple[str, ...]]:
    """Each attribute, and one key of each ``key = value`` map."""
    return [(*path, "k") if isinstance(kind, td.Map) else path
            for path, kind in schema_paths(schema) if not isinstance(kind, td.BlockSchema)]


def _nested(path: tuple[str, ...], value: str) -> str:
    text = f"{path[-1]} = {value}"
    for block in reversed(path[:-1]):
        text = f"{block} {{ {text} }}"
    return text


STAGE_PATHS = _attribute_paths(td.STAGE_SCHEMA)
PIPELINE_PATHS = _attribute_paths(td.PIPELINE_SCHEMA)


def _file(stage_setting: str = "", pipeline_setting: str = "") -> str:
    return (f'pipeline "p" {{\n  storage = "s3://b/p"\n  {pipeline_setting}\n}}\n'
            "params {\n  p: int = 1\n}\n"
            'stage "pre" {\n  image = "i"\n  command = ["a", params.p]\n'
            '  outputs { out = "/o" }\n}\n'
            f'stage "s" {{\n  image = "i"\n  command = ["b"]\n  {stage_setting}\n}}\n')


def _check_then_compile(text: str) -> None:
    result = loads(text, "extreme.pipe")
    for fmt in ("human", "json"):
        render(result.diagnostics, fmt)
    if result.ok:
        assert result.pipeline is not None
        compiled = compile_pipeline(result.pipeline)
        render(compiled.diagnostics, "human")
        if compiled.documents:
            to_yaml(compiled.documents)


def test_the_vocabulary_is_walked() -> None:
    assert ("resources", "gpu", "fallback_after") in STAGE_PATHS
    assert ("retry", "on_oom", "memory") in STAGE_PATHS
    assert ("env", "k") in STAGE_PATHS and ("cluster", "gpu_products", "k") in PIPELINE_PATHS
    assert len(STAGE_PATHS) > 35
    # The harness itself is sound: the file around each setting checks and compiles as it is.
    plain = loads(_file(), "plain.pipe")
    assert plain.ok and plain.pipeline is not None
    assert compile_pipeline(plain.pipeline).documents


@pytest.mark.parametrize("path", STAGE_PATHS, ids=".".join)
def test_every_stage_attribute_takes_any_value_without_crashing(path: tuple[str, ...]) -> None:
    for value in VALUES:
        _check_then_compile(_file(stage_setting=_nested(path, value)))


@pytest.mark.parametrize("path", PIPELINE_PATHS, ids=".".join)
def test_every_pipeline_attribute_takes_any_value_without_crashing(
        path: tuple[str, ...]) -> None:
    for value in VALUES:
        _check_then_compile(_file(pipeline_setting=_nested(path, value)))


def test_too_large_a_number_is_a_diagnostic() -> None:
    result = loads(_file(stage_setting="resources { cpu = 1e309 }"), "x.pipe")
    assert [d.code for d in result.diagnostics] == ["P0111"]


def test_an_integer_too_large_for_a_float_is_a_diagnostic() -> None:
    # 309+ digits: the literal cannot even be compared with infinity as a float.
    result = loads(_file(stage_setting=f"resources {{ cpu = {'9' * 400} }}"), "x.pipe")
    assert [d.code for d in result.diagnostics] == ["P0111"]
