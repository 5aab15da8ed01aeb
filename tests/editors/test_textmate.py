"""The TextMate grammar highlights what the lark grammar lexes.

Every example and every ``.pipe`` case file is tokenised twice: by the terminals of
``durapipe/grammars/pipe.lark`` (with the parser's own rule for when a top-level word is a
keyword) and by ``editors/vscode/syntaxes/pipe.tmLanguage.json`` through vscode-textmate, the
tokenizer VS Code runs.  Each character of a keyword, string, heredoc, duration, quantity,
number and comment must carry the matching TextMate scope, and no character outside such a
token may carry one (a keyword highlighted inside a string, a comment that is not one).
"""

from __future__ import annotations

import re
from pathlib import Path

import lark
import pytest

from durapipe import grammars
from durapipe.dsl import parse_recovery as parser  # the keyword rule lives with recovery
from tests.conftest import REPO_ROOT
from tests.node_tools import run_node
from tests.pipe_files import CASES, EXAMPLES

GRAMMAR = REPO_ROOT / "editors" / "vscode" / "syntaxes" / "pipe.tmLanguage.json"
FILES = [*EXAMPLES, *CASES]

#: Lark terminal -> the class it is highlighted as.
CLASSES = {"STRING": "string", "OPEN_STRING": "string", "HEREDOC": "string",
           "SQ_STRING": "single-quoted", "NUMBER": "number", "COMMENT": "comment",
           "TRUE": "keyword-constant", "FALSE": "keyword-constant"}
#: A class -> what its TextMate scopes contain.
SCOPES = {"keyword": ("keyword.control.block",), "keyword-constant": ("constant.language",),
          "string": ("string.", "punctuation.definition.string"),
          "single-quoted": ("invalid.illegal.single-quoted",),
          "duration": ("constant.numeric.duration",), "quantity": ("constant.numeric.quantity",),
          "number": ("constant.numeric.durapipe",), "comment": ("comment.",)}
_DURATION = re.compile(r"(\d+[smhd])+")


def lark_classes(text: str) -> list[str | None]:
    """The class of every character by lark's terminals (longest match, then priority)."""
    terminals = lark.Lark(grammars.read(), parser="lalr").terminals
    compiled = [(re.compile(term.pattern.to_regexp(), re.MULTILINE), term.priority, term.name)
                for term in terminals]
    classes: list[str | None] = [None] * len(text)
    pos = 0
    while pos < len(text):
        best: tuple[int, int, str] | None = None
        for regex, priority, name in compiled:
            m = regex.match(text, pos)
            if m and m.end() > pos and (best is None or (priority, m.end()) > best[:2]):
                best = (priority, m.end(), name)
        if best is None:
            pos += 1  # a character no terminal takes (P0106): nothing to highlight
            continue
        _, end, name = best
        token = text[pos:end]
        kind = CLASSES.get(name)
        if name == "NAME" and token in parser._KEYWORD_FOLLOWERS \
                and parser._KEYWORD_FOLLOWERS[token].match(text, end):
            kind = "keyword"
        elif name in ("PIPELINE", "STAGE", "PARAMS", "DEFAULTS"):
            follows = parser._KEYWORD_FOLLOWERS[token].match(text, end)
            kind = "keyword" if follows else None
        elif name == "UNIT_NUMBER":
            kind = "duration" if _DURATION.fullmatch(token) else "quantity"
        if kind is not None:
            for i in range(pos, end):
                classes[i] = kind
        pos = end
    return classes


def textmate_classes(text: str, tokens: list[list[object]]) -> list[str | None]:
    starts = [0]
    for line in text.split("\n")[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    classes: list[str | None] = [None] * len(text)
    for line, start, end, scopes in tokens:
        assert isinstance(line, int) and isinstance(start, int) and isinstance(end, int)
        assert isinstance(scopes, list)
        found = None
        for kind, marks in SCOPES.items():
            if any(s.startswith(mark) or f".{mark}" in f".{s}" for s in scopes for mark in marks):
                found = kind
        for i in range(starts[line] + start, starts[line] + end):
            classes[i] = found
    return classes


@pytest.fixture(scope="module")
def tokenised() -> dict[str, object]:
    return run_node("tokenize.mjs", str(GRAMMAR), *(str(p) for p in FILES))


def test_there_are_files_of_every_kind() -> None:
    assert len([p for p in FILES if "examples" in p.parts]) >= 10
    assert len([p for p in FILES if "cases" in p.parts]) >= 40


@pytest.mark.parametrize("path", FILES,
                         ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_highlighting_agrees_with_the_lark_tokens(path: Path,
                                                  tokenised: dict[str, object]) -> None:
    text = path.read_text(encoding="utf-8")
    tokens = tokenised[str(path)]
    assert isinstance(tokens, list)
    want = lark_classes(text)
    got = textmate_classes(text, tokens)
    problems = []
    for i, (w, g) in enumerate(zip(want, got)):
        if w != g and not text[i].isspace():
            line = text.count("\n", 0, i) + 1
            word = re.match(r"\S{1,20}", text[i:])
            problems.append(f"line {line}: {word.group() if word else text[i]!r} is {w} in "
                            f"lark, {g} in TextMate")
            if len(problems) > 5:
                break
    assert problems == []
