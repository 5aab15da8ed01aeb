"""A stand-in Kubernetes API server for the client-side paths of `durapipe submit`, `status`
and `watch`: HTTP on 127.0.0.1, answering from a route table with real Kubernetes `Status`
objects, so the `kubernetes` client's own error handling is what the tests exercise.  The
control plane of tests/e2e is the real thing; this only covers what needs no cluster (error
translation, request bodies) where that one is not available.

Besides well-formed answers it sends what a hostile or broken server would (``Raw`` bytes under
any content type, watch lines that are no events, an answer that waits), and ``raw_server``
is a bare TCP server for answers HTTP cannot express: none at all, or a byte at a time.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

#: (method, path without query) -> (status, body: a JSON object, or a list of watch events).
Handler = Callable[[str, str, dict[str, Any] | None], tuple[int, Any]]


def status_object(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "reason": reason, "code": code}


@dataclass(frozen=True)
class Raw:
    """An answer sent as it is: a body that need not be JSON, under any content type.  In a
    watch's list of events, ``bytes`` items are sent as raw lines the same way."""

    body: bytes
    content_type: str = "application/json"


@dataclass(frozen=True)
class Reply:
    """What a callable route returns to answer with another status than its route's."""

    code: int
    answer: Any


@dataclass
class FakeApi:
    routes: dict[tuple[str, str], tuple[int, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    content_types: list[str] = field(default_factory=list)
    url: str = ""

    def kubeconfig(self, directory: Path, namespace: str = "default") -> Path:
        path = directory / "kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "t0ken"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                       "namespace": namespace}}],
        }))
        return path


@contextmanager
def fake_api() -> Iterator[FakeApi]:
    api = FakeApi()

    class Handle(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _serve(self, method: str) -> None:
            path, _, query = self.path.partition("?")
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            api.requests.append((method, self.path, body))
            api.content_types.append(self.headers.get("Content-Type", ""))
            key = (method, path + ("?watch" if "watch=true" in query.lower() else ""))
            code, answer = api.routes.get(key, (404, status_object(
                404, "NotFound", f"the server could not find the requested resource ({path})")))
            if callable(answer):
                answer = answer(body)
            if isinstance(answer, Reply):
                code, answer = answer.code, answer.answer
            content_type = "application/json"
            if isinstance(answer, Raw):
                data, content_type = answer.body, answer.content_type
            elif isinstance(answer, list):  # a watch: one JSON event per line
                data = b"".join((e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n"
                                for e in answer)
            else:
                data = json.dumps(answer).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            self._serve("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._serve("POST")

        def do_PUT(self) -> None:  # noqa: N802
            self._serve("PUT")

        def do_PATCH(self) -> None:  # noqa: N802
            self._serve("PATCH")

        def do_DELETE(self) -> None:  # noqa: N802
            self._serve("DELETE")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handle)
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


#: What ``raw_server`` does with each connection: given the socket and an event set when the
#: server stops (so that a handler that never answers still ends).
Behaviour = Callable[[socket.socket, threading.Event], None]


@contextmanager
def raw_server(behaviour: Behaviour) -> Iterator[str]:
    """A TCP server on 127.0.0.1 running ``behaviour`` on every connection; yields its URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)  # accept() looks at ``stopping`` this often: close() wakes no one
    stopping = threading.Event()
    handlers: list[threading.Thread] = []

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                behaviour(conn, stopping)
            except OSError:  # the client gave up and closed: what the tests want
                pass

    def accept() -> None:
        while not stopping.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            handler = threading.Thread(target=serve, args=(conn,), daemon=True)
            handler.start()
            handlers.append(handler)

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stopping.set()
        listener.close()
        for thread in [acceptor, *handlers]:
            thread.join(timeout=10)


def never_answers(conn: socket.socket, stopping: threading.Event) -> None:
    """Read the request, then say nothing."""
    conn.recv(65536)
    stopping.wait()


def drips(answer: bytes, at_once: int = 0, every_s: float = 0.5) -> Behaviour:
    """Send the first ``at_once`` bytes of ``answer``, then one byte every ``every_s``."""

    def behaviour(conn: socket.socket, stopping: threading.Event) -> None:
        conn.recv(65536)
        conn.sendall(answer[:at_once])
        for i in range(at_once, len(answer)):
            if stopping.wait(every_s):
                return
            conn.sendall(answer[i:i + 1])

    return behaviour


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``durapipe ARGV...`` in this process: its exit code, stdout and stderr."""
    from durapipe.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err
