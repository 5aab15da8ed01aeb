"""A stand-in Kubernetes API server for the client-side paths of `durapipe submit`, `status`
and `watch`: HTTP on 127.0.0.1, answering from a route table with real Kubernetes `Status`
objects, so the `kubernetes` client's own error handling is what the tests exercise.  The
control plane of tests/e2e is the real thing; this only covers what needs no cluster (error
translation, request bodies) where that one is not available.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

#: (method, path without query) -> (status, body: a JSON object, or a list of watch events).
Handler = Callable[[str, str, dict[str, Any] | None], tuple[int, Any]]


def status_object(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "reason": reason, "code": code}


@dataclass
class FakeApi:
    routes: dict[tuple[str, str], tuple[int, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
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
            key = (method, path + ("?watch" if "watch=true" in query.lower() else ""))
            code, answer = api.routes.get(key, (404, status_object(
                404, "NotFound", f"the server could not find the requested resource ({path})")))
            if callable(answer):
                answer = answer(body)
            if isinstance(answer, list):  # a watch: one JSON event per line
                data = b"".join(json.dumps(e).encode() + b"\n" for e in answer)
            else:
                data = json.dumps(answer).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            self._serve("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._serve("POST")

        def do_PUT(self) -> None:  # noqa: N802
            self._serve("PUT")

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
