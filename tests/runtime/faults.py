"""Fault injection for the checkpoint store: a misbehaving HTTP proxy in front of S3 (moto), a
store wrapper with scripted failures, and a small tmpfs for real full disks.

Used by tests/runtime/test_runtime_store_faults.py and by benchmarks/checkpoint_soak.py, so
the faults the soak runs for an hour are the ones CI runs for seconds.
"""

from __future__ import annotations

import errno
import http.client
import http.server
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from durapipe.runtime.store import Store, TransientStoreError

#: What the proxy can do to a request.
FAULTS = (
    "latency",  # answer correctly, 0.3 s late
    "stall",  # read the request and never answer (until the proxy closes)
    "reset",  # close the connection with a TCP reset instead of answering
    "503",  # SlowDown
    "500",  # InternalError
    "403",  # AccessDenied
    "truncate",  # forward, then send only half of the response body and hang up
    "truncate_upload",  # forward only half of a PUT body (the server stores a short object)
    "flip_download",  # flip one bit of a response body
    "flip_upload",  # flip one bit of a PUT body on its way to the server
)
_ERRORS = {"503": "SlowDown", "500": "InternalError", "403": "AccessDenied"}


@dataclass
class _Rule:
    fault: str
    until: float | None  # monotonic deadline
    remaining: int | None  # requests left
    match: Callable[[str, str], bool]


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of an S3 endpoint that injects faults on demand.

    ``inject(fault, seconds=..., requests=..., match=...)`` arms one fault for a while or for
    a number of requests (those ``match(method, path)`` accepts); without a rule it relays.
    ``first_attempt`` makes the first try of every distinct request fail with ``fault``
    (every single operation meets it once, deterministically).
    """

    def __init__(self, upstream: str, *, first_attempt: str | None = None) -> None:
        target = urlparse(upstream)
        proxy = self
        self.rules: list[_Rule] = []
        self.first_attempt = first_attempt
        self.seen: set[tuple[str, str]] = set()
        self.injected: dict[str, int] = {}
        self.relayed = 0
        self._lock = threading.Lock()
        self._closing = threading.Event()

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
                fault = proxy._fault_for(self.command, self.path)
                if fault == "stall":
                    proxy._closing.wait(600)
                    self.close_connection = True
                    return
                if fault == "reset":
                    self.connection.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                    self.close_connection = True
                    return
                if fault in _ERRORS:
                    message = (
                        f"<Error><Code>{_ERRORS[fault]}</Code>"
                        "<Message>injected</Message></Error>"
                    ).encode()
                    self.send_response(int(fault))
                    self.send_header("Content-Length", str(len(message)))
                    self.end_headers()
                    self.wfile.write(message)
                    return
                if fault == "latency":
                    time.sleep(0.3)
                if body and self.command == "PUT":
                    if fault == "truncate_upload":
                        body = body[: len(body) // 2]
                    elif fault == "flip_upload":
                        body = _flip(body)
                connection = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                skip = ("connection", "transfer-encoding", "content-length")
                headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
                if body is not None:
                    headers["Content-Length"] = str(len(body))
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse()
                data = response.read()
                connection.close()
                with proxy._lock:
                    proxy.relayed += 1
                if fault == "flip_download" and data and self.command == "GET":
                    data = _flip(data)
                self.send_response(response.status)
                # A HEAD answer has no body but its Content-Length is the object's size.
                dropped: tuple[str, ...] = ("connection", "transfer-encoding")
                if self.command != "HEAD":
                    dropped += ("content-length",)
                    self.send_header("Content-Length", str(len(data)))
                for key, value in response.getheaders():
                    if key.lower() not in dropped:
                        self.send_header(key, value)
                self.end_headers()
                if fault == "truncate" and self.command == "GET" and len(data) > 1:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def failed(self) -> int:
        return sum(self.injected.values())

    def inject(
        self,
        fault: str,
        *,
        seconds: float | None = None,
        requests: int | None = None,
        match: Callable[[str, str], bool] | None = None,
    ) -> None:
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}")
        until = None if seconds is None else time.monotonic() + seconds
        with self._lock:
            self.rules.append(_Rule(fault, until, requests, match or (lambda _m, _p: True)))

    def heal(self) -> None:
        with self._lock:
            self.rules.clear()

    def _fault_for(self, method: str, path: str) -> str | None:
        with self._lock:
            now = time.monotonic()
            self.rules = [
                r
                for r in self.rules
                if (r.until is None or now < r.until) and (r.remaining is None or r.remaining > 0)
            ]
            fault = None
            for rule in self.rules:
                if rule.match(method, path):
                    if rule.remaining is not None:
                        rule.remaining -= 1
                    fault = rule.fault
                    break
            if fault is None and self.first_attempt and (method, path) not in self.seen:
                fault = self.first_attempt
            self.seen.add((method, path))
            if fault is not None:
                self.injected[fault] = self.injected.get(fault, 0) + 1
            return fault

    def close(self) -> None:
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()


def _flip(data: bytes) -> bytes:
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0x10
    return bytes(flipped)


def is_blob_put(method: str, path: str) -> bool:
    return method == "PUT" and "/blobs/" in path


def is_blob_get(method: str, path: str) -> bool:
    return method == "GET" and "/blobs/" in path


class OutageStore:
    """A store whose every operation fails with a transient error while ``down`` (a 503
    storm, a network partition), and works otherwise."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.parallel_files = inner.parallel_files
        self.down_until = 0.0
        self.failures = 0

    def outage(self, seconds: float) -> None:
        self.down_until = time.monotonic() + seconds

    def __getattr__(self, name: str) -> Any:
        operation = getattr(self.inner, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            if time.monotonic() < self.down_until:
                self.failures += 1
                raise TransientStoreError(f"injected outage ({name})")
            return operation(*args, **kwargs)

        return call


@contextmanager
def small_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A real filesystem of ``size`` (a full disk for real, ENOSPC from the kernel).

    Raises ``OSError`` where it cannot be mounted (not root, no mount namespace)."""
    mount.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise OSError(errno.EPERM, f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


class SilentServer:
    """A TCP server on 127.0.0.1 that accepts every connection and never answers, nor closes
    it: a black-holed store endpoint (a wedged load balancer, a dead proxy).  Not a proxy
    fault: nothing behind it ever answers, so every client call waits for its own timeout.

    Use it as the S3 endpoint (``endpoint``) of either client; ``accepted`` counts the
    connections it holds open."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._held: list[socket.socket] = []
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="silent-server", daemon=True)
        self._thread.start()

    @property
    def accepted(self) -> int:
        return len(self._held)

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._held.append(connection)  # read nothing, answer nothing

    def close(self) -> None:
        self._closing.set()
        self._thread.join(timeout=5)
        self._listener.close()
        for connection in self._held:
            connection.close()

    def __enter__(self) -> SilentServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
