"""Hostile or broken checkpoint lines: planted and malformed manifests, paths too long to
restore, truncated blobs, failing store clients.

Anyone who can write the line's prefix can plant a manifest whose checksum matches (it is
integrity, not authentication), so a restore must treat every manifest as untrusted input:
never write or follow anything outside its directory, and fall back to the previous intact
commit when the newest cannot be restored.  Rows of docs/runtime.md's guarantees table.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from durapipe.runtime import contract
from durapipe.runtime.checkpoint import Checkpoint, CheckpointError, restore_newest
from durapipe.runtime.manifest import (
    MANIFEST_DIR,
    blob_key,
    decode_manifest,
    encode_manifest,
    manifest_key,
)
from durapipe.runtime.manifest import MAX_RELATIVE_PATH_BYTES
from durapipe.runtime.store import (
    PART_SIZE,
    Store,
    UnexpectedStoreFailure,
    open_store,
)


def make_state(root: Path, step: int) -> Path:
    (root / "shards").mkdir(parents=True, exist_ok=True)
    (root / "shards" / "weights.bin").write_bytes(step.to_bytes(8, "little") * 512)
    (root / "step.json").write_text(json.dumps({"step": step}))
    return root


def new_checkpoint(uri: str, local: Path, **options: Any) -> Checkpoint:
    return Checkpoint(uri, path=local, spool_dir=local / "spool", **options)


def commit_two(uri: str, tmp_path: Path) -> Store:
    writer = new_checkpoint(uri, tmp_path / "writer", keep=5)
    for step in (1, 2):
        writer.save_sync(make_state(tmp_path / f"state{step}", step), metadata={"step": step})
    writer.close()
    return writer.store


def newest_body(store: Store) -> dict[str, Any]:
    return decode_manifest(store.get_bytes(manifest_key(2)))


def plant(store: Store, body: dict[str, Any], seq: int = 3) -> None:
    """Write ``body`` as the newest manifest, with a checksum that matches."""
    store.put_bytes(manifest_key(seq), encode_manifest(body), create_only=True)


def restored_step(uri: str, local: Path) -> int:
    restored = new_checkpoint(uri, local).load_sync()
    assert restored is not None
    return int(json.loads((restored / "step.json").read_text())["step"])


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# -- item 1: a restore never writes outside its directory ---------------------------------------


def _escapes(
    outside: Path, incoming: Path, blob: dict[str, Any]
) -> dict[str, list[dict[str, Any]]]:
    def file(path: str) -> dict[str, Any]:
        return dict(blob, path=path)

    def link(path: str, target: str) -> dict[str, Any]:
        return {"path": path, "kind": "symlink", "executable": False, "size": 0, "digest": target}

    def directory(path: str) -> dict[str, Any]:
        return {"path": path, "kind": "dir", "executable": False, "size": 0, "digest": ""}

    up = os.path.relpath(outside, incoming)
    return {
        "absolute link, file under it": [link("escape", str(outside)), file("escape/planted")],
        "relative link, dir and file under it": [
            link("up", up), directory("up/made"), file("up/made/planted")],
        "nested relative link": [
            directory("deep"), link("deep/link", os.path.relpath(outside, incoming / "deep")),
            file("deep/link/planted")],
        "link to a link": [link("a", "b"), link("b", str(outside)), file("a/planted")],
        "dotdot path": [file("../outside/planted")],
        "absolute path": [file(str(outside / "planted"))],
    }


ESCAPES = list(_escapes(Path("/o"), Path("/i"), {}))


@pytest.mark.parametrize("escape", ESCAPES)
def test_a_planted_manifest_cannot_make_a_restore_write_outside_its_directory(
    line_uri: str, tmp_path: Path, escape: str
) -> None:
    store = commit_two(line_uri, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    local = tmp_path / "trainer"
    body = newest_body(store)
    blob = next(e for e in body["entries"] if e["path"] == "step.json")
    incoming = local / "restored.incoming"
    body["entries"] = body["entries"] + _escapes(outside, incoming, blob)[escape]
    plant(store, body)
    assert restored_step(line_uri, local) == 2
    assert files_under(outside) == []
    assert not incoming.exists()
    # What was restored is the intact commit, with no link out of the tree.
    restored = local / "restored"
    assert files_under(restored) == ["shards", "shards/weights.bin", "step.json"]


# -- item 5: a malformed newest manifest falls back ---------------------------------------------


def _entry(path: str, blob: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return dict(blob, path=path, **changes)


def _malformations(blob: dict[str, Any]) -> dict[str, Callable[[dict[str, Any]], None]]:
    long_path = "/".join(["d" * 200] * 22) + "/f"  # 4,445 bytes: over PATH_MAX

    def entries(*added: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
        return lambda body: body.update(entries=body["entries"] + list(added))

    def replace(**fields: Any) -> Callable[[dict[str, Any]], None]:
        return lambda body: body.update(fields)

    link = {"kind": "symlink", "executable": False, "size": 0}
    return {
        "300-byte name of a file commit": replace(
            kind="file", name="n" * 300, entries=[_entry("n" * 300, blob)]),
        "300-byte path component": entries(_entry("x" * 300, blob)),
        "4,500-byte path": entries(_entry(long_path, blob)),
        "empty path": entries(_entry("", blob)),
        "dot path": entries(_entry(".", blob)),
        "dot component": entries(_entry("shards/./x", blob)),
        "empty component": entries(_entry("shards//x", blob)),
        "NUL in a path": entries(_entry("a\0b", blob)),
        "entries a mapping": replace(entries={"step.json": blob}),
        "entries a string": replace(entries="step.json"),
        "entries null": replace(entries=None),
        "an entry that is a number": entries(7),  # type: ignore[arg-type]
        "an entry without a digest": entries({"path": "x", "kind": "file", "size": 1}),
        "symlink chain": entries(
            dict(link, path="a", digest="b"), dict(link, path="a/c", digest="d")),
        "symlink to nothing": entries(dict(link, path="a", digest="")),
        "a path twice": entries(_entry("step.json", blob)),
        "a file under a file": entries(_entry("step.json/x", blob)),
        "an unknown entry kind": entries(_entry("fifo", blob, kind="fifo")),
        "a negative size": entries(_entry("neg", blob, size=-1)),
        "a size that is text": entries(_entry("txt", blob, size="12")),
        "a boolean size": entries(_entry("flag", blob, size=True)),
        "an mtime out of range": entries(_entry("t", blob, mtime_ns=10**30)),
        "a digest that walks the store": entries(
            _entry("walk", blob, digest="sha256:../../manifests/000000000001.json")),
        "an unknown algorithm": replace(algorithm="md5"),
        "an unknown commit kind": replace(kind="tarball"),
        "metadata not a mapping": replace(metadata=[1, 2]),
        "a file commit named outside": replace(
            kind="file", name="../step.json", entries=[_entry("step.json", blob)]),
        "a file commit whose file is missing": replace(
            kind="file", name="model.pt", entries=[_entry("step.json", blob)]),
        "a bytes commit with two files": replace(
            kind="bytes", entries=[_entry("payload", blob), _entry("more", blob)]),
    }


MALFORMATIONS = list(_malformations({}))


@pytest.mark.parametrize("malformation", MALFORMATIONS)
def test_a_malformed_newest_manifest_falls_back_to_the_previous_commit(
    tmp_path: Path, malformation: str
) -> None:
    uri = (tmp_path / "store").as_uri()
    store = commit_two(uri, tmp_path)
    body = newest_body(store)
    blob = next(e for e in body["entries"] if e["path"] == "step.json")
    _malformations(blob)[malformation](body)
    plant(store, body)
    with pytest.raises(ValueError):
        decode_manifest(store.get_bytes(manifest_key(3)))
    assert restored_step(uri, tmp_path / "trainer") == 2
    assert not (tmp_path / "trainer" / "restored.incoming").exists()


def deep_dir(root: Path, total_bytes: int) -> Path:
    """A directory whose path below ``root`` is about ``total_bytes`` long."""
    component = "p" * 199
    count = max(1, total_bytes // (len(component) + 1))
    return root.joinpath(*[component] * count)


def test_a_commit_too_long_to_restore_under_this_prefix_falls_back(tmp_path: Path) -> None:
    uri = (tmp_path / "store").as_uri()
    store = commit_two(uri, tmp_path)
    body = newest_body(store)
    blob = next(e for e in body["entries"] if e["path"] == "step.json")
    relative = "/".join(["r" * 199] * 15) + "/step.json"  # 3 KB: fits PATH_MAX on its own
    body["entries"] = body["entries"] + [_entry(relative, blob)]
    plant(store, body)
    decode_manifest(store.get_bytes(manifest_key(3)))  # not malformed as such
    local = deep_dir(tmp_path, 1200)  # ... but 1.2 KB of prefix make it unrestorable here
    local.mkdir(parents=True)
    assert restored_step(uri, local) == 2


def test_a_path_too_long_to_restore_is_refused_at_save_time(tmp_path: Path) -> None:
    state = make_state(tmp_path / "state", 1)
    deep = deep_dir(state, 3000)
    deep.mkdir(parents=True)
    (deep / "weights.bin").write_bytes(b"w")
    checkpoint = new_checkpoint((tmp_path / "store").as_uri(), tmp_path / "w")
    with pytest.raises(CheckpointError, match=f"longer than {MAX_RELATIVE_PATH_BYTES} bytes"):
        checkpoint.save(state)
    pending = tmp_path / "w" / "spool" / "pending"
    assert list(pending.iterdir()) == []  # nothing half-staged is left behind
    # A path that fits is saved as before.
    (deep / "weights.bin").unlink()
    for parent in [deep, *deep.parents]:
        if parent == state:
            break
        parent.rmdir()
    assert checkpoint.save_sync(state).seq == 1


def test_a_long_restore_prefix_is_refused_at_save_time(tmp_path: Path) -> None:
    state = make_state(tmp_path / "state", 1)
    (state / ("q" * 200)).mkdir()
    (state / ("q" * 200) / ("f" * 200)).write_bytes(b"x")
    local = deep_dir(tmp_path, 3800)  # this trainer's own restore directory is that deep
    local.mkdir(parents=True)
    checkpoint = Checkpoint((tmp_path / "store").as_uri(), path=local, spool_dir=tmp_path / "sp")
    with pytest.raises(CheckpointError, match="could not be restored under"):
        checkpoint.save(state)


# -- item 4: any failure of a store client is a store error -------------------------------------


def test_a_truncated_large_blob_falls_back_to_the_previous_commit(
    line_uri: str, tmp_path: Path
) -> None:
    writer = new_checkpoint(line_uri, tmp_path / "writer", keep=5)
    writer.save_sync(make_state(tmp_path / "state1", 1))
    state = make_state(tmp_path / "state2", 2)
    (state / "big.bin").write_bytes(os.urandom(2 * PART_SIZE + 4096))  # fetched in ranges
    writer.save_sync(state)
    body = newest_body(writer.store)
    big = next(e for e in body["entries"] if e["path"] == "big.bin")
    writer.store.put_bytes(blob_key(big["digest"]), os.urandom(PART_SIZE // 16))
    assert restored_step(line_uri, tmp_path / "trainer") == 1


def _panic_class() -> type[BaseException]:
    """pyo3's PanicException (a BaseException), raised for real by obstore's in-memory store."""
    import obstore
    from obstore.store import MemoryStore

    memory = MemoryStore()
    obstore.put(memory, "k", b"x" * 10)
    try:
        obstore.get_ranges(memory, "k", starts=[0, 20], ends=[10, 30])
    except BaseException as error:  # noqa: BLE001 (that is the point)
        return type(error)
    raise AssertionError("obstore did not panic")


class _FailingObstore:
    """obstore's module as ObStore sees it, except that reading ``poisoned`` keys raises."""

    def __init__(self, real: Any, poisoned: set[str], failure: Callable[[], BaseException]) -> None:
        self._real, self._poisoned, self._failure = real, poisoned, failure

    def __getattr__(self, name: str) -> Any:
        operation = getattr(self._real, name)

        def call(store: Any, *args: Any, **kwargs: Any) -> Any:
            if name in ("get", "get_ranges") and args and args[0] in self._poisoned:
                raise self._failure()
            return operation(store, *args, **kwargs)

        return call


