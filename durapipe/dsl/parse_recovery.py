"""Syntax-error recovery: the post-lexer that repairs the token stream, and the error handler.

Both work on one parse's state (``ParseState``): the post-lexer restores keywords, drops the
tokens of a member or block the parser cannot make sense of, and inserts a `}` or a value
where one is missing; the error handler reports each mistake and repairs the parser's stack,
so one mistake gives one diagnostic and the rest of the file is still checked.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import lark
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from durapipe.dsl import syntax as st
from durapipe.dsl.diagnostics import Diagnostic, Label, Subject, closest, did_you_mean, error
from durapipe.dsl.source import Source, Span

#: Deepest nesting of blocks and lists (the parser's stack; checked before parsing).
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


class RecoveringPostLexer:
    """Post-lexer that restores keywords and can drop the tokens of a block the parser cannot
    make sense of.

    Its state lives on the object, not in ``process``: lark starts a new ``process`` generator
    each time it resumes after an error, and tokens the contextual lexer rejects never reach
    ``process`` at all (they arrive at the error handler, which passes them to :meth:`skip`).
    """

    def __init__(self, state: ParseState) -> None:
        self.state = state
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
        state = self.state
        if len(state.diagnostics) < MAX_SYNTAX_ERRORS and \
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
        state = self.state
        if len(state.diagnostics) >= MAX_SYNTAX_ERRORS:
            return
        state.diagnostics.append(error(
            "P0107", "unterminated string", span_of(token, state.source),
            "this string is never closed",
            help='add the closing `"` on the same line (use a heredoc for multi-line text)'))
        state.open_string_line = token.line or 0

    def missing_value(self, equal: lark.Token) -> lark.Token:
        """``name =`` at the end of a line whose next line starts another member: report the
        missing value at the `=`, and stand in an empty string spanning the `=` (diagnostics
        about that stand-in are dropped as consequences, see ``validate.drop_consequences``)."""
        state = self.state
        if len(state.diagnostics) < MAX_SYNTAX_ERRORS:
            state.diagnostics.append(error(
                "P0100", "missing value after `=`", span_of(equal, state.source),
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
class ParseState:
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
    #: ``(offset, offset of a `{`)``: put a `}` before the first token at the offset.
    closes: list[tuple[int, int]] = field(default_factory=list)
    skipper: RecoveringPostLexer = field(init=False)

    def __post_init__(self) -> None:
        self.skipper = RecoveringPostLexer(self)
        self.skipper.reset(self.source.text)
        self.skipper.closes = list(self.closes)


# -- error recovery ---------------------------------------------------------------------------


def span_of(token: lark.Token, source: Source) -> Span:
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


def recover(exc: UnexpectedInput, state: ParseState) -> bool:
    """Report ``exc`` and repair the token stream; ``False`` gives up on the file."""
    if len(state.diagnostics) >= MAX_SYNTAX_ERRORS:
        return False
    state.recoveries += 1
    if state.recoveries > MAX_RECOVERIES:
        state.gave_up = True  # what was reported so far stands; the rest is not checked
        return False
    source = state.source
    skipper = state.skipper
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
    span = span_of(token, source)
    diags = state.diagnostics

    if token.type == "$END":
        brace = _innermost_open_brace(ip)
        if "RBRACE" in accepts and brace is not None:
            if not state.unterminated_heredoc:
                diags.append(error(
                    "P0103", "unclosed block: this `{` has no matching `}`",
                    span_of(brace, source), "this `{` is never closed",
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
                span_of(brace, source), "this `{` is never closed",
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
            and _after_block_header(ip) and skipper._first_on_line(token) \
            and _accepts_after(ip, "LBRACE", token):
        # `stage "x"` or `defaults` with the `{` forgotten at the end of the line.
        diags.append(error("P0100", "missing `{`", span, "expected `{` before this",
                           help="a block is written `name { ... }`, the `{` on the line of "
                                "its name"))
        ip.feed_token(lark.Token("LBRACE", "{"))
        ip.feed_token(token)
        return True

    if token.type == "NAME" and "STAGE" in accepts:
        kinds = ["pipeline", "stage", "params", "defaults"]
        hint = did_you_mean(str(token), kinds)
        diags.append(error(
            "P0207", f"unknown top-level block `{token}`", span, "not a top-level block",
            help=hint or "a file holds `pipeline`, `params`, `defaults` and `stage` blocks",
            about=Subject("block", str(token)), suggestion=closest(str(token), kinds)))
        skipper.start_skipping()
        return True

    if token.type == "EQUAL" and "COLON" in accepts:
        diags.append(error("P0100", "a param is declared `name: type = default`", span,
                           "expected `:` and a type", help="for example `epochs: int = 3`"))
        state.last_generic_line = span.line
        _resync(ip, token, skipper)
        return True

    if span.line - state.open_string_line <= 1:
        state.open_string_line = -10  # the unterminated string's consequence, reported once
    elif span.line != state.last_generic_line:
        diags.append(generic_error(exc, state))
    state.last_generic_line = span.line
    _resync(ip, token, skipper)
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


def _resync(ip: Any, token: lark.Token, skipper: RecoveringPostLexer) -> None:
    """Panic-mode recovery after an unexpected ``token``: abandon the member being parsed
    (pop the parser's stack back to the enclosing block, between two members) and resume at
    ``token`` if it can start a new member there, or else at the next token that can, so the
    rest of the file is parsed as written instead of reported as a cascade of errors."""
    popped_braces, popped_brackets, accepts = _pop_to_boundary(ip)
    # Unclosed `{` and `[`/`(` among what is dropped, the offending token included.
    braces = popped_braces + (1 if token.type == "LBRACE" else 0)
    brackets = popped_brackets + (1 if token.type in ("LSQB", "LPAR") else 0)
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


def _recover_characters(exc: UnexpectedCharacters, state: ParseState) -> bool:
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


def generic_error(exc: UnexpectedInput, state: ParseState) -> Diagnostic:
    source = state.source
    if isinstance(exc, UnexpectedToken):
        span = span_of(exc.token, source)
        accepts = set(exc.accepts or exc.expected)
        what = _describe(exc.token)
        what = what.split(" ", 1)[1] if what.startswith(("a ", "an ")) else what
        return error("P0100", f"unexpected {what}", span, "not expected here",
                     help=f"expected one of: {_expected(accepts)}")
    pos = getattr(exc, "pos_in_stream", None)
    pos = len(source.text) if pos is None else min(pos, len(source.text))
    return error("P0100", "syntax error", Span(source, pos, min(pos + 1, len(source.text))),
                 "here")


