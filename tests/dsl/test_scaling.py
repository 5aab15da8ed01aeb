"""The front end's work grows linearly with the file: no per-value pass over whole-file tables.

Counted, not timed (timings belong to benchmarks/check_bench.py): how often the checker walks
the whole source map must not depend on how many interpolated strings the file holds.
"""

from __future__ import annotations

from typing import Any

import pytest

from durapipe.dsl import loads
from durapipe.dsl import validate


class CountingMap(dict[tuple[object, ...], Any]):
    walks = 0

    def __iter__(self) -> Any:
        CountingMap.walks += 1
        return super().__iter__()

    def keys(self) -> Any:
        CountingMap.walks += 1
        return super().keys()

    def items(self) -> Any:
        CountingMap.walks += 1
        return super().items()


def _pipeline(stages: int) -> str:
    out = ['pipeline "p" {\n  storage = "s3://b/p"\n}\nparams {\n  lr: float = 0.1\n}\n']
    for i in range(stages):
        reads = f', "--in=${{s{i - 1}.outputs.data}}"' if i else ""
        out.append(f'stage "s{i}" {{\n  image = "i"\n'
                   f'  command = ["python", "--lr=${{params.lr}}"{reads}]\n'
                   f'  env {{ LR = "${{params.lr}}/x" }}\n'
                   f'  outputs {{ data = "/out" }}\n}}\n')
    return "".join(out)


_ORIGINAL_INIT = validate._Checker.__init__


def _walks(stages: int, monkeypatch: pytest.MonkeyPatch) -> int:
    def counting_init(self: Any, pipeline: Any, source_map: Any, *rest: Any) -> None:
        _ORIGINAL_INIT(self, pipeline, CountingMap(source_map), *rest)

    monkeypatch.setattr(validate._Checker, "__init__", counting_init)
    result = loads(_pipeline(stages), "scaling.pipe")
    assert result.ok, result.diagnostics
    walks, CountingMap.walks = CountingMap.walks, 0
    return walks


def test_checking_interpolated_strings_walks_the_source_map_a_fixed_number_of_times(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert _walks(40, monkeypatch) == _walks(20, monkeypatch)


def test_references_inside_strings_are_still_located() -> None:
    text = _pipeline(2).replace("s0.outputs.data}", "s0.outputs.dat}")
    result = loads(text, "scaling.pipe")
    [diag] = [d for d in result.diagnostics if d.code == "P0301"]
    assert diag.span is not None
    # The caret is on the reference inside the string, not on the string as a whole.
    assert text[diag.span.start:diag.span.end] == "${s0.outputs.dat}"