def test_an_obstore_panic_is_a_store_error_and_load_falls_back(
    s3_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(contract.ENV_STORE_CLIENT, "obstore")
    store = commit_two(s3_uri, tmp_path)
    panic = _panic_class()
    newest = {blob_key(e["digest"]) for e in newest_body(store)["entries"] if e["kind"] == "file"}
    first = decode_manifest(store.get_bytes(manifest_key(1)))
    newest -= {blob_key(e["digest"]) for e in first["entries"] if e["kind"] == "file"}
    obstore_store: Any = open_store(s3_uri)
    real = obstore_store._obstore
    key = sorted(newest)[0]
    for failure, raised in ((KeyboardInterrupt, KeyboardInterrupt), (SystemExit, SystemExit)):
        obstore_store._obstore = _FailingObstore(real, newest, failure)
        with pytest.raises(raised):  # the interpreter's own exits are never swallowed
            obstore_store.get_bytes(key)
    obstore_store._obstore = _FailingObstore(real, newest, lambda: panic("range start > end"))
    with pytest.raises(UnexpectedStoreFailure, match="PanicException: range start > end"):
        obstore_store.get_bytes(key)
    restored = restore_newest(obstore_store, tmp_path / "restored")
    assert restored is not None and restored.commit.seq == 1


def test_any_failure_of_the_stdlib_client_is_a_store_error(
    s3_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import http.client

    from durapipe.runtime.s3 import StdlibS3Store

    store = StdlibS3Store(s3_uri)
    store.put_bytes("manifests/000000000001.json", b"{}")

    class Strange(BaseException):
        pass

    def strange(*_: Any, **__: Any) -> Any:
        raise Strange("a client library bug")

    with monkeypatch.context() as patch:
        patch.setattr(http.client.HTTPConnection, "getresponse", strange)
        with pytest.raises(UnexpectedStoreFailure, match="Strange: a client library bug"):
            store.get_bytes("manifests/000000000001.json")
    with monkeypatch.context() as patch:
        patch.setattr(http.client.HTTPConnection, "getresponse",
                      lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):
            store.get_bytes("manifests/000000000001.json")
    with monkeypatch.context() as patch:  # a listing that is not XML (a captive proxy, say)
        patch.setattr(store, "_request", lambda *_, **__: (200, {}, b"<html>hello"))
        with pytest.raises(UnexpectedStoreFailure, match="ParseError"):
            store.list(MANIFEST_DIR)
