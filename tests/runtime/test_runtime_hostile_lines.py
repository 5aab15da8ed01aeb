"""Hostile or broken checkpoint lines: planted and malformed manifests, paths too long to
restore.

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

from durapipe.runtime.checkpoint import (
    Checkpoint,
    CheckpointError,
    decode_manifest,
    encode_manifest,
    manifest_key,
)
from durapipe.runtime.manifest import MAX_RELATIVE_PATH_BYTES
from durapipe.runtime.store import Store


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
