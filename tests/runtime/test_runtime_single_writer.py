"""One writer per checkpoint line, enforced: the newest writer's claim fences out an older
one (an attempt's zombie), and retention never deletes a blob a returned commit needs.
Rows of docs/runtime.md's guarantees table.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from durapipe.runtime import commit as commit_module
from durapipe.runtime.checkpoint import (
    CheckpointError,
    Committer,
    LineTakenOver,
    restore_newest,
    stage,
)
from durapipe.runtime.manifest import BLOB_DIR, MANIFEST_DIR, blob_key, decode_manifest
from durapipe.runtime.store import LocalStore, Store, open_store
from tests.runtime.test_runtime_hostile_lines import make_state, new_checkpoint, restored_step


def test_a_second_writer_takes_the_line_and_the_first_is_refused(tmp_path: Path) -> None:
    uri = (tmp_path / "store").as_uri()
    first = new_checkpoint(uri, tmp_path / "first", keep=1)
    first.save_sync(make_state(tmp_path / "s1", 1))
    second = new_checkpoint(uri, tmp_path / "second", keep=1)
    second.save_sync(make_state(tmp_path / "s2", 2))
    with pytest.raises(CheckpointError, match="another writer took over this checkpoint line"):
        first.save_sync(make_state(tmp_path / "s3", 3))
    assert second.save_sync(make_state(tmp_path / "s4", 4)).seq == 3
    assert restored_step(uri, tmp_path / "reader") == 4
    assert_no_manifest_dangles(LocalStore(tmp_path / "store"))


def assert_no_manifest_dangles(store: Store, returned: set[int] | None = None) -> None:
    """Every manifest in the store (of a commit that returned) has all its blobs."""
    for key in store.list(MANIFEST_DIR):
        if returned is not None and int(key.rsplit("/", 1)[1].split(".")[0]) not in returned:
            continue
        body = decode_manifest(store.get_bytes(key))
        for entry in body["entries"]:
            if entry["kind"] == "file":
                assert store.size(blob_key(entry["digest"])) == entry["size"], (key, entry)


class _PausingStore:
    """A store that holds a writer just before it writes its manifest, until released."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.at_manifest, self.release = threading.Event(), threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        if key.startswith(MANIFEST_DIR):
            self.at_manifest.set()
            assert self.release.wait(30)
        self.inner.put_bytes(key, data, create_only=create_only)


def _staged(tmp_path: Path, step: int, unique: bytes) -> Path:
    state = make_state(tmp_path / f"st{step}-{uuid.uuid4().hex[:6]}", step)
    (state / "unique.bin").write_bytes(unique)
    return stage(state, tmp_path / "spool")


def test_a_commit_racing_a_second_writer_never_returns_with_a_deleted_blob(
    tmp_path: Path,
) -> None:
    """The first writer has uploaded its blobs and is about to write its manifest when a second
    writer commits and collects garbage (keep=1): without a single-writer rule the second
    deletes the first's fresh blobs, and the first then returns a commit that dangles."""
    local = LocalStore(tmp_path / "store")
    paused = _PausingStore(local)
    first = Committer(paused, keep=1)  # type: ignore[arg-type]
    paused.release.set()
    first.commit(_staged(tmp_path, 1, b"one"))
    paused.release.clear()
    outcome: dict[str, Any] = {}

    def commit_first() -> None:
        try:
            outcome["commit"] = first.commit(_staged(tmp_path, 2, b"two"))
        except CheckpointError as error:
            outcome["error"] = error

    paused.at_manifest.clear()
    thread = threading.Thread(target=commit_first, daemon=True)
    thread.start()
    assert paused.at_manifest.wait(30)
    second = Committer(local, keep=1)
    for step in (3, 4):
        second.commit(_staged(tmp_path, step, b"second writer %d" % step))
    paused.release.set()
    thread.join(30)
    assert "commit" not in outcome, "the first writer returned a commit after losing the line"
    assert isinstance(outcome.get("error"), LineTakenOver)
    assert "another writer took over this checkpoint line" in str(outcome["error"])
    assert_no_manifest_dangles(local)
    restored = restore_newest(local, tmp_path / "restored")
    assert restored is not None
    assert json.loads((restored.path / "step.json").read_text()) == {"step": 4}


