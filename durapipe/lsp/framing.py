"""The LSP base protocol (``Content-Length`` framing on stdin), read so that no input kills
or desynchronises the server.

pygls's reader trusted the header: ``Content-Length: 99999999999999999999`` raised
OverflowError and ``2**40`` MemoryError (the server died), and after a header it could not use
(``Content-Length: abc``) it never found the start of a message again.  This reader caps a
message at :data:`MAX_MESSAGE_BYTES` and, after a header it cannot use, skips to the next
``Content-Length:`` it finds: one bad message costs that message only.  The skipped bytes come
back with the reason, so that a request among them can still be answered (``server``).
Memory stays bounded whatever arrives: a header block is at most :data:`MAX_HEADER_BYTES`, and
of skipped bytes at most :data:`KEPT_SKIPPED_BYTES` are kept.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

#: The largest message read: room for a document at the front end's limit
#: (``MAX_SOURCE_BYTES``, 4 MiB) even with every character JSON-escaped (at most 6 bytes each),
#: so an over-limit document still arrives and gets its diagnostic.  A larger message is
#: skipped unread.
MAX_MESSAGE_BYTES = 32 * 1024 * 1024
#: The header block of a message (``Content-Length`` and perhaps ``Content-Type``).
MAX_HEADER_BYTES = 8 * 1024
#: Skipped bytes kept to look for a request's id in: a whole request, or the head of one.
KEPT_SKIPPED_BYTES = 1024 * 1024
_CHUNK = 64 * 1024

_MARKER = b"content-length:"
_MARKER_RE = re.compile(re.escape(_MARKER), re.IGNORECASE)
_HEADER_NAME = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
#: The start of the stream or of the bytes right after a message: either header of the base
#: protocol may come first (other names there are junk glued to a header: ``junkContent-Length``).
_LEADING_WORDS = (b"content-length:", b"content-type:")
_LEADING_RE = re.compile(rb"[ \t\r\n]*(content-(?:length|type)[ \t]*:)", re.IGNORECASE)
_HEADER_RE = re.compile(rb"(" + _HEADER_NAME + rb")[ \t]*:[ \t]*([^\r\n]*?)[ \t]*\r?")
_BLANK_LINE_RE = re.compile(rb"\r?\n\r?\n")


@dataclass(frozen=True)
class Message:
    """One message's body, as its header framed it (not yet decoded)."""

    body: bytes


@dataclass(frozen=True)
class Skipped:
    """Bytes that are not a readable message, and why."""

    reason: str
    size: int
    #: The first :data:`KEPT_SKIPPED_BYTES` of them.
    head: bytes


Event = Message | Skipped


