"""``durapipe fmt``: print a ``.pipe`` file in its one canonical layout.

The formatter works from the syntax tree (:mod:`durapipe.dsl.syntax`) and the comments the
parser collected; it never edits the text in place.  A file with syntax errors is never
formatted: :func:`format_source` returns ``None`` and the parser's diagnostics.

The layout, rule by rule:

* Indentation is two spaces per level; the output ends with exactly one newline (an empty
  input, or one holding only whitespace, gives ``""``).
* Top-level blocks (``pipeline``, ``params``, ``defaults``, ``stage``) keep their order and
  are separated by exactly one blank line.  A top-level block is never written on one line,
  except an empty one (``defaults {}``).
* Inside blocks, one member per line.  Blank lines between members are kept, but any run of
  blank lines becomes one; blank lines right after ``{`` or before ``}`` are dropped.
* ``=`` is aligned within a *run* of consecutive attributes.  A run is broken by a blank line,
  an own-line comment and a nested block; a trailing comment or a multi-line value (a long
  list, a heredoc) does not break it.  In ``params``, ``name: type`` is padded the same way so
  that the ``=`` of the defaults align.
* **One-line blocks** (deterministic rule): a nested block is printed on one line,
  ``resources { cpu = 8  memory = 32Gi }`` (members separated by two spaces), exactly when

  1. it was already written on one line (its ``{`` and ``}`` on the same source line),
  2. it has at least one member and every member is an attribute (no nested block),
  3. every value is a scalar (string, number, unit literal, boolean, reference, or a call whose
     arguments are scalars) or a list of scalars (no heredoc, no nested list),
  4. no comment lies between its braces, and
  5. the line, indentation included, fits in 100 columns.

  Otherwise it is expanded, one member per line.  The rule only keeps a one-line block one-line;
  it never joins a block the author expanded.  An empty block is always ``name {}``.
* Lists (and call arguments) are printed on one line, ``[a, b, c]``, when they hold no heredoc
  and no comment and the whole line fits in 100 columns (trailing comments not counted);
  otherwise one item per line, each followed by a comma, the closing bracket on its own line
  at the indentation of the line that opened it.
* Strings are double-quoted and re-escaped canonically: ``\\\\``, ``\\"``, ``\\n``, ``\\t``,
  ``\\r``; other control characters, lone surrogates and U+2028/U+2029 as ``\\uXXXX``;
  everything else (Unicode included) is written as itself.  ``${a.b}`` interpolations are
  written as ``${a.b}`` (spaces inside the braces dropped), a literal ``${`` as ``$${``, and a
  literal ``$`` right before an interpolation as ``\\u0024``.
* Heredocs are written ``<<-TAG`` with the body indented one level deeper than the line that
  holds the attribute and the closing tag at the same indentation as the body.  The author's
  tag is kept (it is always safe, since it closed the original heredoc); ``EOT`` (then
  ``EOT1``, ``EOT2``, ...) is chosen only if it would not be.  A body whose every non-blank line
  starts with a space or tab cannot be written ``<<-`` (its indentation would be stripped), so
  it is written ``<<TAG`` with the body verbatim.
* Numbers and unit literals are written as they were (``2e-5``, ``1.5Gi``).  References are
  written ``a.b.c``.  Call arguments are separated by ``", "``.
* Keys are written bare when they are a valid NAME, and quoted (re-escaped) otherwise, or when
  they are one of the words ``pipeline stage params defaults true false``.
* Comments are kept, in order, with their text (trailing whitespace removed, a leading ``//``
  written ``#``).

  - An own-line comment stays on its own line before the member that follows it; at the end of
    a block, list or file it stays there.
  - A trailing comment stays at the end of its line, two spaces after the code: after a
    member, after the ``,`` of a list item, after the ``}`` of a block, after the closing tag
    of a heredoc, or after an opening ``{``, ``[`` or ``(``.  Trailing comments of the one-line
    members of an alignment run are aligned, two spaces after the longest such line.
  - A comment inside a list or a call puts it on several lines; inside a block, it keeps the
    block from being written on one line.
  - A comment in an odd place inside a member (between a key and ``=``, between ``stage "x"``
    and ``{``, between a call's name and ``(``, around the ``.`` of a reference) moves onto its
    own line before that member.
  - When several comments trail the same item (``"a" # one`` then ``, # two`` on the next
    line), or a trailing comment follows an own-line one before the next item, the later ones
    go on their own lines, in their original order.

Formatting is idempotent, and it never changes meaning: the output parses to the same syntax
tree (spans, comment positions, key quoting and heredoc tags aside), hence the same model and
diagnostics.  :func:`format_source` re-parses its output and checks this before returning it.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from durapipe.dsl import parser
from durapipe.dsl import syntax as st
from durapipe.dsl.diagnostics import Diagnostic
from durapipe.dsl.source import Source

__all__ = ["MAX_WIDTH", "FormatterError", "format_file", "format_source", "is_formatted",
           "render_string", "syntax_shape"]

#: Lines longer than this are broken where the layout allows (lists and calls).
MAX_WIDTH = 100
_INDENT = "  "
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
#: Words that are keywords somewhere in the grammar; a key spelled like one stays quoted.
_RESERVED = frozenset({"pipeline", "stage", "params", "defaults", "true", "false"})
_TAG_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})
_WHITESPACE = " \t\r\n\f"

_Container = st.File | st.Block | st.ParamsBlock | st.ListValue | st.CallValue
_Item = st.Block | st.ParamsBlock | st.Attribute | st.ParamDecl | st.Value


class FormatterError(RuntimeError):
    """The formatter produced text that does not mean what its input meant (a bug in fmt).

    Raised instead of returning wrong text; the file should be left untouched.
    """


@dataclass
class _Note:
    """A comment the formatter places on its own line."""

    pos: int
    text: str
    blank_before: bool


# -- public API -------------------------------------------------------------------------------


def format_source(text: str, path: str = "<input>", *,
                  verify: bool = True) -> tuple[str | None, list[Diagnostic]]:
    """Format ``.pipe`` text.

    Returns ``(formatted, diagnostics)``; ``formatted`` is ``None`` when the text has syntax
    errors (then ``diagnostics`` holds them and the file must be left as it is).  Schema and
    semantic problems (an unknown attribute, a cycle) do not stop formatting and are not
    reported here; ``durapipe check`` reports them.

    With ``verify`` (the default) the output is parsed again and compared with the input's
    tree; :class:`FormatterError` is raised if they differ (a bug in the formatter, never
    expected), so that a caller never writes text that means something else.
    """
    syntax, diagnostics = parser.parse(Source(path, text))
    if syntax is None or any(d.is_error for d in diagnostics):
        return None, diagnostics
    out = format_file(syntax)
    if not verify:
        return out, diagnostics
    again, again_diagnostics = parser.parse(Source(path, out))
    if again is None or any(d.is_error for d in again_diagnostics):
        raise FormatterError(f"{path}: the formatted text does not parse; leaving it unchanged")
    if syntax_shape(again) != syntax_shape(syntax):
        raise FormatterError(f"{path}: formatting would change the meaning; leaving it unchanged")
    return out, diagnostics


def is_formatted(text: str, path: str = "<input>") -> bool | None:
    """Whether ``text`` is already in canonical layout; ``None`` when it has syntax errors."""
    out, _ = format_source(text, path)
    return None if out is None else out == text


def format_file(file: st.File) -> str:
    """The canonical text of a parsed file (which should have no syntax errors)."""
    return _Formatter(file).run()


def syntax_shape(file: st.File) -> object:
    """What a file means at the syntax level, without spans, layout or comment positions.

    Two files with equal shapes convert to the same model with the same diagnostics (up to
    source positions).  The comment texts are included, in order, so that comments are kept.
    """
    return (tuple(_shape_item(item) for item in file.items),
            tuple(_comment_text(c.text) for c in file.comments))


def _shape_item(node: st.TopLevel | st.Attribute | st.Block) -> object:
    if isinstance(node, st.ParamsBlock):
        return ("params", tuple((p.name, p.type, None if p.default is None
                                 else _shape_value(p.default)) for p in node.params))
    if isinstance(node, st.Attribute):
        return ("attr", node.key, _shape_value(node.value))
    return ("block", node.name, None if node.label is None else _shape_value(node.label),
            tuple(_shape_item(m) for m in node.members))


def _shape_value(value: st.Value) -> object:
    if isinstance(value, st.StrValue):
        return ("str", value.heredoc, tuple(_merge_parts(value.parts)))
    if isinstance(value, st.NumberValue):
        return ("number", value.raw)
    if isinstance(value, st.UnitValue):
        return ("unit", value.raw)
    if isinstance(value, st.BoolValue):
        return ("bool", value.value)
    if isinstance(value, st.ListValue):
        return ("list", tuple(_shape_value(v) for v in value.items))
    if isinstance(value, st.CallValue):
        return ("call", value.name, tuple(_shape_value(v) for v in value.args))
    return ("ref", value.path)


def _merge_parts(parts: Sequence[str | st.RefValue]) -> list[str | tuple[str, ...]]:
    """String parts with adjacent literals joined and empty literals dropped."""
    out: list[str | tuple[str, ...]] = []
    for part in parts:
        if isinstance(part, st.RefValue):
            out.append(part.path)
        elif part:
            if out and isinstance(out[-1], str):
                out[-1] += part
            else:
                out.append(part)
    return out


# -- rendering of leaves ----------------------------------------------------------------------


def _comment_text(text: str) -> str:
    text = text.rstrip()
    return "#" + text[2:] if text.startswith("//") else text


def _escape(text: str, before_ref: bool) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "$" and text.startswith("${", i):
            out.append("$${")
            i += 2
            continue
        if ch == "$" and before_ref and i == len(text) - 1:
            out.append("\\u0024")  # `$${` would read as an escaped `${`
        elif ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x10000 and unicodedata.category(ch) in _ESCAPED_CATEGORIES:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def render_string(parts: Sequence[str | st.RefValue]) -> str:
    """A double-quoted string literal that parses back to ``parts``."""
    merged = _merge_parts(parts)
    out = ['"']
    for i, part in enumerate(merged):
        if isinstance(part, str):
            before_ref = i + 1 < len(merged) and not isinstance(merged[i + 1], str)
            out.append(_escape(part, before_ref))
        else:
            out.append("${" + ".".join(part) + "}")
    out.append('"')
    return "".join(out)


def _render_key(key: str, quoted: bool) -> str:
    if not quoted or (_NAME_RE.fullmatch(key) and key not in _RESERVED):
        return key
    return render_string([key])


def _closes(line: str, tag: str) -> bool:
    """Whether ``line`` would end a heredoc tagged ``tag`` (the grammar's rule)."""
    rest = line.lstrip(" \t")
    return rest.startswith(tag) and (len(rest) == len(tag) or rest[len(tag)] not in _TAG_CHARS)


def _heredoc_tag(preferred: str, lines: Sequence[str]) -> str:
    candidates = [preferred, "EOT"] + [f"EOT{n}" for n in range(1, len(lines) + 2)]
    for tag in candidates:
        if tag and not any(_closes(line, tag) for line in lines):
            return tag
    raise AssertionError("unreachable: some EOTn does not occur")  # pragma: no cover


def _is_blank(line: str) -> bool:
    return not line.strip()


def _width(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _heredoc_lines(value: st.StrValue, level: int) -> list[str]:
    """``<<-TAG`` then the body lines and the closing tag, indented one level below ``level``."""
    body = value.parts[0] if value.parts and isinstance(value.parts[0], str) else ""
    lines = body.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    tag = _heredoc_tag(value.tag.lstrip("-"), lines)
    pad = _INDENT * (level + 1)
    widths = [_width(line) for line in lines if not _is_blank(line)]
    if widths and min(widths) > 0:
        # Every line is indented: `<<-` would strip that indentation, so keep the body as is.
        return ["<<" + tag, *lines, pad + tag]
    if not widths:
        # Only blank lines: `<<-` strips nothing, so the lines are written as they are.
        return ["<<-" + tag, *lines, pad + tag]
    return ["<<-" + tag, *[pad + line if line else "" for line in lines], pad + tag]


def _scalar(value: st.Value) -> bool:
    if isinstance(value, st.StrValue):
        return not value.heredoc
    if isinstance(value, st.ListValue):
        return False
    if isinstance(value, st.CallValue):
        return all(_scalar(a) for a in value.args)
    return True


# -- the formatter ----------------------------------------------------------------------------


class _Formatter:
    def __init__(self, file: st.File) -> None:
        self.file = file
        self.text = file.source.text
        self.comments = sorted(file.comments, key=lambda c: c.span.start)
        self.comment_starts = [c.span.start for c in self.comments]
        self.comment_end = {c.span.start: c.span.end for c in self.comments}
        self.leading: dict[int, list[_Note]] = {}
        self.strays: dict[int, list[_Note]] = {}
        self.trailing: dict[int, list[_Note]] = {}
        self.header: dict[int, list[_Note]] = {}
        self.footer: dict[int, list[_Note]] = {}
        #: The blank-line flag of each item (after strays took it over).
        self.blank: dict[int, bool] = {}

    def run(self) -> str:
        self.place(self.file, self.comments)
        lines = self.sequence(self.file, list(self.file.items), 0, top=True)
        return "".join(line.rstrip(" \t") + "\n" if not line.startswith(_HEREDOC_MARK)
                       else line[len(_HEREDOC_MARK):] + "\n" for line in lines)

    # -- source geometry -----------------------------------------------------------------

    def blank_before(self, pos: int) -> bool:
        """Whether a blank line separates ``pos`` from the code or comment before it."""
        newlines = 0
        i = pos - 1
        text = self.text
        while i >= 0 and text[i] in _WHITESPACE:
            if text[i] == "\n":
                newlines += 1
            i -= 1
        return newlines >= 2

    def own_line(self, pos: int) -> bool:
        start = self.text.rfind("\n", 0, pos) + 1
        return not self.text[start:pos].strip(_WHITESPACE)

    def find(self, pos: int, char: str) -> int:
        """The position of ``char`` at or after ``pos``, skipping whitespace and comments."""
        text = self.text
        while pos < len(text):
            if text[pos] in _WHITESPACE:
                pos += 1
            elif pos in self.comment_end:
                pos = self.comment_end[pos]
            elif text[pos] == char:
                return pos
            else:  # pragma: no cover - the parser saw `char` here
                raise FormatterError(f"expected `{char}` at offset {pos}")
        raise FormatterError(f"expected `{char}` after offset {pos}")  # pragma: no cover

    def interior(self, node: _Container) -> tuple[int, int]:
        """The characters between a container's brackets (the whole text for a file)."""
        if isinstance(node, st.File):
            return 0, len(self.text) + 1
        if isinstance(node, st.Block):
            return node.open_span.end, node.span.end - 1
        if isinstance(node, st.ParamsBlock):
            return self.find(node.name_span.end, "{") + 1, node.span.end - 1
        if isinstance(node, st.ListValue):
            return node.span.start + 1, node.span.end - 1
        return self.find(node.name_span.end, "(") + 1, node.span.end - 1

    def has_comments(self, node: _Container) -> bool:
        lo, hi = self.interior(node)
        i = bisect.bisect_left(self.comment_starts, lo)
        return i < len(self.comment_starts) and self.comment_starts[i] < hi

    @staticmethod
    def items(node: _Container) -> Sequence[_Item]:
        if isinstance(node, st.File):
            return node.items
        if isinstance(node, st.Block):
            return node.members
        if isinstance(node, st.ParamsBlock):
            return node.params
        if isinstance(node, st.ListValue):
            return node.items
        return node.args

    @staticmethod
    def sub_container(item: _Item) -> _Container | None:
        if isinstance(item, (st.Block, st.ParamsBlock, st.ListValue, st.CallValue)):
            return item
        value: st.Value | None = None
        if isinstance(item, st.Attribute):
            value = item.value
        elif isinstance(item, st.ParamDecl):
            value = item.default
        if isinstance(value, (st.ListValue, st.CallValue)):
            return value
        return None

    # -- comment placement ---------------------------------------------------------------

    def place(self, node: _Container, comments: Sequence[st.Comment]) -> None:
        """Attach each comment inside ``node`` to an item of it, or to ``node`` itself."""
        items = self.items(node)
        starts = [item.span.start for item in items]
        nested: dict[int, tuple[_Container, list[st.Comment]]] = {}
        own_line_gaps: set[int] = set()
        for comment in comments:
            pos = comment.span.start
            text = _comment_text(comment.text)
            k = bisect.bisect_right(starts, pos) - 1
            if k >= 0 and pos < items[k].span.end:
                sub = self.sub_container(items[k])
                if sub is not None:
                    lo, hi = self.interior(sub)
                    if lo <= pos < hi:
                        nested.setdefault(id(sub), (sub, []))[1].append(comment)
                        continue
                self.strays.setdefault(id(items[k]), []).append(_Note(pos, text, False))
            elif self.own_line(pos) or k in own_line_gaps:
                # A comment after `,` that follows an own-line comment cannot trail the item
                # before them without reordering the comments: it goes on its own line too.
                blank = self.blank_before(pos) if self.own_line(pos) else False
                own_line_gaps.add(k)
                if k + 1 < len(items):
                    self.leading.setdefault(id(items[k + 1]), []).append(_Note(pos, text, blank))
                else:
                    self.footer.setdefault(id(node), []).append(_Note(pos, text, blank))
            elif k >= 0:
                self.trailing.setdefault(id(items[k]), []).append(_Note(pos, text, False))
            else:
                self.header.setdefault(id(node), []).append(_Note(pos, text, False))
        self.settle(node, items)
        for sub, sub_comments in nested.values():
            self.place(sub, sub_comments)
        for item in items:
            sub = self.sub_container(item)
            if sub is not None and id(sub) not in nested:
                self.place(sub, [])

    def settle(self, node: _Container, items: Sequence[_Item]) -> None:
        """Turn what cannot stay where it was into own-line comments, fix blank-line flags."""
        def push(index: int, notes: list[_Note]) -> None:
            if index < len(items):
                target = self.leading.setdefault(id(items[index]), [])
            else:
                target = self.footer.setdefault(id(node), [])
            target.extend(notes)
            target.sort(key=lambda n: n.pos)

        header = self.header.get(id(node), [])
        if len(header) > 1:
            self.header[id(node)] = header[:1]
            push(0, header[1:])
        for index, item in enumerate(items):
            trailing = self.trailing.get(id(item), [])
            if len(trailing) > 1:
                self.trailing[id(item)] = trailing[:1]
                push(index + 1, trailing[1:])
        for item in items:
            blank = self.blank_before(item.span.start)
            strays = self.strays.pop(id(item), [])
            if strays:
                strays[0].blank_before = blank
                blank = False
                self.leading.setdefault(id(item), []).extend(strays)
            self.blank[id(item)] = blank

    # -- layout --------------------------------------------------------------------------

    def sequence(self, node: _Container, items: Sequence[_Item], level: int,
                 top: bool = False) -> list[str]:
        """The lines of a container's items with their comments, at ``level``."""
        pad = _INDENT * level
        runs = self.runs(node, items)
        widths: dict[int, int] = {}
        for run in runs:
            width = max((len(self.key_text(item)) for item in run
                         if isinstance(item, (st.Attribute, st.ParamDecl))), default=0)
            widths.update((id(item), width) for item in run)
        rendered: dict[int, list[str]] = {}
        for item in items:
            lines = self.item_lines(item, level, widths.get(id(item), 0), top)
            if isinstance(node, (st.ListValue, st.CallValue)):
                lines[-1] += ","
            rendered[id(item)] = lines
        # Trailing comments of one-line items are aligned within a run, two spaces after the
        # longest such line; others follow their line after two spaces.
        column: dict[int, int] = {}
        for run in runs:
            commented = [rendered[id(item)][0] for item in run
                         if len(rendered[id(item)]) == 1 and self.trailing.get(id(item))]
            width = max((len(line) for line in commented), default=0)
            column.update((id(item), width) for item in run)
        out: list[str] = []
        for index, item in enumerate(items):
            notes = self.leading.get(id(item), [])
            first = True
            for note in notes:
                forced = top and first and index > 0
                if out and (note.blank_before or forced):
                    out.append("")
                out.append(pad + note.text)
                first = False
            if out and (self.blank[id(item)] or (top and first and index > 0)):
                out.append("")
            lines = rendered[id(item)]
            trailing = self.trailing.get(id(item), [])
            if trailing:
                at = column.get(id(item), 0) if len(lines) == 1 else 0
                lines[-1] = lines[-1].ljust(at) + "  " + trailing[0].text
            out.extend(lines)
        for note in self.footer.get(id(node), []):
            if out and note.blank_before:
                out.append("")
            out.append(pad + note.text)
        return out

    def runs(self, node: _Container, items: Sequence[_Item]) -> list[list[_Item]]:
        """Alignment runs: consecutive items with no blank line or own-line comment between
        them; in a block, only attributes form runs (a nested block stands alone); at the top
        level every block stands alone."""
        runs: list[list[_Item]] = []
        run: list[_Item] = []
        for item in items:
            alone = isinstance(node, st.File) or isinstance(item, st.Block)
            if alone or self.leading.get(id(item)) or self.blank[id(item)]:
                if run:
                    runs.append(run)
                run = []
            run.append(item)
            if alone:
                runs.append(run)
                run = []
        if run:
            runs.append(run)
        return runs

    def key_text(self, item: st.Attribute | st.ParamDecl) -> str:
        if isinstance(item, st.ParamDecl):
            return f"{item.name}: {item.type}"
        return self.key(item)

    @staticmethod
    def key(item: st.Attribute | st.Block) -> str:
        if isinstance(item, st.Attribute):
            return _render_key(item.key, item.quoted_key)
        return _render_key(item.name, item.quoted_key)

    def item_lines(self, item: _Item, level: int, key_width: int, top: bool) -> list[str]:
        pad = _INDENT * level
        if isinstance(item, st.Attribute):
            head = pad + self.key_text(item).ljust(key_width) + " = "
            return _join(head, self.value_lines(item.value, level, len(head), 0))
        if isinstance(item, st.Block):
            return self.block_lines(item, level, top)
        if isinstance(item, st.ParamsBlock):
            return self.braced(item, pad + "params", item.params, level)
        if isinstance(item, st.ParamDecl):
            if item.default is None:
                return [pad + self.key_text(item)]
            head = pad + self.key_text(item).ljust(key_width) + " = "
            return _join(head, self.value_lines(item.default, level, len(head), 0))
        # A list item or call argument.
        return _join(pad, self.value_lines(item, level, len(pad), 1))

    def block_lines(self, block: st.Block, level: int, top: bool) -> list[str]:
        pad = _INDENT * level
        if top:
            head = pad + block.name
            if block.label is not None:
                head += " " + render_string(block.label.parts)
        else:
            head = pad + self.key(block)
        if not top and self.one_line(block):
            members = "  ".join(
                self.key(m) + " = " + (self.flat(m.value) or "")
                for m in block.members if isinstance(m, st.Attribute))
            line = f"{head} {{ {members} }}"
            if len(line) <= MAX_WIDTH:
                return [line]
        return self.braced(block, head, block.members, level)

    def braced(self, node: st.Block | st.ParamsBlock, head: str, items: Sequence[_Item],
               level: int) -> list[str]:
        if not items and not self.has_comments(node):
            return [head + " {}"]
        first = head + " {"
        header = self.header.get(id(node), [])
        if header:
            first += "  " + header[0].text
        return [first, *self.sequence(node, items, level + 1), _INDENT * level + "}"]

    def one_line(self, block: st.Block) -> bool:
        if not block.members or self.has_comments(block):
            return False
        if block.open_span.line != self.file.source.line_col(block.span.end - 1)[0]:
            return False
        return all(isinstance(m, st.Attribute) and self.simple(m.value) for m in block.members)

    @staticmethod
    def simple(value: st.Value) -> bool:
        if isinstance(value, st.ListValue):
            return all(_scalar(v) for v in value.items)
        return _scalar(value)

    def flat(self, value: st.Value) -> str | None:
        """The one-line text of a value, or ``None`` if it cannot be written on one line."""
        if isinstance(value, st.StrValue):
            return None if value.heredoc else render_string(value.parts)
        if isinstance(value, (st.NumberValue, st.UnitValue)):
            return value.raw
        if isinstance(value, st.BoolValue):
            return "true" if value.value else "false"
        if isinstance(value, st.RefValue):
            return ".".join(value.path)
        if self.has_comments(value):
            return None
        items = value.items if isinstance(value, st.ListValue) else value.args
        texts = [self.flat(v) for v in items]
        if any(t is None for t in texts):
            return None
        inner = ", ".join(t for t in texts if t is not None)
        return f"[{inner}]" if isinstance(value, st.ListValue) else f"{value.name}({inner})"

    def value_lines(self, value: st.Value, level: int, column: int, suffix: int) -> list[str]:
        """A value's lines: the first continues the current line (at ``column``), the others
        are whole lines; ``suffix`` characters (a comma) will follow the last one."""
        if isinstance(value, st.StrValue) and value.heredoc:
            lines = _heredoc_lines(value, level)
            # Heredoc body lines are written verbatim (trailing whitespace included).
            return [lines[0], *[_HEREDOC_MARK + line for line in lines[1:-1]], lines[-1]]
        flat = self.flat(value)
        if flat is not None and (column + len(flat) + suffix <= MAX_WIDTH
                                 or not isinstance(value, (st.ListValue, st.CallValue))):
            return [flat]
        assert isinstance(value, (st.ListValue, st.CallValue))
        first = "[" if isinstance(value, st.ListValue) else value.name + "("
        header = self.header.get(id(value), [])
        if header:
            first += "  " + header[0].text
        items = value.items if isinstance(value, st.ListValue) else value.args
        body = self.sequence(value, items, level + 1)
        close = _INDENT * level + ("]" if isinstance(value, st.ListValue) else ")")
        return [first, *body, close]


#: Marks a heredoc body line, whose trailing whitespace is content and must not be stripped.
_HEREDOC_MARK = "\x00heredoc\x00"


def _join(head: str, lines: list[str]) -> list[str]:
    return [head + lines[0], *lines[1:]]
