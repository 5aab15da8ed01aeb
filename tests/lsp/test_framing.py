"""`durapipe lsp` on bad base-protocol framing: a subprocess fed raw bytes, as a broken or hostile
client would write them (pytest-lsp cannot: its client frames every message correctly).

A message the server cannot read costs that message only: a request among the skipped bytes
whose id is known is answered with a JSON-RPC error, and every later message is answered.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pygls", reason="the `lsp` extra installs pygls")

INITIALIZE = {"processId": None, "rootUri": None, "capabilities": {}}
#: Generous: each answer here takes milliseconds; a server that desynchronised never answers.
ANSWER_S = 20.0


def frame(body: bytes, length: str | None = None) -> bytes:
    return f"Content-Length: {len(body) if length is None else length}\r\n\r\n".encode() + body


def request(msg_id: int, method: str, params: object) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method,
                       "params": params}).encode()


class RawServer:
    """`durapipe lsp` over pipes, its output decoded by a reader thread."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "durapipe", "lsp", "--stdio"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy())
        self.received: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self.stderr: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()

    def _read(self) -> None:
        out = self.proc.stdout
        assert out is not None
        while True:
            length = None
            while (line := out.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            if not line or length is None:
                self.received.put(None)
                return
            self.received.put(json.loads(out.read(length)))

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def response(self, msg_id: int) -> dict[str, Any]:
        """The answer to request ``msg_id``, waiting at most :data:`ANSWER_S`."""
        deadline = time.monotonic() + ANSWER_S
        while True:
            for message in self.seen:
                if message.get("id") == msg_id and "method" not in message:
                    return message
            left = deadline - time.monotonic()
            try:
                got = self.received.get(timeout=max(0.01, left))
            except queue.Empty:
                got = None
            if got is None:
                pytest.fail(f"no answer to request {msg_id} (server exit code "
                            f"{self.proc.poll()}); stderr: {b''.join(self.stderr)[-2000:]!r}")
            self.seen.append(got)

    def shutdown(self) -> int:
        """A clean shutdown and exit; the server's exit code."""
        self.send(frame(request(99, "shutdown", None)))
        assert "error" not in self.response(99)
        self.send(frame(json.dumps({"jsonrpc": "2.0", "method": "exit"}).encode()))
        return self.proc.wait(timeout=ANSWER_S)

    @property
    def errors(self) -> str:
        return b"".join(self.stderr).decode(errors="replace")


@pytest.fixture
def server() -> Iterator[RawServer]:
    raw = RawServer()
    yield raw
    if raw.proc.poll() is None:
        raw.proc.kill()
    raw.proc.wait(timeout=ANSWER_S)


@pytest.mark.parametrize("length", ["99999999999999999999", str(2 ** 40), "abc", "-1", "1e3",
                                    "12 34", ""])
def test_an_unusable_length_is_answered_with_an_error_and_the_server_reads_on(
        length: str, server: RawServer) -> None:
    # pygls read 99999999999999999999 bytes (OverflowError) or 2**40 (MemoryError) and died,
    # exit 3; after `abc` it never found a header again and answered nothing.
    server.send(frame(request(7, "initialize", INITIALIZE), length=length))
    server.send(frame(request(1, "initialize", INITIALIZE)))
    error = server.response(7)["error"]
    assert error["code"] == -32600  # Invalid Request: its frame could not be read
    assert "Content-Length" in error["message"]
    assert "capabilities" in server.response(1)["result"]
    assert server.shutdown() == 0
    assert "Traceback" not in server.errors


def test_a_message_over_the_size_cap_is_refused_unread(server: RawServer) -> None:
    from durapipe.lsp.framing import MAX_MESSAGE_BYTES

    head = b'{"jsonrpc":"2.0","id":9,"method":"initialize","params":{"processId":null,'
    body = head + b'"capabilities":{},"pad":"' + b"x" * MAX_MESSAGE_BYTES + b'"}}'
    server.send(frame(body))
    server.send(frame(request(1, "initialize", INITIALIZE)))
    error = server.response(9)["error"]  # its id leads the message: it is answered too
    assert error["code"] == -32600 and f"{MAX_MESSAGE_BYTES:,}" in error["message"]
    assert "capabilities" in server.response(1)["result"]
    assert server.shutdown() == 0


def test_junk_a_body_that_is_not_json_and_bad_params_cost_only_themselves(
        server: RawServer) -> None:
    server.send(b"this is no header\r\n\r\n")
    server.send(frame(b"hello"))
    server.send(frame(b"[1, 2]"))
    server.send(frame(b'{"jsonrpc": "2.0", "id": 3}'))  # a response to nothing
    server.send(frame(request(1, "initialize", INITIALIZE)))
    assert "capabilities" in server.response(1)["result"]
    # pygls logged params it could not read and never answered: the client waited forever.
    server.send(frame(request(5, "textDocument/hover", {"textDocument": 42})))
    assert server.response(5)["error"]["code"] == -32602  # Invalid params
    assert server.shutdown() == 0
    assert "Traceback" not in server.errors


def test_a_header_line_that_never_ends_is_skipped(server: RawServer) -> None:
    # 10 MB without a newline, then a message on the same line: pygls read it as one header
    # line that matched nothing, and every header after it too.
    server.send(b"x" * 10_000_000 + frame(request(1, "initialize", INITIALIZE)))
    assert "capabilities" in server.response(1)["result"]
    assert server.shutdown() == 0


def test_input_ending_inside_a_message_ends_the_server_quietly(server: RawServer) -> None:
    server.send(frame(request(1, "initialize", INITIALIZE)))
    assert "capabilities" in server.response(1)["result"]
    server.send(b'Content-Length: 100\r\n\r\n{"jsonrpc":')
    assert server.proc.stdin is not None
    server.proc.stdin.close()
    assert server.proc.wait(timeout=ANSWER_S) == 0
    assert "Traceback" not in server.errors


# -- the reader itself, in process: every split of the input between reads ---------------------


def _events(data: bytes, chunk: int) -> list[tuple[str, object]]:
    from durapipe.lsp.framing import FrameReader, Message, request_id

    stream = iter(data[i:i + chunk] for i in range(0, len(data), chunk))
    reader = FrameReader(lambda size: next(stream, b""))
    found: list[tuple[str, object]] = []
    while batch := reader.read():
        found += [("message", e.body) if isinstance(e, Message) else (e.reason, request_id(e))
                  for e in batch]
    return found


@pytest.mark.parametrize("chunk", [1, 2, 7, 64, 1 << 20])
def test_the_reader_resynchronises_wherever_a_read_ends(chunk: int) -> None:
    one, two, four = request(1, "a", None), request(2, "b", None), request(4, "d", None)
    response = json.dumps({"jsonrpc": "2.0", "id": 5}).encode()
    data = (b"\r\n" + frame(one)                                   # a blank line first
            + b"junk"                                              # glued to the next header
            + b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n" + frame(two)
            + frame(request(3, "c", None), length="abc")           # answered, then read on
            + b"Content-Type: application/vscode-jsonrpc\r\n" + frame(four)
            + b"content-length: 0\r\n\r\n"                         # empty (not JSON, later)
            + frame(response, length="9" * 30)                     # a response: no answer
            + frame(request(6, "f", None))[:-3])                   # cut by the end of input
    assert _events(data, chunk) == [
        ("message", one), ("bytes outside any message", None), ("message", two),
        ("Content-Length 'abc' is not a number of bytes", 3), ("message", four),
        ("message", b""),
        (f"Content-Length {'9' * 30} is over the limit of 33,554,432 bytes for one message",
         None),
        ("the input ended inside a message", 6)]  # its head names it


def test_a_cut_off_request_is_answered_only_by_the_members_that_lead_it() -> None:
    from durapipe.lsp.framing import Skipped, request_id

    def cut(head: bytes) -> int | str | None:
        return request_id(Skipped("too large", 1 << 30, head))

    assert cut(b' {"jsonrpc": "2.0", "id": "a\\"b", "method": "x", "params": {"te') == 'a"b'
    assert cut(b'{"method":"x","id":12,"params":') == 12
    assert cut(b'{"jsonrpc":"2.0","params":{"id":3,"method":"x"},"id":4') is None  # nested
    assert cut(b'{"jsonrpc":"2.0","id":4,"result":') is None  # a response: nothing to answer
    assert cut(b'{"id":true,"method":"x"') is None  # not an id
    assert cut(b'{"jsonrpc":"2.0","id":8,"method":"x"}junk') == 8  # a whole first value