class FrameReader:
    """Messages from a byte stream, one :meth:`read` at a time (one thread reads).

    ``read`` is the stream's read of at most N bytes that returns what is available (``os.read``
    on stdin's descriptor, ``read1`` of a buffered stream), so that a partial message never
    waits for more than it is; ``b""`` is the end of the input.
    """

    def __init__(self, read: Callable[[int], bytes], max_message: int = MAX_MESSAGE_BYTES,
                 ) -> None:
        self._read = read
        self._max = max_message
        self._data = bytearray()
        self._eof = False
        self._skipped = bytearray()
        self._skipped_size = 0
        #: Why the last header block could not be used: what follows it, up to the next
        #: header, is that message's body.
        self._unusable: str | None = None

    def read(self) -> list[Event]:
        """What was skipped to reach the next message, then that message; ``[]`` once the
        input has ended."""
        events: list[Event] = []
        while True:
            found = self._skip_to_header()
            if found != "header":  # a request to answer now, or the end
                self._flush_skipped(events)
                return events
            headers = self._header_block()
            if headers is None:
                continue  # not a header block after all: skipped
            self._flush_skipped(events)
            length, problem = self._content_length(headers)
            if length is None:
                self._unusable = problem
                continue
            body = self._take(length)
            if body is not None:
                events.append(Message(body))
                return events

    # -- skipping ----------------------------------------------------------------------------

    def _skip_to_header(self) -> str:
        """Skip to the next header block: ``"header"``, ``"end"`` of input, or
        ``"answerable"``: the body of an unusable header is one whole JSON object (a request
        to answer now, not when the next message comes)."""
        while True:
            start = self._header_start()
            if start is not None:
                self._skip(start)
                return "header"
            if self._eof:
                self._skip(len(self._data))
                return "end"
            if not self._may_lead():
                self._skip(len(self._data) - _marker_prefix(self._data))
                if self._unusable and self._is_whole_object():
                    return "answerable"
            self._fill()

    def _leading(self) -> bool:
        """Right after a message (or at the start): either header of the base protocol may
        open the next block; after skipped bytes, only ``Content-Length`` is looked for."""
        return not self._skipped_size and self._unusable is None

    def _header_start(self) -> int | None:
        if self._leading():
            leading = _LEADING_RE.match(self._data)
            if leading:
                return leading.start(1)
        marker = _MARKER_RE.search(self._data)
        return marker.start() if marker else None

    def _may_lead(self) -> bool:
        """Whether the data so far may still become the first header line (a read can end
        inside a header name)."""
        if not self._leading() or len(self._data) >= MAX_HEADER_BYTES:
            return False
        start = bytes(self._data).lstrip(b" \t\r\n").lower()
        return any(word.startswith(start) for word in _LEADING_WORDS)

    def _skip(self, count: int) -> None:
        if count <= 0:
            return
        room = KEPT_SKIPPED_BYTES - len(self._skipped)
        if room > 0:
            self._skipped += self._data[:min(count, room)]
        self._skipped_size += count
        del self._data[:count]

    def _is_whole_object(self) -> bool:
        kept = bytes(self._skipped).strip()
        if len(self._skipped) != self._skipped_size or not kept.endswith(b"}"):
            return False
        try:
            return isinstance(json.loads(kept), dict)
        except ValueError:
            return False

    def _flush_skipped(self, events: list[Event]) -> None:
        """Report what was skipped since the last message, unless it was only whitespace."""
        if self._unusable is not None or bytes(self._skipped).strip():
            events.append(Skipped(self._unusable or "bytes outside any message",
                                  self._skipped_size, bytes(self._skipped)))
        self._skipped.clear()
        self._skipped_size = 0
        self._unusable = None

    # -- one message -------------------------------------------------------------------------

    def _header_block(self) -> dict[bytes, bytes] | None:
        """The header block at the start of the data, consumed; ``None`` where the data does
        not hold a well-formed one (then its first bytes are skipped, so the search moves on:
        past the marker, which no other header can start inside)."""
        while (end := _BLANK_LINE_RE.search(self._data, 0, MAX_HEADER_BYTES)) is None:
            if self._eof or len(self._data) >= MAX_HEADER_BYTES:
                self._not_a_header_block()
                return None
            self._fill()
        headers: dict[bytes, bytes] = {}
        for line in bytes(self._data[:end.start()]).split(b"\n"):
            header = _HEADER_RE.fullmatch(line)
            if header is None:
                self._not_a_header_block()
                return None
            headers[header.group(1).lower()] = header.group(2)
        del self._data[:end.end()]
        return headers

    def _not_a_header_block(self) -> None:
        at_marker = bytes(self._data[:len(_MARKER)]).lower() == _MARKER
        self._skip(len(_MARKER) if at_marker else 1)

    def _content_length(self, headers: dict[bytes, bytes]) -> tuple[int | None, str]:
        value = headers.get(b"content-length")
        if value is None:
            return None, "a header block without Content-Length"
        shown = value[:40].decode("ascii", "backslashreplace")
        if not value.isdigit():
            return None, f"Content-Length {shown!r} is not a number of bytes"
        if len(value) > len(str(self._max)) or int(value) > self._max:
            return None, (f"Content-Length {shown} is over the limit of {self._max:,} bytes "
                          "for one message")
        return int(value), ""

    def _take(self, length: int) -> bytes | None:
        """The next ``length`` bytes; ``None`` (they are skipped) if the input ends first."""
        while len(self._data) < length:
            if self._eof:
                self._unusable = "the input ended inside a message"
                self._skip(len(self._data))
                return None
            self._fill()
        body = bytes(self._data[:length])
        del self._data[:length]
        return body

    def _fill(self) -> None:
        chunk = self._read(_CHUNK)
        if chunk:
            self._data += chunk
        else:
            self._eof = True


def _marker_prefix(data: bytearray) -> int:
    """How many bytes at the end of ``data`` could begin ``Content-Length:`` (kept, so that a
    marker split between two reads is still found)."""
    for size in range(min(len(_MARKER) - 1, len(data)), 0, -1):
        if bytes(data[-size:]).lower() == _MARKER[:size]:
            return size
    return 0


_LEADING_MEMBER_RE = re.compile(
    rb'\s*"(jsonrpc|id|method)"\s*:\s*(-?\d{1,15}|"(?:[^"\\\x00-\x1f]|\\.){0,200}")\s*,?')


def request_id(skipped: Skipped) -> int | str | None:
    """The id of the request among skipped bytes, where it can be known: the first JSON value
    in them (the body of an unusable header, whatever follows it), or, in a message cut off
    by the size cap, the members that lead it (``{"jsonrpc":"2.0","id":9,"method":...``, the
    order VS Code writes), never a guess from nested ones."""
    text = skipped.head.decode("utf-8", "replace").lstrip()
    try:
        first, _ = json.JSONDecoder().raw_decode(text)
    except ValueError:
        first = None
    return message_request_id(first if isinstance(first, dict) else
                              _leading_members(skipped.head))


def message_request_id(message: object) -> int | str | None:
    """The id of ``message`` if it is a request (a response or a notification has none to
    answer) and the id is one JSON-RPC allows."""
    if not isinstance(message, dict) or "method" not in message:
        return None
    found = message.get("id")
    return found if isinstance(found, (int, str)) and not isinstance(found, bool) else None


def _leading_members(head: bytes) -> dict[str, object]:
    text = head.lstrip()
    members: dict[str, object] = {}
    if not text.startswith(b"{"):
        return members
    pos = 1
    while (member := _LEADING_MEMBER_RE.match(text, pos)) is not None:
        try:
            members[member.group(1).decode()] = json.loads(member.group(2))
        except ValueError:
            break
        pos = member.end()
    return members
