"""Text -> syntax tree, with diagnostics: the parser's boundary.

The lark LALR parser is built once per process (under a lock) and is safe to call from
several threads and re-entrantly: each parse owns its state.  This module checks the input
before lark sees it and translates every lark exception; none escapes it.  The parts:

- ``parse_recovery``: syntax errors do not stop parsing; the post-lexer and the error handler
  *repair* the common mistakes (``:`` for ``=``, a missing ``=``, a comma between attributes,
  an unclosed block) by feeding the tokens that were meant, so one mistake gives one
  diagnostic and the rest of the file is still checked;
- ``parse_tree``: lark's tree -> syntax nodes (``durapipe.dsl.syntax``).
"""

from __future__ import annotations

import functools
import itertools
import operator
import os
import re
import threading
from collections.abc import Iterator
from typing import Any

import lark
from lark.exceptions import UnexpectedInput

from durapipe import __version__, grammars
from durapipe.files import user_cache_dir
from durapipe.dsl import syntax as st
from durapipe.dsl.diagnostics import Diagnostic, error
from durapipe.dsl.parse_recovery import (
    MAX_NESTING,
    MAX_SYNTAX_ERRORS as MAX_SYNTAX_ERRORS,  # re-exported: the LSP parses in pieces
    ParseState,
    generic_error,
    recover,
)
from durapipe.dsl.parse_tree import TreeBuilder
from durapipe.dsl.source import MAX_SOURCE_BYTES, Source, Span, utf8_size


class _Parses(threading.local):
    """The parses in progress on this thread, innermost last.

    lark binds its post-lexer and lexer callbacks once, when the parser is built, so they find
    the parse they serve here: per thread (an editor server parses concurrently) and as a
    stack (a parse started while another is in progress, from a callback, is re-entrant).
    """

    def __init__(self) -> None:
        self.stack: list[ParseState] = []


_PARSES = _Parses()
#: Building the parser (and writing lark's cache file) happens once, on one thread.
_BUILD_LOCK = threading.Lock()


def _current() -> ParseState:
    return _PARSES.stack[-1]


class _CurrentPostLexer:
    """The post-lexer lark holds: hands the token stream to the current parse's skipper."""

    always_accept: tuple[str, ...] = ()

    def process(self, stream: Iterator[lark.Token]) -> Iterator[lark.Token]:
        return _current().skipper.process(stream)


def _collect_comment(token: lark.Token) -> lark.Token:
    if _PARSES.stack:
        state = _current()
        state.comments.append(
            st.Comment(Span(state.source, token.start_pos or 0, token.end_pos or 0), str(token))
        )
    return token


def _cache_path() -> str | None:
    """Where the analysed grammar is cached between processes (building it costs ~0.5 s).

    Lark stores a hash of the grammar, the options and its own version in the file and
    rebuilds on any mismatch, so a stale cache is never used.
    """
    if os.environ.get("DURAPIPE_NO_GRAMMAR_CACHE"):
        return None
    directory = user_cache_dir()
    if directory is None:
        return None
    return os.path.join(directory, f"pipe-grammar-{__version__}.lark-cache")


def _parser() -> lark.Lark:
    with _BUILD_LOCK:
        return _build_parser()


@functools.lru_cache(maxsize=1)
def _build_parser() -> lark.Lark:
    options: dict[str, Any] = dict(
        parser="lalr",
        lexer="contextual",
        propagate_positions=False,
        maybe_placeholders=False,
        postlex=_CurrentPostLexer(),
        lexer_callbacks={"COMMENT": _collect_comment},
    )
    cache = _cache_path()
    if cache is not None:
        try:
            return lark.Lark(grammars.read(), cache=cache, **options)
        except Exception:  # an unreadable or foreign cache file: build without it
            pass
    return lark.Lark(grammars.read(), **options)


def parse(source: Source) -> tuple[st.File | None, list[Diagnostic]]:
    """Parse ``source`` into a syntax tree; ``None`` only when nothing usable could be built."""
    pre = _precheck(source)
    if pre is not None:
        return None, [pre]
    file, diagnostics = _parse(source, [])
    if any(d.code == "P0103" for d in diagnostics):
        # A `{` without its `}`: the parser notices only at the end of the enclosing block or
        # file, after reading the following members into the wrong block.  Indentation usually
        # tells which block lacks its `}` and where it ends; parse again with `}` put there.
        closes = _indentation_closes(source)
        if closes:
            return _parse(source, closes)
    return file, diagnostics


def _parse(source: Source, closes: list[tuple[int, int]]) -> tuple[st.File | None,
                                                                   list[Diagnostic]]:
    state = ParseState(source, closes=list(closes))
    parser = _parser()
    _PARSES.stack.append(state)
    try:
        tree = parser.parse(source.text, on_error=lambda e: recover(e, state))
    except UnexpectedInput as exc:
        if len(state.diagnostics) < MAX_SYNTAX_ERRORS and not (state.gave_up
                                                                and state.diagnostics):
            state.diagnostics.append(generic_error(exc, state))
        return None, state.diagnostics
    finally:
        _PARSES.stack.pop()
    builder = TreeBuilder(state)
    file = builder.file(tree)
    return file, state.diagnostics


# -- pre-checks -------------------------------------------------------------------------------


