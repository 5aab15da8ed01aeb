"""Text -> syntax tree, with diagnostics.

The lark LALR parser is built once per process.  Syntax errors do not stop parsing: an error
handler *repairs* the common mistakes (``:`` for ``=``, a missing ``=``, a comma between
attributes, an unclosed block) by feeding the tokens that were meant, so one mistake gives one
diagnostic and the rest of the file is still checked.  Every lark exception is translated here;
none escapes this module.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import lark
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from durapipe import __version__, grammars
from durapipe.dsl import syntax as st
from durapipe.dsl.diagnostics import Diagnostic, Label, did_you_mean, error
from durapipe.dsl.source import Source, Span

MAX_INPUT_CHARS = 16 * 1024 * 1024
MAX_NESTING = 64
MAX_SYNTAX_ERRORS = 50
#: Repairs (tokens or characters dropped or inserted) before the parser gives up on a file:
#: each costs tens of microseconds, so a huge file of junk must not be repaired byte by byte.
MAX_RECOVERIES = 10_000

TOP_LEVEL_KEYWORDS = ("PIPELINE", "STAGE", "PARAMS", "DEFAULTS")
_VALUE_STARTS = {"STRING", "SQ_STRING", "OPEN_STRING", "HEREDOC", "NUMBER", "UNIT_NUMBER",
                 "TRUE", "FALSE", "LSQB"}
_TOKEN_WORDS = {
    "LBRACE": "`{`", "RBRACE": "`}`", "LSQB": "`[`", "RSQB": "`]`", "LPAR": "`(`", "RPAR": "`)`",
    "EQUAL": "`=`", "COLON": "`:`", "COMMA": "`,`", "DOT": "`.`", "NAME": "a name",
    "STRING": "a string", "SQ_STRING": "a single-quoted string", "OPEN_STRING": "a string",
    "HEREDOC": "a heredoc", "NUMBER": "a number", "UNIT_NUMBER": "a unit literal",
    "TRUE": "`true`", "FALSE": "`false`", "PIPELINE": "`pipeline`", "STAGE": "`stage`",
    "PARAMS": "`params`", "DEFAULTS": "`defaults`", "$END": "end of file",
}


#: A top-level word followed by what starts its block: a label for `pipeline` and `stage`, a
#: brace for `params` and `defaults`.  Inside a block the contextual lexer reads these words as
#: plain names (they are valid map keys), so the post-lexer restores them when they plainly open
#: a new top-level block: that is how an unclosed `{` is reported once, at the brace.
_KEYWORD_FOLLOWERS = {"pipeline": re.compile(r'\s*"'), "stage": re.compile(r'\s*"'),
                      "params": re.compile(r"\s*\{"), "defaults": re.compile(r"\s*\{")}
#: What follows a name that starts a member (`name = `, `name {`, or the mistaken `name:`).
_KEY_FOLLOWERS = re.compile(r"[ \t]*[={:]")


class _Skipper:
    """Post-lexer that restores keywords and can drop the tokens of a block the parser cannot
    make sense of.

    Its state lives on the object, not in ``process``: lark starts a new ``process`` generator
    each time it resumes after an error, and tokens the contextual lexer rejects never reach
    ``process`` at all (they arrive at the error handler, which passes them to :meth:`skip`).
    """

    always_accept: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.skipping = False
        #: Skipping the rest of one member (attribute, block, param) rather than a whole block.
        self.member = False
        #: Unclosed `{` (and, skipping a member, unclosed `[` and `(`) among skipped tokens.
        self.depth = 0
        self.brackets = 0
        self.text = ""

    def reset(self, text: str) -> None:
        self.skipping, self.member, self.depth, self.brackets = False, False, 0, 0
        self.text = text
        #: ``(offset, offset of a `{`)``: put a `}` before the first token at the offset.
        self.closes: list[tuple[int, int]] = []
        #: Tokens read from the lexer and not yet examined, and examined and not yet parsed.
        self.queue: list[lark.Token] = []
        self.ready: list[lark.Token] = []
        self.previous: lark.Token | None = None

    def start_skipping(self) -> None:
        """Drop a whole top-level block: through its closing brace, or to the next keyword."""
        self.skipping, self.member, self.depth = True, False, 0
        self.previous = None

    def start_member_skip(self, braces: int, brackets: int) -> None:
        """Drop the rest of a member the parser could not make sense of, inside ``braces``
        unclosed `{` and ``brackets`` unclosed `[`/`(`, up to the first token of a later line
        that can start a member, the `}` that closes the enclosing block, or a top-level
        keyword; parsing resumes at that token.  A line that plainly starts a member
        (``name =``, ``name {``) ends the skip even inside brackets, since a list missing its
        `]` is a likelier mistake than a list holding ``name = value``."""
        self.skipping, self.member, self.depth, self.brackets = True, True, braces, brackets
        self.previous = None

    def _starts_member(self, token: lark.Token, braces: int, brackets: int) -> bool:
        """Whether ``token``, first on its line, can start a member, given the unclosed
        braces and brackets before it."""
        if braces > 0 or token.type not in ("NAME", "STRING") or not self._first_on_line(token):
            return False
        # A quoted key is always followed by `=` or `{`; a string alone is a list item.
        return (brackets <= 0 and token.type == "NAME"
                or _KEY_FOLLOWERS.match(self.text, token.end_pos or 0) is not None)

    def _first_on_line(self, token: lark.Token) -> bool:
        i = (token.start_pos or 0) - 1
        text = self.text
        while i >= 0 and text[i] in " \t\r\f":
            i -= 1
        return i < 0 or text[i] == "\n"

    def skip(self, token: lark.Token) -> bool:
        """While skipping: ``True`` if ``token`` is dropped, ``False`` if skipping ends at it."""
        if self.member:
            kind = token.type
            if (kind in TOP_LEVEL_KEYWORDS and self._opens_block(token)
                    or kind == "RBRACE" and self.depth <= 0
                    or self._starts_member(token, self.depth, self.brackets)):
                self.skipping, self.member, self.depth, self.brackets = False, False, 0, 0
                return False
            if kind == "LBRACE":
                self.depth += 1
            elif kind == "RBRACE":
                self.depth -= 1
            elif kind in ("LSQB", "LPAR"):
                self.brackets += 1
            elif kind in ("RSQB", "RPAR"):
                self.brackets -= 1
            return True
        # A whole block: up to the next top-level keyword outside braces (a block whose `{`
        # is missing ends with a `}` too many, hence `<= 0`).
        if token.type == "LBRACE":
            self.depth += 1
        elif token.type == "RBRACE":
            self.depth -= 1
        elif self.depth <= 0 and token.type in TOP_LEVEL_KEYWORDS and self._opens_block(token):
            self.skipping, self.depth = False, 0
            return False
        return True

    def _opens_block(self, token: lark.Token) -> bool:
        """Whether a keyword is followed by what starts its block (the top-level lexer state
        reads `params` in a skipped `params.lr` as the keyword)."""
        follow = _KEYWORD_FOLLOWERS.get(str(token))
        return follow is not None and follow.match(self.text, token.end_pos or 0) is not None

    def process(self, stream: Iterator[lark.Token]) -> Iterator[lark.Token]:
        # Tokens wait on the object, not in this generator: after a syntax error lark resumes
        # with a new generator, and a token this one had read but not yet handed over (one
        # after an inserted `}` or stand-in value) must not be lost.
        yield from self._drain()
        for real in stream:
            self.queue.extend(self.closing(real))
            yield from self._drain()

    def _drain(self) -> Iterator[lark.Token]:
        while self.ready or self.queue:
            if self.ready:
                yield self.ready.pop(0)
            else:
                self.ready.extend(self.one(self.queue.pop(0)))

    def closing(self, token: lark.Token) -> list[lark.Token]:
        """``token``, preceded by the `}` that indentation says are missing before it."""
        tokens = []
        while self.closes and token.start_pos is not None \
                and token.start_pos >= self.closes[0][0]:
            before, brace = self.closes.pop(0)
            tokens.append(self.missing_close(before, brace))
        tokens.append(token)
        return tokens

    def missing_close(self, before: int, brace: int) -> lark.Token:
        state = _Holder.state
        if state is not None and len(state.diagnostics) < MAX_SYNTAX_ERRORS and \
                state.source.line_col(brace)[0] != state.open_string_line:
            # (An unterminated string that ate the `}` is the one mistake to report.)
            source = state.source
            line = source.line_col(before)[0]
            state.diagnostics.append(error(
                "P0103", "unclosed block: this `{` has no matching `}`",
                Span(source, brace, brace + 1), "this `{` is never closed",
                extra=(Label(Span(source, before, before), "the block seems to end before "
                             "this line, judging by indentation"),),
                help=f"add `}}` before line {line}"))
        return lark.Token("RBRACE", "}", start_pos=before, end_pos=before)

    def one(self, token: lark.Token) -> list[lark.Token]:
        """What the parser gets for one token: nothing (skipped), the token, or a stand-in
        for a missing value and then the token."""
        token = self.keyword(token)
        if self.skipping and self.skip(token):
            return []
        if token.type == "OPEN_STRING":
            self.open_string(token)
        previous, self.previous = self.previous, token
        if (previous is not None and previous.type == "EQUAL" and token.type == "NAME"
                and token.end_pos is not None and self._first_on_line(token)
                and _KEY_FOLLOWERS.match(self.text, token.end_pos)):
            return [self.missing_value(previous), token]
        return [token]

    def open_string(self, token: lark.Token) -> None:
        """Report an unterminated string when it is read, so that it is reported even when
        the member holding it is abandoned by error recovery (it ate the rest of its line,
        closing brackets included, so the next syntax error is usually its consequence)."""
        state = _Holder.state
        if state is None or len(state.diagnostics) >= MAX_SYNTAX_ERRORS:
            return
        state.diagnostics.append(error(
            "P0107", "unterminated string", _span_of(token, state.source),
            "this string is never closed",
            help='add the closing `"` on the same line (use a heredoc for multi-line text)'))
        state.open_string_line = token.line or 0

    def missing_value(self, equal: lark.Token) -> lark.Token:
        """``name =`` at the end of a line whose next line starts another member: report the
        missing value at the `=`, and stand in an empty string spanning the `=` (diagnostics
        about that stand-in are dropped as consequences, see ``validate.drop_consequences``)."""
        state = _Holder.state
        if state is not None and len(state.diagnostics) < MAX_SYNTAX_ERRORS:
            state.diagnostics.append(error(
                "P0100", "missing value after `=`", _span_of(equal, state.source),
                "expected a value after this `=`",
                help="write the value on the same line, e.g. `memory = 32Gi`"))
        return lark.Token.new_borrow_pos("STRING", '""', equal)

    def keyword(self, token: lark.Token) -> lark.Token:
        follow = _KEYWORD_FOLLOWERS.get(str(token)) if token.type == "NAME" else None
        if follow is not None and token.end_pos is not None \
                and follow.match(self.text, token.end_pos):
            return lark.Token.new_borrow_pos(str(token).upper(), str(token), token)
        return token


@dataclass
class _ParseState:
    source: Source
    diagnostics: list[Diagnostic] = field(default_factory=list)
    comments: list[st.Comment] = field(default_factory=list)
    last_generic_line: int = -1
    last_char_error_end: int = -1
    unterminated_heredoc: bool = False
    recoveries: int = 0
    gave_up: bool = False
    #: Line of the last unterminated string; a syntax error on it or the next line follows.
    open_string_line: int = -10


class _Holder:
    """The parse in progress; lark's callbacks are bound once, when the parser is built."""

    state: _ParseState | None = None
    skipper = _Skipper()


def _collect_comment(token: lark.Token) -> lark.Token:
    state = _Holder.state
    if state is not None:
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
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = os.path.join(base, "durapipe")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError:
        return None
    return os.path.join(directory, f"pipe-grammar-{__version__}.lark-cache")


@functools.lru_cache(maxsize=1)
def _parser() -> lark.Lark:
    options: dict[str, Any] = dict(
        parser="lalr",
        lexer="contextual",
        propagate_positions=False,
        maybe_placeholders=False,
        postlex=_Holder.skipper,
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
    state = _ParseState(source)
    _Holder.state = state
    _Holder.skipper.reset(source.text)
    _Holder.skipper.closes = list(closes)
    try:
        tree = _parser().parse(source.text, on_error=lambda e: _recover(e, state))
    except UnexpectedInput as exc:
        if len(state.diagnostics) < MAX_SYNTAX_ERRORS and not (state.gave_up
                                                                and state.diagnostics):
            state.diagnostics.append(_generic(exc, state))
        return None, state.diagnostics
    finally:
        _Holder.state = None
        _Holder.skipper.reset("")
    builder = _TreeBuilder(state)
    file = builder.file(tree)
    return file, state.diagnostics


# -- pre-checks -------------------------------------------------------------------------------


def _precheck(source: Source) -> Diagnostic | None:
    text = source.text
    if len(text) > MAX_INPUT_CHARS:
        return error("P0003", f"input is {len(text)} characters; the limit is {MAX_INPUT_CHARS}",
                     Span(source, 0, 0), help="split the pipeline into smaller files")
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


# -- error recovery ---------------------------------------------------------------------------


def _span_of(token: lark.Token, source: Source) -> Span:
    start = token.start_pos if token.start_pos is not None else len(source.text)
    end = token.end_pos if token.end_pos is not None else start
    return Span(source, start, max(end, start))


def _describe(token: lark.Token) -> str:
    if token.type == "$END":
        return "end of file"
    if token.type in ("NAME", "NUMBER", "UNIT_NUMBER"):
        return f"`{token}`"
    return _TOKEN_WORDS.get(token.type, f"`{token}`")


def _expected(accepts: set[str]) -> str:
    words = sorted({_TOKEN_WORDS.get(a, a) for a in accepts if not a.startswith("__")})
    return ", ".join(words)


def _innermost_open_brace(ip: Any) -> lark.Token | None:
    for value in reversed(ip.parser_state.value_stack):
        if isinstance(value, lark.Token) and value.type == "LBRACE":
            return value
    return None


def _close_open_blocks(ip: Any, until: set[str]) -> None:
    for _ in range(MAX_NESTING + 2):
        if ip.accepts() & until or "RBRACE" not in ip.accepts():
            return
        ip.feed_token(lark.Token("RBRACE", "}"))


def _recover(exc: UnexpectedInput, state: _ParseState) -> bool:
    """Report ``exc`` and repair the token stream; ``False`` gives up on the file."""
    if len(state.diagnostics) >= MAX_SYNTAX_ERRORS:
        return False
    state.recoveries += 1
    if state.recoveries > MAX_RECOVERIES:
        state.gave_up = True  # what was reported so far stands; the rest is not checked
        return False
    source = state.source
    skipper = _Holder.skipper
    if isinstance(exc, UnexpectedCharacters):
        # Junk inside a block that is being skipped was reported with the block already.
        return True if skipper.skipping else _recover_characters(exc, state)
    if not isinstance(exc, UnexpectedToken):
        return False
    token, ip = exc.token, exc.interactive_parser
    # The contextual lexer rejected a token of a skipped block before the post-lexer saw it;
    # drop it too.  A top-level keyword ends the skip and is recovered from below.
    if skipper.skipping and token.type != "$END" and skipper.skip(token):
        return True
    accepts: set[str] = set(exc.accepts or exc.expected)
    span = _span_of(token, source)
    diags = state.diagnostics

    if token.type == "$END":
        brace = _innermost_open_brace(ip)
        if "RBRACE" in accepts and brace is not None:
            if not state.unterminated_heredoc:
                diags.append(error(
                    "P0103", "unclosed block: this `{` has no matching `}`",
                    _span_of(brace, source), "this `{` is never closed",
                    extra=(Label(span, "the file ends here"),),
                    help="add `}` at the end of the block"))
            _close_open_blocks(ip, {"$END"})
            return True
        return False

    if token.type in TOP_LEVEL_KEYWORDS and _innermost_open_brace(ip) is not None:
        if "RBRACE" not in accepts:
            _pop_to_boundary(ip)  # a member left half-written before the new block
        brace = _innermost_open_brace(ip)
        if brace is not None:
            diags.append(error(
                "P0103", "unclosed block: this `{` has no matching `}`",
                _span_of(brace, source), "this `{` is never closed",
                extra=(Label(span, f"a new `{token}` block starts here"),),
                help=f"add `}}` before line {span.line}"))
        _close_open_blocks(ip, set(TOP_LEVEL_KEYWORDS))
        ip.feed_token(token)
        return True

    if token.type == "COLON" and "EQUAL" in accepts:
        diags.append(error("P0101", "expected `=` after the attribute name, found `:`", span,
                           "use `=` here", help="attributes are written `name = value`; "
                           "only `params` declarations use `name: type`"))
        ip.feed_token(lark.Token("EQUAL", "="))
        return True

    if token.type in _VALUE_STARTS and "EQUAL" in accepts:
        diags.append(error("P0102", f"missing `=` before {_describe(token)}", span,
                           "expected `=` before this value",
                           help="attributes are written `name = value`"))
        ip.feed_token(lark.Token("EQUAL", "="))
        ip.feed_token(token)
        return True

    if token.type == "COMMA" and "RBRACE" in accepts and "RSQB" not in accepts \
            and _MEMBER_AHEAD.match(source.text, token.end_pos or 0):
        diags.append(error("P0104", "commas do not separate attributes", span, "remove this `,`",
                           help="put attributes on separate lines, or separate them with spaces"))
        return True

    if "LBRACE" in accepts and token.type not in ("LBRACE", "$END") \
            and _after_block_header(ip) and _Holder.skipper._first_on_line(token) \
            and _accepts_after(ip, "LBRACE", token):
        # `stage "x"` or `defaults` with the `{` forgotten at the end of the line.
        diags.append(error("P0100", "missing `{`", span, "expected `{` before this",
                           help="a block is written `name { ... }`, the `{` on the line of "
                                "its name"))
        ip.feed_token(lark.Token("LBRACE", "{"))
        ip.feed_token(token)
        return True

    if token.type == "NAME" and "STAGE" in accepts:
        hint = did_you_mean(str(token), ["pipeline", "stage", "params", "defaults"])
        diags.append(error(
            "P0207", f"unknown top-level block `{token}`", span, "not a top-level block",
            help=hint or "a file holds `pipeline`, `params`, `defaults` and `stage` blocks"))
        _Holder.skipper.start_skipping()
        return True

    if token.type == "EQUAL" and "COLON" in accepts:
        diags.append(error("P0100", "a param is declared `name: type = default`", span,
                           "expected `:` and a type", help="for example `epochs: int = 3`"))
        state.last_generic_line = span.line
        _resync(ip, token)
        return True

    if span.line - state.open_string_line <= 1:
        state.open_string_line = -10  # the unterminated string's consequence, reported once
    elif span.line != state.last_generic_line:
        diags.append(_generic(exc, state))
    state.last_generic_line = span.line
    _resync(ip, token)
    return True


_OPENERS = ("LBRACE", "LSQB", "LPAR")


def _after_block_header(ip: Any) -> bool:
    """Whether the parser just read a top-level block's header (`stage "x"`, `defaults`)."""
    stack = ip.parser_state.value_stack
    top = stack[-1] if stack else None
    keyword = stack[-2] if len(stack) > 1 else None  # before the label
    return (isinstance(top, lark.Token) and top.type in ("PARAMS", "DEFAULTS")
            or isinstance(keyword, lark.Token) and keyword.type in ("STAGE", "PIPELINE"))


def _accepts_after(ip: Any, inserted: str, token: lark.Token) -> bool:
    """Whether the parser would take ``token`` after an ``inserted`` token."""
    trial = ip.copy()
    try:
        trial.feed_token(lark.Token(inserted, ""))
    except UnexpectedInput:
        return False
    return token.type in trial.accepts()
#: A comma is "between attributes" when a member follows it (else a list lost its `[`).
_MEMBER_AHEAD = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_-]*|"(?:[^"\\\n]|\\.)*")\s*[={]')
#: A state that accepts one of these is inside a value (a reference that may go on with `.`
#: or become a call, a list or call's items), not between two members.
_INSIDE_VALUE = {"DOT", "LPAR", "COMMA", "RSQB", "RPAR"}


