"""Error recovery: one mistake gives one diagnostic, not a cascade.

Each case makes one edit to ``tests/cases/recovery/base.pipe`` (a valid file) and lists every
error the front end must then report, by code and line.  A repair that drops too little or too
much of the file shows up here as extra errors (a cascade) or a missing one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from durapipe.dsl import loads, render

BASE = (Path(__file__).resolve().parents[1] / "cases" / "recovery" / "base.pipe").read_text()

#: name -> (text replaced, replacement, expected errors as (code, line)).
CASES: dict[str, tuple[str, str, list[tuple[str, int]]]] = {
    # Syntax slips that are repaired in place.
    "colon-for-equals": ("  cpu = 4", "  cpu: 4", [("P0101", 16)]),
    "missing-equals": ("  cpu = 4", "  cpu 4", [("P0102", 16)]),
    "comma-between-attributes": ("retry { attempts = 2 }",
                                 "retry { attempts = 2, preemptions = 1 }", [("P0104", 25)]),
    "single-quotes": ('"/out/model"', "'/out/model'", [("P0105", 26)]),
    "semicolon": ("cpu = 4", "cpu = 4;", [("P0106", 16)]),
    # A member is abandoned, the rest of the block is still read.
    "missing-value": ("cpu = 4", "cpu =", [("P0100", 16)]),
    "missing-value-last-in-block": ('count = 1  types = ["A100"] }', "count = 1  types = }",
                                    [("P0100", 17)]),
    "doubled-equals": ("cpu = 4", "cpu = = 4", [("P0100", 16)]),
    "junk-line": ("    cpu = 4\n", "    cpu = 4\n    ]] ))\n", [("P0100", 17)]),
    "list-missing-comma": ('"--data", prep.outputs.data', '"--data" prep.outputs.data',
                           [("P0100", 23)]),
    "list-missing-bracket": ("params.epochs]\n  retry", "params.epochs\n  retry",
                             [("P0100", 25)]),
    "block-written-as-attribute": ("retry { attempts = 2 }", "retry = { attempts = 2 }",
                                   [("P0100", 25)]),
    "param-with-equals": ("epochs: int = 3", "epochs = 3", [("P0100", 6)]),
    # Strings that do not end.
    "unterminated-string": ('"/out/data" }', '"/out/data }', [("P0107", 19)]),
    "unterminated-heredoc": ("  cache = true\n", "  script = <<EOT\n  echo hi\n  cache = true\n",
                             [("P0107", 27)]),
    # Braces: the block that lacks its `}` is found by indentation or by the next block.
    "unclosed-nested-block": ('types = ["A100"] }', 'types = ["A100"]', [("P0103", 17)]),
    "unclosed-stage-before-next": ('  outputs { data = "/out/data" }\n}\n',
                                   '  outputs { data = "/out/data" }\n', [("P0103", 13)]),
    "missing-brace-after-label": ('stage "prep" {', 'stage "prep"', [("P0100", 14)]),
    # Misspelt names: no follow-on "missing" errors for what the misspelt name held.
    "unknown-top-level-block": ('stage "train" {', 'stages "train" {', [("P0207", 22)]),
    "typo-in-defaults": ("  image = ", "  imag = ", [("P0201", 10)]),
    # The top-level words are only keywords where a block starts.
    "keyword-as-map-key": ('outputs { model = "/out/model" }',
                           'outputs { stage = "/out/model" }', []),
}


def test_the_base_file_is_valid() -> None:
    result = loads(BASE, "base.pipe")
    assert result.ok and result.diagnostics == [], render(result.diagnostics)


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_mistake_one_diagnostic(name: str) -> None:
    old, new, expected = CASES[name]
    assert BASE.count(old) == 1, f"{name}: the text to replace must occur once"
    result = loads(BASE.replace(old, new), f"{name}.pipe")
    errors = [(d.code, d.span.line if d.span else 0) for d in result.diagnostics if d.is_error]
    assert errors == expected, render(result.diagnostics)


def test_mistakes_in_several_blocks_are_each_reported_once() -> None:
    text = BASE
    for name in ("missing-value", "unterminated-string", "typo-in-defaults",
                 "block-written-as-attribute", "param-with-equals"):
        old, new, _ = CASES[name]
        text = text.replace(old, new)
    result = loads(text, "several.pipe")
    errors = [(d.code, d.span.line if d.span else 0) for d in result.diagnostics if d.is_error]
    assert errors == [("P0100", 6), ("P0201", 10), ("P0100", 16), ("P0107", 19),
                      ("P0100", 25)], render(result.diagnostics)


def test_concurrent_parses_recover_independently() -> None:
    """The parser keeps each parse's recovery state per parse (an editor server parses many
    files at once): eight threads parsing different broken files concurrently report exactly
    what each reports alone."""
    import threading

    texts = [BASE.replace(old, new) for old, new, _ in CASES.values()]
    alone = [render(loads(text, f"case{i}.pipe").diagnostics) for i, text in enumerate(texts)]
    together: dict[int, list[str]] = {}
    start = threading.Barrier(8)

    errors: list[BaseException] = []

    def work(worker: int) -> None:
        start.wait()
        try:
            for _ in range(3):
                for i in range(worker, len(texts), 8):
                    result = render(loads(texts[i], f"case{i}.pipe").diagnostics)
                    together.setdefault(i, []).append(result)
        except BaseException as exc:  # reported below: a thread's exception is not a failure
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, so parses interleave
    try:
        threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    assert {i: set(results) for i, results in together.items()} == \
        {i: {text} for i, text in enumerate(alone)}
