"""Property tests of the checkpoint manifest decoder and of restoring what it accepts.

Manifests are untrusted input (anyone who can write the line's prefix can plant one with a
matching checksum), so: the decoder raises nothing but ``ValueError`` on any bytes; a restore
of any checksum-valid body either restores exactly that body or falls back to the previous
commit, and creates nothing outside its directory; and every tree a save can produce is
accepted and restored identically (a false rejection would also let retention delete the
blobs of a good commit).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durapipe.runtime.checkpoint import Checkpoint, restore_newest
from durapipe.runtime.manifest import decode_manifest, encode_manifest, manifest_key
from durapipe.runtime.hashing import default_algorithm, hash_bytes, hash_tree
from durapipe.runtime.manifest import MANIFEST_FORMAT
from durapipe.runtime.store import LocalStore

FUZZ = settings(deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
ALGORITHM = default_algorithm()
BLOB = b"fuzzed checkpoint data\n"
DIGEST = hash_bytes(BLOB, ALGORITHM)


@pytest.fixture(scope="module")
def line(tmp_path_factory: pytest.TempPathFactory) -> tuple[LocalStore, Path]:
    """A local line holding one intact commit (seq 1) and the blob fuzzed entries point at."""
    root = tmp_path_factory.mktemp("manifest-fuzz")
    (root / "outside").mkdir()
    state = root / "state"
    state.mkdir()
    (state / "step.json").write_bytes(BLOB)
    writer = Checkpoint(str(root / "store"), path=root / "writer")
    writer.save_sync(state)
    writer.close()
    return LocalStore(root / "store", fsync=False), root


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                 max_size=3),
    max_leaves=6,
)


def hostile_text(outside: Path) -> st.SearchStrategy[str]:
    return st.sampled_from([
        "a", "b", "a/b", "a/b/c", "step.json", "payload", "", ".", "..", "a/../b", "a//b", "/",
        str(outside), str(outside / "planted"), "../outside", "../../outside/planted",
        "x" * 256, "/".join(["d" * 250] * 17), "a\0b", "\u00e9t\u00e9", "\udc80", "a/",
    ]) | st.text(alphabet="ab./\0", max_size=10)


def valid_entries(outside: Path) -> st.SearchStrategy[list[dict[str, Any]]]:
    """Entries as a save writes them, with link targets an attacker would pick."""
    path = st.lists(st.sampled_from(["a", "b", "c", "step.json"]), min_size=1, max_size=3)
    file = st.fixed_dictionaries({
        "kind": st.just("file"), "executable": st.booleans(),
        "size": st.sampled_from([len(BLOB), len(BLOB), 0]),
        "digest": st.sampled_from([DIGEST, DIGEST, f"{ALGORITHM}:{'0' * 64}"]),
    }, optional={"mtime_ns": st.integers(-(2**63), 2**63 - 1)})
    link = st.fixed_dictionaries({
        "kind": st.just("symlink"), "executable": st.just(False), "size": st.just(0),
        "digest": st.sampled_from([str(outside), "../../outside", "../" * 8, "a", "a/b"]),
    })
    directory = st.fixed_dictionaries({
        "kind": st.just("dir"), "executable": st.just(False), "size": st.just(0),
        "digest": st.just(""),
    })
    entry = st.tuples(path.map("/".join), file | link | directory).map(
        lambda pair: dict(pair[1], path=pair[0]))
    return st.lists(entry, max_size=6, unique_by=lambda e: str(e["path"]))


ENTRY_FIELDS = ["path", "kind", "executable", "size", "digest", "mtime_ns", "stored"]
BODY_FIELDS = ["format", "kind", "name", "algorithm", "metadata", "entries"]


@st.composite
def bodies(draw: st.DrawFn, outside: Path) -> dict[str, Any]:
    """A body a save could write, then up to three hostile or random edits of it."""
    junk = json_values | hostile_text(outside) | st.integers(-(2**70), 2**70)
    entries = draw(valid_entries(outside))
    body: dict[str, Any] = {"format": MANIFEST_FORMAT, "kind": "dir", "name": "",
                            "algorithm": ALGORITHM, "metadata": {}, "entries": entries}
    if entries and entries[0]["kind"] == "file" and draw(st.booleans()):
        single = dict(entries[0], path=draw(st.sampled_from(["payload", "model.pt"])))
        body.update(entries=[single], kind="bytes" if single["path"] == "payload" else "file",
                    name=single["path"])
    for _ in range(draw(st.integers(0, 3))):
        entries = body["entries"]
        if isinstance(entries, list) and entries and draw(st.booleans()):
            entry = entries[draw(st.integers(0, len(entries) - 1))]
            if isinstance(entry, dict):
                entry[draw(st.sampled_from(ENTRY_FIELDS))] = draw(junk)
        elif isinstance(entries, list) and draw(st.booleans()):
            entries.append(draw(junk))
        else:
            body[draw(st.sampled_from(BODY_FIELDS))] = draw(junk)
    return body


@settings(FUZZ, max_examples=300)
@given(data=st.binary(max_size=600) | st.builds(lambda v: json.dumps(v).encode(), json_values))
def test_the_decoder_raises_only_value_errors_on_any_bytes(data: bytes) -> None:
    try:
        decode_manifest(data)
    except ValueError:
        pass


@settings(FUZZ, max_examples=400)
@given(data=st.data())
def test_a_restore_of_any_checksummed_body_is_that_body_or_a_fallback_and_stays_inside(
    line: tuple[LocalStore, Path], data: st.DataObject
) -> None:
    store, root = line
    body = data.draw(bodies(root / "outside"))
    store.put_bytes(manifest_key(2), encode_manifest(dict(body, seq=2)))
    try:
        accepted = decode_manifest(store.get_bytes(manifest_key(2)))
    except ValueError:
        accepted = None
    local = root / f"trainer-{uuid.uuid4().hex[:8]}"
    try:
        restored = restore_newest(store, local / "restored")
        assert restored is not None
        if accepted is None:
            assert restored.commit.seq == 1
        elif restored.commit.seq == 2:  # else its data did not verify: a fallback too
            assert_restored_as_written(local / "restored", accepted)
        assert list((root / "outside").iterdir()) == []
        assert sorted(p.name for p in local.iterdir()) == ["restored"]
    finally:
        shutil.rmtree(local, ignore_errors=True)


def assert_restored_as_written(restored: Path, body: dict[str, Any]) -> None:
    found = {
        p.relative_to(restored).as_posix(): p for p in restored.rglob("*")
    }
    listed = {e["path"]: e for e in body["entries"]}
    # Ancestors need not be listed; everything else on disk is an entry.
    assert set(listed) <= set(found)
    for path, entry in listed.items():
        on_disk = found[path]
        if entry["kind"] == "symlink":
            assert on_disk.is_symlink() and os.readlink(on_disk) == entry["digest"]
        elif entry["kind"] == "dir":
            assert on_disk.is_dir() and not on_disk.is_symlink()
        else:
            assert on_disk.is_file() and not on_disk.is_symlink()
            assert on_disk.read_bytes() == BLOB
    for path, on_disk in found.items():
        assert path in listed or (on_disk.is_dir() and not on_disk.is_symlink())


names = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="/\0"),
    min_size=1, max_size=12,
).filter(lambda name: name not in (".", "..") and len(name.encode()) <= 255)


@st.composite
def trees(draw: st.DrawFn) -> list[tuple[str, str, str]]:
    """(kind, relative path, content or link target) of a tree a user could save."""
    entries: list[tuple[str, str, str]] = []
    dirs = [""]
    taken: set[str] = set()
    for _ in range(draw(st.integers(1, 8))):
        parent = draw(st.sampled_from(dirs))
        name = draw(names)
        path = f"{parent}/{name}" if parent else name
        if path in taken:
            continue
        taken.add(path)
        kind = draw(st.sampled_from(["file", "dir", "symlink"]))
        if kind == "dir":
            dirs.append(path)
        if kind == "symlink":
            content = draw(st.sampled_from(["x", "../..", "/etc/passwd", name]))
        else:
            content = draw(st.text(max_size=20))
        entries.append((kind, path, content))
    return entries


@settings(FUZZ, max_examples=60)
@given(tree=trees())
def test_every_tree_a_save_produces_is_accepted_and_restored_identically(
    tmp_path: Path, tree: list[tuple[str, str, str]]
) -> None:
    work = tmp_path / uuid.uuid4().hex[:8]
    state = work / "state"
    state.mkdir(parents=True)
    for kind, path, content in tree:
        target = state / path
        if kind == "dir":
            target.mkdir()
        elif kind == "symlink":
            target.symlink_to(content)
        else:
            target.write_text(content)
    uri = str(work / "store")
    writer = Checkpoint(uri, path=work / "writer")
    writer.save_sync(state)
    writer.close()
    store = LocalStore(work / "store")
    decode_manifest(store.get_bytes(manifest_key(1)))  # accepted as it was written
    restored = Checkpoint(uri, path=work / "reader").load_sync()
    assert restored is not None and hash_tree(restored) == hash_tree(state)
    shutil.rmtree(work)