def _pop_to_boundary(ip: Any) -> tuple[int, int, set[str]]:
    """Pop the parser's stack back to a state between two members (or top-level blocks);
    return the unclosed `{` and `[`/`(` popped, and what the parser accepts then."""
    ps = ip.parser_state
    braces = brackets = 0
    accepts: set[str] = ip.accepts()
    while len(ps.state_stack) > 1 and "STAGE" not in accepts and (
            "RBRACE" not in accepts or accepts & _INSIDE_VALUE):
        ps.state_stack.pop()
        value = ps.value_stack.pop()
        if isinstance(value, lark.Token) and value.type == "LBRACE":
            braces += 1
        elif isinstance(value, lark.Token) and value.type in ("LSQB", "LPAR"):
            brackets += 1
        accepts = ip.accepts()
    return braces, brackets, accepts


def _resync(ip: Any, token: lark.Token) -> None:
    """Panic-mode recovery after an unexpected ``token``: abandon the member being parsed
    (pop the parser's stack back to the enclosing block, between two members) and resume at
    ``token`` if it can start a new member there, or else at the next token that can, so the
    rest of the file is parsed as written instead of reported as a cascade of errors."""
    popped_braces, popped_brackets, accepts = _pop_to_boundary(ip)
    # Unclosed `{` and `[`/`(` among what is dropped, the offending token included.
    braces = popped_braces + (1 if token.type == "LBRACE" else 0)
    brackets = popped_brackets + (1 if token.type in ("LSQB", "LPAR") else 0)
    skipper = _Holder.skipper
    if "STAGE" in accepts and "RBRACE" not in accepts:
        # Between top-level blocks: drop tokens up to the next block.
        skipper.start_skipping()
        skipper.depth = braces
        return
    skipper.previous = None  # what the parser saw last was just undone
    if token.type in accepts and (token.type in TOP_LEVEL_KEYWORDS or token.type == "RBRACE"
                                  or skipper._starts_member(token, braces, brackets)):
        ip.feed_token(token)
        return
    skipper.start_member_skip(braces, brackets)


