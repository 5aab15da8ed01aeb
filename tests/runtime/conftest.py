"""Fixtures of the runtime tests: an S3 server on loopback (moto) and store URIs."""

from __future__ import annotations

import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "durapipe-test",
    "AWS_SECRET_ACCESS_KEY": "durapipe-test",
    "AWS_REGION": "us-east-1",
}


@pytest.fixture
def termination_log(tmp_path: Path) -> Path:
    return tmp_path / "termination-log"


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server in a thread of this process, on 127.0.0.1."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as error:
        pytest.skip(f"moto[server] is not installed ({error}); it is in the test extra")
    server: Any = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment that points obstore at the moto server (also for child processes)."""
    pytest.importorskip("obstore", reason="obstore is the S3 client; it is in the test extra")
    env = dict(S3_CREDENTIALS, AWS_ENDPOINT_URL=s3_endpoint)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def s3_uri(s3_env: dict[str, str]) -> str:
    """A fresh, empty bucket; the URI has a prefix, as the compiler's do."""
    bucket = f"ckpt-{uuid.uuid4().hex[:12]}"
    request = urllib.request.Request(f"{s3_env['AWS_ENDPOINT_URL']}/{bucket}", method="PUT")
    urllib.request.urlopen(request, timeout=30).read()
    return f"s3://{bucket}/runs/r1/stages/train"


@pytest.fixture(params=["local", "s3"])
def store_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each checkpoint test runs against the local filesystem and against S3."""
    if request.param == "local":
        return (tmp_path / "store").as_uri()
    return str(request.getfixturevalue("s3_uri"))


class FlakyProxy:
    """An HTTP proxy in front of the S3 server that answers the first attempt of every
    distinct request (method and URL) with 503 SlowDown and forwards the retry: every single
    operation meets a transient server error on the real protocol, deterministically."""

    def __init__(self, upstream: str) -> None:
        import http.client
        import http.server
        import threading
        from urllib.parse import urlparse

        target = urlparse(upstream)
        proxy = self
        self.seen: set[tuple[str, str]] = set()
        self.failed = 0
        self._lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:
                pass

            def _body(self) -> bytes | None:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else None

            def _relay(self) -> None:
                body = self._body()
                with proxy._lock:
                    fail = (self.command, self.path) not in proxy.seen
                    proxy.seen.add((self.command, self.path))
                    proxy.failed += fail
                if fail:
                    message = b"<Error><Code>SlowDown</Code><Message>injected</Message></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(message)))
                    self.end_headers()
                    self.wfile.write(message)
                    return
                connection = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                skip = ("connection", "transfer-encoding", "content-length")
                headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
                if body is not None:
                    headers["Content-Length"] = str(len(body))
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse()
                data = response.read()
                self.send_response(response.status)
                # A HEAD answer has no body but its Content-Length is the object's size.
                dropped = ("connection", "transfer-encoding")
                if self.command != "HEAD":
                    dropped += ("content-length",)
                    self.send_header("Content-Length", str(len(data)))
                for key, value in response.getheaders():
                    if key.lower() not in dropped:
                        self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)
                connection.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
