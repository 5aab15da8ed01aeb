"""Quick fixes: the edit that a diagnostic's suggestion describes.

A diagnostic carries its suggestion as help text (``did you mean `memory`?``, ``write "x"``)
or, for the repaired syntax mistakes, as its code; this module turns each into an edit of the
primary span.  A diagnostic without a suggestion gets no fix.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from durapipe.dsl.diagnostics import Diagnostic

_DID_YOU_MEAN = re.compile(r"did you mean `([^`]+)`\?")
_WRITE_STRING = re.compile(r'^write (".*")$')
_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")


@dataclass(frozen=True)
class Edit:
    start: int
    end: int
    text: str


@dataclass(frozen=True)
class Fix:
    title: str
    edits: tuple[Edit, ...]


def fixes(diag: Diagnostic, text: str) -> list[Fix]:
    span = diag.span
    if span is None:
        return []
    start, end = span.start, span.end
    here = text[start:end]
    help_text = diag.help or ""
    found: list[Fix] = []
    suggestion = _DID_YOU_MEAN.search(help_text)
    if suggestion:
        # Replace the word in the span closest to the suggestion (the span may be a quoted
        # string, a dotted reference or `TYPE:COUNT`; only the misspelt word changes).
        word = suggestion.group(1)
        words = list(_WORD.finditer(here))
        if words:
            best = max(words, key=lambda m: difflib.SequenceMatcher(None, m.group(), word)
                       .ratio())
            found.append(Fix(f"Change to `{word}`",
                             (Edit(start + best.start(), start + best.end(), word),)))
    elif diag.code == "P0101" and here == ":":
        found.append(Fix("Write `=`", (Edit(start, end, "="),)))
    elif diag.code == "P0102":
        found.append(Fix("Insert `=`", (Edit(start, start, "= "),)))
    elif diag.code == "P0104" and here == ",":
        found.append(Fix("Remove the `,`", (Edit(start, end, ""),)))
    elif diag.code == "P0105" and (written := _WRITE_STRING.match(help_text)):
        found.append(Fix(f"Write {written.group(1)}", (Edit(start, end, written.group(1)),)))
    elif diag.code == "P0106" and help_text.startswith("remove it"):
        found.append(Fix("Remove the character", (Edit(start, end, ""),)))
    elif diag.code == "P0107" and here.startswith('"'):
        found.append(Fix('Close the string with `"`', (Edit(end, end, '"'),)))
    elif diag.code == "P0110" and here.startswith("\\"):
        found.append(Fix("Escape the backslash", (Edit(start, start + 1, "\\\\"),)))
    elif diag.code == "P0103" and len(diag.labels) > 1:
        at = diag.labels[1].span.start
        found.append(Fix("Insert the missing `}`", (Edit(at, at, _closing_brace(text, at)),)))
    elif diag.suggestion and diag.suggestion != here.strip('"'):
        # The diagnostic names the value that fits (a time zone, a valid name): it replaces
        # the written one, inside its quotes when it is a string.
        if len(here) >= 2 and here[0] == here[-1] == '"':
            found.append(Fix(f'Change to "{diag.suggestion}"',
                             (Edit(start + 1, end - 1, diag.suggestion),)))
        else:
            found.append(Fix(f"Change to `{diag.suggestion}`",
                             (Edit(start, end, diag.suggestion),)))
    return found


def _closing_brace(text: str, at: int) -> str:
    """``}`` on a line of its own, indented like the line that opened the block."""
    if at >= len(text):
        return ("" if text.endswith("\n") or not text else "\n") + "}\n"
    return "}\n"
