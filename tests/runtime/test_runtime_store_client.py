"""How a pod finds a store client, the stdlib S3 client itself, and the agent's verdict when
no client can open the store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from durapipe.runtime import contract
from durapipe.runtime.build_zipapp import build
from durapipe.runtime.s3 import StdlibS3Store
from durapipe.runtime.store import AlreadyExists, NotFound, NoStoreClient, store_client
from tests.runtime.conftest import S3_CREDENTIALS


def test_obstore_is_preferred_where_it_imports_and_stdlib_is_forced_by_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("obstore", reason="obstore is in the test extra")
    monkeypatch.delenv(contract.ENV_STORE_CLIENT, raising=False)
    assert store_client("s3://b/p") == "obstore"
    assert store_client("/tmp/x") == store_client("file:///tmp/x") == "local"
    monkeypatch.setenv(contract.ENV_STORE_CLIENT, "stdlib")
    assert store_client("s3://b/p") == "stdlib-s3"
    with pytest.raises(NoStoreClient, match="S3 only"):
        store_client("gs://b/p")
    monkeypatch.setenv(contract.ENV_STORE_CLIENT, "boto")
    with pytest.raises(NoStoreClient, match="obstore or stdlib"):
        store_client("s3://b/p")


def test_stdlib_s3_client_does_what_the_commit_protocol_needs(
        s3_uri: str, tmp_path: Path) -> None:
    store = StdlibS3Store(s3_uri)
    store.put_bytes("a/manifest.json", b"{}", create_only=True)
    with pytest.raises(AlreadyExists):
        store.put_bytes("a/manifest.json", b"{}", create_only=True)
    store.put_bytes("a/manifest.json", b'{"v": 2}')
    assert store.get_bytes("a/manifest.json") == b'{"v": 2}'
    source = tmp_path / "weights bin"
    source.write_bytes(bytes(range(256)) * 5000)
    fingerprint = store.put_file("a/b/weights bin", source)
    assert fingerprint.startswith("etag:")
    assert store.fingerprint("a/b/weights bin", "sha256") == fingerprint
    assert store.size("a/b/weights bin") == source.stat().st_size
    copy = tmp_path / "copy"
    digest = store.get_file("a/b/weights bin", copy, algorithm="sha256")
    assert copy.read_bytes() == source.read_bytes()
    import hashlib

    assert digest == f"sha256:{hashlib.sha256(source.read_bytes()).hexdigest()}"
    assert store.list("a") == ["a/b/weights bin", "a/manifest.json"]
    assert store.list("") == ["a/b/weights bin", "a/manifest.json"]
    assert store.list("a/b") == ["a/b/weights bin"]
    store.delete("a/manifest.json")
    store.delete("a/manifest.json")
    with pytest.raises(NotFound):
        store.get_bytes("a/manifest.json")
    assert store.size("missing") is None and store.fingerprint("missing", "sha256") is None


def _bare_zipapp(tmp_path: Path, *arguments: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    archive = build(tmp_path / "bin" / contract.RUNTIME_ZIPAPP_NAME)
    return subprocess.run(
        [sys.executable, "-I", "-S", str(archive), *arguments],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env}, cwd=tmp_path,
        capture_output=True, text=True, timeout=60, check=False)


def _agent_line(stderr: str) -> tuple[str, dict[str, object]]:
    line = next(x for x in stderr.splitlines() if x.startswith(contract.AGENT_VERDICT_TAG))
    verdict, _, details = line[len(contract.AGENT_VERDICT_TAG):].partition(" ")
    return verdict, json.loads(details)


@pytest.mark.parametrize("uri, why", [
    ("gs://bucket/ckpt", "install obstore"),
    ("s3://bucket/ckpt", "AWS_ACCESS_KEY_ID"),  # the stdlib client, without credentials
])
def test_an_agent_without_a_store_client_says_so_and_fails(
        tmp_path: Path, uri: str, why: str) -> None:
    for command in (["agent", "--spool", str(tmp_path / "spool"), "--uri", uri],
                    ["preflight", "--uri", uri]):
        done = _bare_zipapp(tmp_path, *command, env={})
        assert done.returncode == contract.EXIT_NO_STORE_CLIENT, done.stderr
        verdict, details = _agent_line(done.stderr)
        assert verdict == "no_store_client" and why in str(details["error"])
        assert "Traceback" not in done.stderr


def test_a_python_only_image_uploads_to_s3_with_the_stdlib_client(
        tmp_path: Path, s3_endpoint: str) -> None:
    done = _bare_zipapp(tmp_path, "preflight", "--uri", "s3://bucket/ckpt",
                        env={**S3_CREDENTIALS, "AWS_ENDPOINT_URL": s3_endpoint})
    assert done.returncode == 0, done.stderr
    assert _agent_line(done.stderr) == ("ready", {
        "uri": "s3://bucket/ckpt", "client": "stdlib-s3",
        "python": ".".join(map(str, sys.version_info[:3]))})