def _recover_characters(exc: UnexpectedCharacters, state: _ParseState) -> bool:
    source = state.source
    pos: int = exc.pos_in_stream if exc.pos_in_stream is not None else len(source.text)
    char = source.text[pos] if pos < len(source.text) else ""
    if pos == state.last_char_error_end and state.diagnostics:
        # Extend the previous diagnostic over a run of junk rather than report each byte.
        last = state.diagnostics[-1]
        first = last.labels[0]
        state.diagnostics[-1] = Diagnostic(
            last.code, last.message, (Label(Span(source, first.span.start, pos + 1),
                                            first.message),), last.help, last.notes)
        state.last_char_error_end = pos + 1
        return True
    span = Span(source, pos, pos + 1)
    if source.text.startswith("<<", pos):
        state.unterminated_heredoc = True
        state.diagnostics.append(error(
            "P0107", "unterminated heredoc", Span(source, pos, source.text.find("\n", pos)
                                                  if "\n" in source.text[pos:] else pos + 2),
            "this heredoc has no closing tag",
            help="end it with a line holding only its tag, e.g. `EOT`"))
        state.gave_up = True  # the rest of the file is the heredoc's body: nothing to add
        return False
    printable = char if char.isprintable() else f"U+{ord(char):04X}" if char else "?"
    state.diagnostics.append(error(
        "P0106", f"unexpected character `{printable}`", span, "not valid here",
        help="remove it" + ("; statements need no `;`" if char == ";" else "")))
    state.last_char_error_end = pos + 1
    return True


