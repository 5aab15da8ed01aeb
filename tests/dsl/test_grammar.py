"""The grammar is LALR(1) without conflicts or terminal collisions."""

from __future__ import annotations

import lark

from durapipe import grammars


def test_grammar_builds_in_strict_mode() -> None:
    # strict=True turns shift/reduce conflicts and regexp collisions into errors.
    lark.Lark(grammars.read(), parser="lalr", strict=True)


def test_unit_literals_are_single_tokens() -> None:
    parser = lark.Lark(grammars.read(), parser="lalr")
    tokens = [(t.type, str(t)) for t in parser.lex("30s 2e-5 256Gi 8 1h30m")]
    assert tokens == [("UNIT_NUMBER", "30s"), ("NUMBER", "2e-5"), ("UNIT_NUMBER", "256Gi"),
                      ("NUMBER", "8"), ("UNIT_NUMBER", "1h30m")]
