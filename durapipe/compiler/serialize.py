"""Deterministic YAML for compiled documents.

The compiler builds plain dicts whose insertion order *is* the output order, so this emitter
never sorts keys; it only decides how to write each scalar and each small collection.  Output
is block style, with no anchors and no tags; a list or mapping that holds only scalars
(``command: [python3, -m, x]``, ``- {name: LOG_LEVEL, value: info}``) is written in flow style
when it fits on one line of ``WIDTH`` characters, as a person writes a manifest.  Strings are
written plain only when YAML 1.1 and 1.2 parsers both read them back as the same string;
otherwise they are double-quoted (JSON escapes are a subset of YAML's) or, for multi-line text,
written as a literal block.  Integers and booleans are emitted as such; the compiler turns every
Kubernetes quantity and int-or-string into a ``str`` before it gets here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# Plain scalars: conservative, so that no YAML 1.1 resolver (PyYAML, Go's yaml.v2) reads a
# number, boolean, null, timestamp or merge key where we wrote a string.
_PLAIN_RE = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./@-]*(?: [A-Za-z0-9_./@()-]+)*$")
_RESERVED = frozenset(
    {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "nan", "inf"}
)
_INDENT = "  "
#: The longest line a flow collection may make.
WIDTH = 100


def _plain_ok(text: str) -> bool:
    return bool(_PLAIN_RE.fullmatch(text)) and text.lower() not in _RESERVED


_NON_PRINTABLE_RE = re.compile(
    "[^\x09\x0a\x0d\x20-\x7e\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]|[\ufeff\u2028\u2029]"
)


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def _quote(text: str) -> str:
    """A double-quoted scalar; JSON escapes plus ``\\uXXXX`` for what YAML may not contain raw."""
    return _NON_PRINTABLE_RE.sub(_escape, json.dumps(text, ensure_ascii=False))


def scalar(value: object) -> str:
    """The YAML text of one scalar value."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return value if _plain_ok(value) else _quote(value)
    raise TypeError(f"cannot serialise {type(value).__name__} to YAML")


def _literal_ok(text: str) -> bool:
    """Whether a multi-line string round-trips through a ``|`` block."""
    if "\n" not in text or "\r" in text or "\t" in text:
        return False
    lines = text.split("\n")
    if lines[0].startswith(" ") or lines[0] == "":
        return False
    if any(line != line.rstrip(" ") for line in lines):
        return False
    return not any(_NON_PRINTABLE_RE.search(line) for line in lines)


def _block(text: str, indent: str) -> str:
    body = text.removesuffix("\n")
    chomp = "" if text.endswith("\n") and not text.endswith("\n\n") else "-"
    if text.endswith("\n\n"):
        chomp = "+"
    out = ["|" + chomp]
    for line in body.split("\n"):
        out.append(indent + line if line else "")
    return "\n".join(out)


def _key(key: str) -> str:
    return key if _plain_ok(key) else _quote(key)


def _flow_scalar(value: object) -> str | None:
    """A scalar as it may stand inside ``[...]`` or ``{...}``; ``None`` if it may not (a
    multi-line block, a collection).  Plain text never holds ``,[]{}``, so it needs no quotes
    there either."""
    if isinstance(value, (Mapping, list, tuple)):
        return None
    if isinstance(value, str) and _literal_ok(value):
        return None
    return scalar(value)


def _flow(value: Mapping[str, Any] | Sequence[Any]) -> str | None:
    """The flow form of a collection of scalars, or ``None``."""
    if isinstance(value, Mapping):
        items = [(_key(k) if isinstance(k, str) else None, _flow_scalar(v))
                 for k, v in value.items()]
        if any(k is None or v is None for k, v in items):
            return None
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    scalars = [_flow_scalar(v) for v in value]
    if any(v is None for v in scalars):
        return None
    return "[" + ", ".join(str(v) for v in scalars) + "]"


def _emit_value(value: Any, indent: str, out: list[str], prefix: str) -> None:
    """Write ``prefix`` (``key:`` or ``-``) followed by value, at ``indent``."""
    if isinstance(value, Mapping):
        if not value:
            out.append(f"{indent}{prefix} {{}}")
            return
        flow = _flow(value)
        if flow is not None and len(indent) + len(prefix) + 1 + len(flow) <= WIDTH:
            out.append(f"{indent}{prefix} {flow}")
            return
        out.append(f"{indent}{prefix}")
        _emit_mapping(value, indent + _INDENT, out)
    elif isinstance(value, (list, tuple)):
        if not value:
            out.append(f"{indent}{prefix} []")
            return
        flow = _flow(value)
        if flow is not None and len(indent) + len(prefix) + 1 + len(flow) <= WIDTH:
            out.append(f"{indent}{prefix} {flow}")
            return
        out.append(f"{indent}{prefix}")
        _emit_sequence(value, indent + _INDENT, out)
    elif isinstance(value, str) and _literal_ok(value):
        out.append(f"{indent}{prefix} {_block(value, indent + _INDENT)}")
    else:
        out.append(f"{indent}{prefix} {scalar(value)}")


def _emit_mapping(mapping: Mapping[str, Any], indent: str, out: list[str]) -> None:
    for key, value in mapping.items():
        if not isinstance(key, str):
            raise TypeError(f"mapping keys must be strings, got {key!r}")
        _emit_value(value, indent, out, _key(key) + ":")


def _emit_sequence(items: Sequence[Any], indent: str, out: list[str]) -> None:
    for item in items:
        flow = _flow(item) if isinstance(item, Mapping) and item else None
        if flow is not None and len(indent) + 2 + len(flow) <= WIDTH:
            out.append(f"{indent}- {flow}")
        elif isinstance(item, Mapping) and item:
            # "- first: x" then the rest of the mapping aligned under "first".
            sub: list[str] = []
            _emit_mapping(item, indent + _INDENT, sub)
            first = sub[0]
            sub[0] = indent + "- " + first[len(indent) + len(_INDENT):]
            out.extend(sub)
        else:
            _emit_value(item, indent, out, "-")


def dump_document(document: Mapping[str, Any]) -> str:
    """One document as YAML text, ending in a newline."""
    out: list[str] = []
    _emit_mapping(document, "", out)
    return "\n".join(out) + "\n"


def to_yaml(documents: Iterable[Mapping[str, Any]], header: str = "") -> str:
    """A multi-document YAML stream with an optional comment header.

    ``header`` may hold several lines; each is written as a ``#`` comment.
    """
    parts: list[str] = []
    if header:
        parts.append("".join(f"# {line}".rstrip() + "\n" for line in header.splitlines()))
    for index, document in enumerate(documents):
        if index or header:
            parts.append("---\n")
        parts.append(dump_document(document))
    return "".join(parts)
