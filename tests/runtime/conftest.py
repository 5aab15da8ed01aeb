"""Fixtures of the runtime tests: an S3 server on loopback (moto) and store URIs."""

from __future__ import annotations

import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durapipe.runtime import contract
from durapipe.runtime.claim import release_all

S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "durapipe-test",
    "AWS_SECRET_ACCESS_KEY": "durapipe-test",
    "AWS_REGION": "us-east-1",
}


@pytest.fixture(autouse=True)
def _no_lease_outlives_its_test() -> Iterator[None]:
    """A writer a test leaves open would renew its lease for the rest of the session (and
    against a server already stopped, at exit): each test's leases end with it."""
    yield
    release_all()


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


@pytest.fixture(params=["local", "obstore", "stdlib"])
def line_uri(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    """A checkpoint line on each backend: the local store, S3 through obstore, S3 through the
    runtime's own stdlib client."""
    if request.param == "local":
        monkeypatch.delenv(contract.ENV_STORE_CLIENT, raising=False)
        return (tmp_path / "store").as_uri()
    uri = str(request.getfixturevalue("s3_uri"))
    monkeypatch.setenv(contract.ENV_STORE_CLIENT, request.param)
    return uri