def _generic(exc: UnexpectedInput, state: _ParseState) -> Diagnostic:
    source = state.source
    if isinstance(exc, UnexpectedToken):
        span = _span_of(exc.token, source)
        accepts = set(exc.accepts or exc.expected)
        what = _describe(exc.token)
        what = what.split(" ", 1)[1] if what.startswith(("a ", "an ")) else what
        return error("P0100", f"unexpected {what}", span, "not expected here",
                     help=f"expected one of: {_expected(accepts)}")
    pos = getattr(exc, "pos_in_stream", None)
    pos = len(source.text) if pos is None else min(pos, len(source.text))
    return error("P0100", "syntax error", Span(source, pos, min(pos + 1, len(source.text))),
                 "here")


# -- tree -> syntax nodes ---------------------------------------------------------------------

_ESCAPES = {"\\": "\\", '"': '"', "n": "\n", "t": "\t", "r": "\r"}
_SPECIAL_RE = re.compile(r"[\\$]")
_REF_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*")


class _TreeBuilder:
    def __init__(self, state: _ParseState):
        self.state = state
        self.source = state.source

    def span(self, start: int, end: int) -> Span:
        return Span(self.source, start, end)

    def tok_span(self, token: lark.Token) -> Span:
        return _span_of(token, self.source)

    def file(self, tree: lark.Tree[lark.Token]) -> st.File:
        items: list[st.TopLevel] = []
        for child in tree.children:
            if not isinstance(child, lark.Tree):
                continue
            if child.data == "params":
                items.append(self.params(child))
            else:
                items.append(self.top_block(child))
        return st.File(self.source, items, sorted(self.state.comments, key=lambda c: c.span.start))

    def _extent(self, node: lark.Tree[lark.Token] | lark.Token) -> tuple[int, int]:
        """The characters a node covers; tokens invented by error repair have no position."""
        if isinstance(node, lark.Token):
            if node.start_pos is None:
                return -1, -1
            return node.start_pos, node.end_pos if node.end_pos is not None else node.start_pos
        starts, ends = [], []
        for child in node.children:
            if isinstance(child, (lark.Tree, lark.Token)):
                s, e = self._extent(child)
                if s >= 0:
                    starts.append(s)
                    ends.append(e)
        if not starts:
            return -1, -1
        return min(starts), max(ends)

    def top_block(self, tree: lark.Tree[lark.Token]) -> st.Block:
        keyword = tree.children[0]
        assert isinstance(keyword, lark.Token)
        label = None
        rest = tree.children[1:]
        if rest and isinstance(rest[0], lark.Tree) and rest[0].data == "label":
            label_value = self.value(rest[0].children[0])
            if isinstance(label_value, st.StrValue):
                label = label_value
            rest = rest[1:]
        body = rest[0]
        assert isinstance(body, lark.Tree)
        block = self.body(str(keyword), self.tok_span(keyword), body, quoted=False)
        block.label = label
        block.span = self.span(keyword.start_pos or 0, block.span.end)
        return block

    def body(self, name: str, name_span: Span, body: lark.Tree[lark.Token],
             quoted: bool) -> st.Block:
        tokens = [c for c in body.children if isinstance(c, lark.Token)]
        open_tok = tokens[0]
        close = tokens[-1] if len(tokens) > 1 else None
        end = (close.end_pos if close is not None and close.end_pos is not None
               else self._extent(body)[1])
        end = max(end, name_span.end)
        block = st.Block(self.span(name_span.start, end), name, name_span,
                         self.tok_span(open_tok), quoted_key=quoted)
        for member in body.children:
            if isinstance(member, lark.Tree):
                block.members.append(self.member(member))
        return block

    def key(self, tree: lark.Tree[lark.Token]) -> tuple[str, Span, bool]:
        token = tree.children[0]
        assert isinstance(token, lark.Token)
        if token.type == "STRING":
            parts = self.string_parts(token)
            return "".join(p for p in parts if isinstance(p, str)), self.tok_span(token), True
        return str(token), self.tok_span(token), False

    def member(self, tree: lark.Tree[lark.Token]) -> st.Attribute | st.Block:
        key_tree = tree.children[0]
        assert isinstance(key_tree, lark.Tree)
        name, name_span, quoted = self.key(key_tree)
        if tree.data == "block":
            body = tree.children[1]
            assert isinstance(body, lark.Tree)
            return self.body(name, name_span, body, quoted)
        value = self.value(tree.children[2])
        return st.Attribute(self.span(name_span.start, value.span.end), name, name_span, value,
                            quoted)

    def params(self, tree: lark.Tree[lark.Token]) -> st.ParamsBlock:
        keyword = tree.children[0]
        assert isinstance(keyword, lark.Token)
        decls = []
        for child in tree.children:
            if isinstance(child, lark.Tree) and child.data == "param":
                name, _colon, type_tok, *rest = child.children
                assert isinstance(name, lark.Token) and isinstance(type_tok, lark.Token)
                default = self.value(rest[1]) if len(rest) == 2 else None
                end = default.span.end if default else (type_tok.end_pos or 0)
                decls.append(st.ParamDecl(self.span(name.start_pos or 0, end), str(name),
                                          self.tok_span(name), str(type_tok),
                                          self.tok_span(type_tok), default))
        start, end = self._extent(tree)
        return st.ParamsBlock(self.span(max(start, 0), max(end, 0)), self.tok_span(keyword), decls)

    def value(self, node: lark.Tree[lark.Token] | lark.Token) -> st.Value:
        if isinstance(node, lark.Token):  # pragma: no cover - every value is a tree
            raise TypeError(node)
        kind = node.data
        children = node.children
        start, end = self._extent(node)
        span = self.span(max(start, 0), max(end, 0))
        first = children[0] if children else None
        if kind == "string":
            assert isinstance(first, lark.Token)
            return st.StrValue(span, self.string_parts(first))
        if kind == "sq_string":
            assert isinstance(first, lark.Token)
            self.state.diagnostics.append(error(
                "P0105", "strings use double quotes", span, "single-quoted",
                help=f'write "{str(first)[1:-1]}"'))
            return st.StrValue(span, [str(first)[1:-1]])
        if kind == "open_string":  # reported by the post-lexer (_Skipper.open_string)
            assert isinstance(first, lark.Token)
            return st.StrValue(span, [str(first)[1:]])
        if kind == "heredoc":
            assert isinstance(first, lark.Token)
            return self.heredoc(first, span)
        if kind == "number":
            raw = str(first)
            number: int | float = float(raw) if any(c in raw for c in ".eE") else int(raw)
            # An int beyond a float's range (309+ digits) cannot reach math.isinf.
            if (math.isinf(number) if isinstance(number, float)
                    else abs(number) > sys.float_info.max):
                self.state.diagnostics.append(error(
                    "P0111", f"the number `{raw}` is too large", span, "reads as infinity",
                    help="write the value you mean; sizes and durations take units (1Ti, 7d)"))
                number = 0
            return st.NumberValue(span, number, raw)
        if kind == "unit":
            return st.UnitValue(span, str(first))
        if kind in ("true", "false"):
            return st.BoolValue(span, kind == "true")
        if kind == "list":
            items = [self.value(c) for c in children if isinstance(c, lark.Tree)]
            return st.ListValue(span, items)
        if kind == "call":
            assert isinstance(first, lark.Token)
            args = [self.value(c) for c in children if isinstance(c, lark.Tree)]
            return st.CallValue(span, str(first), self.tok_span(first), args)
        if kind == "ref":
            path = tuple(str(c) for c in children
                         if isinstance(c, lark.Token) and c.type == "NAME")
            return st.RefValue(span, path)
        raise TypeError(f"unknown value node {kind}")  # pragma: no cover - grammar is closed

    def heredoc(self, token: lark.Token, span: Span) -> st.StrValue:
        text = str(token)
        header, _, rest = text.partition("\n")
        indented = header.startswith("<<-")
        tag = header[3:].strip() if indented else header[2:].strip()
        lines = rest.split("\n")[:-1]  # the last line holds the closing tag
        if indented:
            widths = [len(ln) - len(ln.lstrip(" \t")) for ln in lines if ln.strip()]
            cut = min(widths, default=0)
            lines = [ln[cut:] for ln in lines]
        body = "".join(ln + "\n" for ln in lines)
        return st.StrValue(span, [body], heredoc=True, tag=("-" if indented else "") + tag)

    def string_parts(self, token: lark.Token) -> list[str | st.RefValue]:
        """Decode escapes and split ``${ref}`` interpolations of a double-quoted string."""
        raw = str(token)
        base = (token.start_pos or 0) + 1
        inner = raw[1:-1]
        parts: list[str | st.RefValue] = []
        buf: list[str] = []
        i = 0
        while i < len(inner):
            ch = inner[i]
            if ch == "\\":
                nxt = inner[i + 1] if i + 1 < len(inner) else ""
                if nxt in _ESCAPES:
                    buf.append(_ESCAPES[nxt])
                    i += 2
                    continue
                if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", inner[i + 2:i + 6]):
                    buf.append(chr(int(inner[i + 2:i + 6], 16)))
                    i += 6
                    continue
                self.state.diagnostics.append(error(
                    "P0110", f"invalid escape sequence `\\{nxt}`",
                    self.span(base + i, base + i + 2), "not a known escape",
                    help="write `\\\\` for a backslash"))
                buf.append(nxt)
                i += 2
                continue
            if inner.startswith("$${", i):
                buf.append("${")
                i += 3
                continue
            if inner.startswith("${", i):
                close = inner.find("}", i + 2)
                body = inner[i + 2:close] if close != -1 else ""
                span = self.span(base + i, base + (close + 1 if close != -1 else len(inner)))
                if close == -1 or not _REF_RE.fullmatch(body.strip()):
                    self.state.diagnostics.append(error(
                        "P0108", "`${...}` must hold one reference such as `params.lr`",
                        span, "invalid interpolation",
                        help="write `$${` for a literal `${`"))
                    buf.append(inner[i:close + 1] if close != -1 else inner[i:])
                    i = close + 1 if close != -1 else len(inner)
                    continue
                if buf:
                    parts.append("".join(buf))
                    buf = []
                parts.append(st.RefValue(span, tuple(body.strip().split("."))))
                i = close + 1
                continue
            # Plain text up to the next `\\` or `$`, in one step (strings can be megabytes).
            match = _SPECIAL_RE.search(inner, i + 1)
            nxt_special = match.start() if match else len(inner)
            buf.append(inner[i:nxt_special])
            i = nxt_special
        if buf or not parts:
            parts.append("".join(buf))
        return parts