def too_large(source: Source, size: int | None) -> Diagnostic:
    """P0003 for an input over :data:`MAX_SOURCE_BYTES` (of ``size`` bytes, where known), at
    its start, so that it reads ``file:1:1`` as every diagnostic with a place does."""
    limit = f"{MAX_SOURCE_BYTES:,} bytes ({MAX_SOURCE_BYTES >> 20} MiB)"
    message = (f"{source.path} is {size:,} bytes; the limit is {limit}" if size is not None
               else f"{source.path} is larger than the limit of {limit}")
    return error("P0003", message, Span(source, 0, 0), "refused before parsing",
                 help="no pipeline within Argo's limits is this large; split it into several")


def _precheck(source: Source) -> Diagnostic | None:
    text = source.text
    size = utf8_size(text)
    if size > MAX_SOURCE_BYTES:
        return too_large(source, size)
    nul = text.find("\x00")
    if nul != -1:
        return error("P0002", "input contains NUL bytes; is this a binary file?",
                     Span(source, nul, nul + 1), "NUL byte")
    if not _may_nest_too_deep(text):
        return None
    depth = 0
    pos = 0
    unclosed_tags: set[str] = set()
    while (match := _NESTING_SCAN_RE.search(text, pos)) is not None:
        pos = match.end()
        token = match.group()
        tag = match.group("tag")
        if tag is not None:
            # Heredoc bodies are verbatim text (shell scripts): their braces do not nest.
            end = None if tag in unclosed_tags else re.compile(
                rf"^[ \t]*{tag}(?![A-Za-z0-9_])", re.MULTILINE).search(text, pos)
            if end is None:
                unclosed_tags.add(tag)  # the parser reports it; searching again is quadratic
            else:
                pos = end.end()
        elif token in "{[(":
            depth += 1
            if depth > MAX_NESTING:
                return error("P0003", f"blocks and lists are nested more than {MAX_NESTING} deep",
                             Span(source, match.start(), match.end()), "too deep here",
                             help="flatten the structure; no real pipeline nests this deep")
        elif token in "}])":
            depth = max(0, depth - 1)
    return None


# The fast check over-counts (it does not skip heredoc bodies), so it never misses deep nesting;
# the exact scan skips strings, comments and heredoc bodies, in one left-to-right pass.
_STRING_OR_COMMENT_RE = re.compile(r'"(?:[^"\\\n]|\\.)*"|#[^\n]*|//[^\n]*')
_NESTING_SCAN_RE = re.compile(_STRING_OR_COMMENT_RE.pattern
                              + r"|<<-?(?P<tag>[A-Za-z_][A-Za-z0-9_]*)[ \t]*\n|[{\[(]|[}\])]")
_NOT_BRACKET_RE = re.compile(r"[^{}\[\]()]+")
_BRACKET_DELTA = {"{": 1, "[": 1, "(": 1, "}": -1, "]": -1, ")": -1}


def _may_nest_too_deep(text: str) -> bool:
    """Whether brackets outside strings and comments nest more than ``MAX_NESTING`` deep, as
    the exact scan in :func:`_precheck` counts them (a stray closer counts as depth 0), computed
    at C speed: that scan visits every bracket in Python, seconds for a 16 MiB file."""
    if sum(text.count(c) for c in "{[(") <= MAX_NESTING:
        return False
    brackets = _NOT_BRACKET_RE.sub("", _STRING_OR_COMMENT_RE.sub("", text))
    sums = list(itertools.accumulate(map(_BRACKET_DELTA.__getitem__, brackets)))
    # The depth clamped at 0 is the running sum minus the lowest running sum so far (or 0).
    lowest = itertools.islice(itertools.accumulate(sums, min, initial=0), 1, None)
    return max(map(operator.sub, sums, lowest), default=0) > MAX_NESTING


_BRACE_SCAN_RE = re.compile(r'"(?:[^"\\\n]|\\.)*"?|\'[^\'\n]*\'|#[^\n]*|//[^\n]*|[{}]')
_MAX_CLOSES = 10


def _indentation_closes(source: Source) -> list[tuple[int, int]]:
    """Where indentation says a block ends although its `}` is missing: ``(offset before which
    to close it, offset of its `{`)`` pairs, in order.  A `}` that starts a line closes the
    block opened on the last line indented like it; blocks opened on lines indented deeper
    are unclosed and end before the first later line indented no deeper than theirs."""
    text = source.text
    indents: dict[int, int] = {}

    def indent(line: int) -> int:
        if line not in indents:
            row = source.line_text(line)
            indents[line] = len(row) - len(row.lstrip(" \t"))
        return indents[line]

    stack: list[tuple[int, int, int]] = []  # (offset of `{`, its line, that line's indent)
    unclosed: list[tuple[int, int, int]] = []
    for match in _BRACE_SCAN_RE.finditer(text):
        token = match.group()
        if token == "{":
            line = source.line_col(match.start())[0]
            stack.append((match.start(), line, indent(line)))
        elif token == "}":
            line, column = source.line_col(match.start())
            if column - 1 == indent(line):
                while stack and stack[-1][2] > indent(line) and len(unclosed) < _MAX_CLOSES:
                    unclosed.append(stack.pop())
            if stack:
                stack.pop()
    closes = []
    for offset, line, depth in unclosed:
        for later in range(line + 1, source.line_count + 1):
            row = source.line_text(later)
            body = row.lstrip(" \t")
            if body and not body.startswith(("#", "//")) and len(row) - len(body) <= depth:
                closes.append((source.line_offset(later) + len(row) - len(body), offset))
                break
    return sorted(closes)