def test_writers_taking_turns_leave_no_returned_commit_dangling(tmp_path: Path) -> None:
    """A new writer starts on the line while the previous one is still committing (a retry
    next to its zombie attempt), round after round: the older one is refused from the new
    one's first commit on, and no commit that returned ever references a deleted blob."""
    local = LocalStore(tmp_path / "store")
    returned: set[int] = set()
    refused: list[str] = []
    last_round = threading.Event()

    def run(committer: Committer, name: str, quiet: threading.Lock,
            committed: threading.Event) -> None:
        # Commits until refused or until the test ends. A fixed number of commits let a writer
        # on a busy machine run out before its successor's first commit (seen in CI); a writer
        # that is never refused is caught by the join below timing out instead.
        step = 0
        while not last_round.is_set():
            step += 1
            try:
                with quiet:
                    commit = committer.commit(_staged(tmp_path, step, f"{name}-{step}".encode()))
            except LineTakenOver:
                refused.append(name)
                return
            returned.add(commit.seq)
            committed.set()

    current: tuple[threading.Thread, threading.Lock] | None = None
    try:
        for round_number in range(8):
            quiet, committed = threading.Lock(), threading.Event()
            thread = threading.Thread(target=run, daemon=True, args=(
                Committer(local, keep=2), f"w{round_number}", quiet, committed))
            thread.start()
            # The new writer claims the line after the previous one did (two claims at the same
            # moment are ordered by their random ids instead, and either may win).
            assert committed.wait(60)
            if current is not None:
                current[0].join(120)
                assert not current[0].is_alive()
            current = (thread, quiet)
            with quiet:  # between two commits of the writer that holds the line
                assert_no_manifest_dangles(local, returned)
        assert current is not None
    finally:
        last_round.set()  # also stops every writer when an assertion above failed
    current[0].join(120)
    assert_no_manifest_dangles(local, returned)
    # Every writer but the last was refused once its successor committed.
    assert sorted(refused) == [f"w{n}" for n in range(7)]


class _PausingListStore:
    """A store that, once armed, holds the next listing of blobs (a writer collecting garbage)
    until released, and then lists what is there by then."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.armed, self.at_list, self.release = False, threading.Event(), threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def list(self, prefix: str) -> list[str]:
        if self.armed and prefix == BLOB_DIR:
            self.armed = False
            self.at_list.set()
            assert self.release.wait(30)
        return self.inner.list(prefix)


def test_garbage_collection_running_as_a_new_writer_claims_the_line_keeps_its_fresh_blobs(
    tmp_path: Path,
) -> None:
    """The first writer passed its last check and collects garbage while a second writer
    claims the line and commits: the blobs the second uploaded are not referenced by any
    manifest the first has read, and must still not be deleted under it."""
    local = LocalStore(tmp_path / "store")
    paused = _PausingListStore(local)
    first = Committer(paused, keep=1)  # type: ignore[arg-type]
    first.commit(_staged(tmp_path, 1, b"one"))
    paused.armed = True
    thread = threading.Thread(target=first.commit, args=(_staged(tmp_path, 2, b"two"),))
    thread.start()
    assert paused.at_list.wait(30)
    Committer(local, keep=1).commit(_staged(tmp_path, 3, b"the second writer's own"))
    paused.release.set()
    thread.join(30)
    assert_no_manifest_dangles(local)
    restored = restore_newest(local, tmp_path / "restored")
    assert restored is not None and restored.commit.seq == 3
    with pytest.raises(LineTakenOver):
        first.commit(_staged(tmp_path, 4, b"four"))


def test_a_blob_no_manifest_references_is_collected_once_older_than_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a killed writer uploaded without committing is not kept for ever."""
    local = LocalStore(tmp_path / "store")
    committer = Committer(local, keep=1)
    committer.commit(_staged(tmp_path, 1, b"one"))
    leftover = blob_key(f"sha256:{'ab' * 32}")
    local.put_bytes(leftover, b"uploaded by a writer killed before its manifest")
    committer.commit(_staged(tmp_path, 2, b"two"))
    assert local.size(leftover) is not None  # young: it may be a commit still uploading
    monkeypatch.setattr(commit_module, "UNREFERENCED_BLOB_GRACE_SECONDS", 0.0)
    committer.commit(_staged(tmp_path, 3, b"three"))
    assert local.size(leftover) is None
    assert_no_manifest_dangles(local)


def test_every_store_says_when_an_object_was_written(line_uri: str) -> None:
    store = open_store(line_uri)
    assert store.modified("blobs/nothing-here") is None
    store.put_bytes("blobs/old", b"1")
    old = store.modified("blobs/old")
    time.sleep(1.1)  # S3's Last-Modified has whole seconds
    store.put_bytes("blobs/new", b"2")
    new = store.modified("blobs/new")
    assert old is not None and new is not None and old < new
    assert abs(new - time.time()) < 600  # the store's clock, near ours here
