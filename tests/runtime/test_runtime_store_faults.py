"""A store that misbehaves: full disks, corrupt blobs, outages, silence, damaged bytes.

Each test is a row of the guarantees table in docs/runtime.md.  Faults come from
tests/runtime/faults.py: a proxy in front of moto's S3 server (on 127.0.0.1), a store wrapper,
and a real small tmpfs.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durapipe.runtime import agent as agent_module
from durapipe.runtime import contract
from durapipe.runtime import checkpoint as cp
from durapipe.runtime.manifest import BLOB_DIR, MANIFEST_DIR
from durapipe.runtime.restore import list_commits
from durapipe.runtime.spool import STAGED_FILES, pending_requests
from durapipe.runtime.store import LocalStore, Store, StoreError, open_store
from tests.runtime.faults import FaultProxy, OutageStore, is_blob_get, is_blob_put, small_tmpfs

FROZEN = b"frozen-embedding" * 4096


def make_state(root: Path, step: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "frozen.bin").write_bytes(FROZEN)
    (root / "weights.bin").write_bytes(step.to_bytes(8, "little") * 4096)
    (root / "step.json").write_text(json.dumps({"step": step}))
    return root


def restored_step(store: Store, where: Path) -> int | None:
    restored = cp.restore_newest(store, where)
    if restored is None:
        return None
    assert (restored.path / "frozen.bin").read_bytes() == FROZEN
    step = int(json.loads((restored.path / "step.json").read_text())["step"])
    assert (restored.path / "weights.bin").read_bytes() == step.to_bytes(8, "little") * 4096
    return step


def in_thread(action: Any, timeout: float) -> tuple[bool, Any]:
    """Run ``action`` on a daemon thread; (finished within ``timeout``, result or exception)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = action()
        except BaseException as error:  # noqa: BLE001 (handed to the test)
            box["value"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    return not thread.is_alive(), box.get("value")


@pytest.fixture
def proxy(s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """A fault proxy in front of moto; stores opened while it lives go through it."""
    faults = FaultProxy(s3_env["AWS_ENDPOINT_URL"])
    monkeypatch.setenv("AWS_ENDPOINT_URL", faults.endpoint)
    try:
        yield faults
    finally:
        faults.close()


def direct_store(uri: str, s3_env: dict[str, str]) -> Store:
    """The bucket as it is, past the proxy."""
    return open_store(uri, endpoint=s3_env["AWS_ENDPOINT_URL"])


# -- a full disk --------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs: ENOSPC from the kernel, not a simulation."""
    try:
        with small_tmpfs(tmp_path / "disk", "4m") as mount:
            yield mount
    except OSError as error:
        pytest.skip(f"a small tmpfs is needed for a real full disk (root can mount): {error}")


def test_a_save_that_fills_the_disk_fails_and_leaves_the_store_as_it_was(
    small_disk: Path, tmp_path: Path
) -> None:
    store = LocalStore(small_disk / "store")
    checkpoint = cp.Checkpoint(store.uri, path=tmp_path / "w", store=store, keep=1)
    checkpoint.save_sync(os.urandom(1 << 20))
    usage = sorted(store.list(""))
    big = tmp_path / "big"
    big.mkdir()
    for name in ("a.bin", "b.bin"):  # the first fits, the second does not
        (big / name).write_bytes(os.urandom(3 << 19))
    with pytest.raises(cp.CheckpointError, match="No space left"):
        checkpoint.save(big).wait(timeout=60)
    # Nothing of the failed save is left: no temporary, no blob no manifest refers to.
    leftovers = [p.name for p in small_disk.rglob("*") if p.is_file()]
    assert sorted(store.list("")) == usage
    assert not [name for name in leftovers if name.startswith(".tmp-")]
    # So a save that fits beside the committed one still succeeds.
    commit = checkpoint.save_sync(os.urandom(3 << 19))
    assert commit.seq == 2
    restored = cp.restore_newest(store, tmp_path / "r")
    assert restored is not None and restored.commit.seq == 2


def test_temporaries_a_killed_writer_left_are_swept_by_the_next_commit(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    (store.root / BLOB_DIR).mkdir(parents=True)
    stale, live = store.root / BLOB_DIR / ".tmp-dead", store.root / BLOB_DIR / ".tmp-live"
    stale.write_bytes(b"x" * 1000)
    live.write_bytes(b"y")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    cp.Committer(store).commit(cp.stage(b"state", tmp_path / "spool"))
    assert not stale.exists() and live.exists()


# -- a corrupt blob -----------------------------------------------------------------------------


def test_a_corrupt_deduplicated_blob_is_detected_before_reuse_uploaded_again_and_reported(
    store_uri: str, tmp_path: Path
) -> None:
    store = open_store(store_uri)
    checkpoint = cp.Checkpoint(store_uri, path=tmp_path / "w", store=store, keep=3)
    state = make_state(tmp_path / "state", 1)
    checkpoint.save_sync(state, metadata={"step": 1})
    [frozen_key] = [k for k in store.list(BLOB_DIR) if store.get_bytes(k) == FROZEN]
    # A same-size bit flip in the blob every later save shares.
    damaged = bytearray(FROZEN)
    damaged[1000] ^= 0x01
    store.put_bytes(frozen_key, bytes(damaged))
    commits = [
        checkpoint.save_sync(make_state(state, step), metadata={"step": step}) for step in (2, 3)
    ]
    assert restored_step(store, tmp_path / "r") == 3
    assert store.get_bytes(frozen_key) == FROZEN
    assert commits[0].repaired == (frozen_key,) and commits[1].repaired == ()


def test_a_corrupt_staged_file_is_never_committed(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    spool = tmp_path / "spool"
    request = cp.stage(make_state(tmp_path / "state", 1), spool)
    staged = request / STAGED_FILES / "frozen.bin"
    data = bytearray(staged.read_bytes())
    data[7] ^= 0x40
    staged.write_bytes(bytes(data))
    os.link(staged, tmp_path / "second-name")  # forces a copy, which is hashed on the way
    with pytest.raises((cp.CheckpointError, StoreError), match="frozen.bin"):
        cp.Committer(store).commit(request)
    assert list_commits(store) == []


def test_bits_flipped_on_the_way_down_are_downloaded_again_not_a_fallback(
    s3_uri: str, proxy: FaultProxy, tmp_path: Path
) -> None:
    store = open_store(s3_uri)
    writer = cp.Checkpoint(s3_uri, path=tmp_path / "w", store=store)
    for step in (1, 2):
        writer.save_sync(make_state(tmp_path / "state", step), metadata={"step": step})
    proxy.inject("flip_download", requests=1, match=is_blob_get)
    restored = cp.restore_newest(store, tmp_path / "r")
    assert proxy.injected == {"flip_download": 1}
    assert restored is not None and restored.commit.seq == 2


# -- a handed-over state and a restarted agent ----------------------------------------------------


class Killed(BaseException):
    """Stands for SIGKILL at one exact point (the real kills are in the crash test)."""


def test_a_state_handed_to_an_agent_killed_mid_commit_is_committed_by_the_next_one(
    tmp_path: Path,
) -> None:
    spool = tmp_path / "spool"  # the local store is on the same filesystem as the spool
    store = LocalStore(tmp_path / "store")

    class DiesBeforeTheManifest(LocalStore):
        def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> None:
            if key.startswith(MANIFEST_DIR):
                raise Killed
            super().put_bytes(key, data, create_only=create_only)

    sender = cp.Checkpoint(store.uri, path=tmp_path / "w", spool_dir=spool, uploader="sidecar")
    handles = [sender.save(make_state(tmp_path / f"s{i}", i), {"step": i}) for i in (1, 2)]
    first = agent_module.UploadAgent(spool, DiesBeforeTheManifest(tmp_path / "store"))
    with pytest.raises(Killed):
        first.drain_once()
    assert list_commits(store) == []
    restarted = agent_module.UploadAgent(spool, store)
    restarted.drain_once()
    assert [h.wait(timeout=30).seq for h in handles] == [1, 1]
    assert restored_step(store, tmp_path / "r") == 2


# -- an outage, silence -------------------------------------------------------------------------


def test_the_agent_retries_a_failing_commit_until_the_store_is_back(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    store = OutageStore(LocalStore(tmp_path / "store"))
    store.outage(3.0)  # longer than the store layer's own retries (under a second)
    uploader = agent_module.UploadAgent(spool, store)  # type: ignore[arg-type]
    thread = threading.Thread(target=uploader.run, kwargs={"poll_seconds": 0.05}, daemon=True)
    thread.start()
    try:
        sender = cp.Checkpoint(store.uri, path=tmp_path / "w", spool_dir=spool, uploader="sidecar")
        commit = sender.save(make_state(tmp_path / "s", 1), {"step": 1}).wait(timeout=30)
    finally:
        uploader.stopping.set()
        thread.join(30)
    assert store.failures > 5 and commit.seq == 1
    assert restored_step(LocalStore(tmp_path / "store"), tmp_path / "r") == 1


def test_the_agent_reports_what_it_could_not_commit_by_its_deadline(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    store = OutageStore(LocalStore(tmp_path / "store"))
    store.outage(3600)
    uploader = agent_module.UploadAgent(spool, store, grace_seconds=4.0)  # type: ignore[arg-type]
    sender = cp.Checkpoint(store.uri, path=tmp_path / "w", spool_dir=spool, uploader="sidecar")
    handle = sender.save(make_state(tmp_path / "s", 1), {"step": 1})
    uploader.stopping.set()  # SIGTERM
    started = time.monotonic()
    finished, _ = in_thread(lambda: uploader.run(poll_seconds=0.05), 30)
    assert finished and time.monotonic() - started < 4.0
    with pytest.raises(cp.CheckpointError, match="deadline.*injected outage"):
        handle.wait(timeout=5)
    # Still staged: a restarted agent could commit it.
    assert pending_requests(spool)


def stop_requested_now(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, grace: float) -> None:
    """As the wrapper does on SIGTERM: the stop file (its mtime is when), and the grace."""
    control = tmp_path / "control"
    control.mkdir()
    (control / contract.CONTROL_STOP_FILE).touch()
    monkeypatch.setenv(contract.ENV_CONTROL_DIR, str(control))
    monkeypatch.setenv(contract.ENV_GRACE_SECONDS, str(grace))


def test_a_final_save_against_a_store_that_never_answers_reports_before_the_grace_period_ends(
    s3_uri: str, proxy: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stop_requested_now(tmp_path, monkeypatch, grace=6)
    checkpoint = cp.Checkpoint(s3_uri, path=tmp_path / "w")
    proxy.inject("stall")
    checkpoint.save(make_state(tmp_path / "s", 1))
    started = time.monotonic()
    finished, outcome = in_thread(checkpoint.flush, 30)
    elapsed = time.monotonic() - started
    with contextlib.suppress(cp.CheckpointError):
        checkpoint.close()  # stops the upload thread's retries
    assert finished, "flush() without a timeout waited on a silent store for 30 s"
    assert elapsed < 6.0
    assert isinstance(outcome, TimeoutError) and isinstance(outcome, cp.CheckpointError)
    assert "not committed within" in str(outcome)


def test_waiting_on_a_sidecar_that_is_not_there_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stop_requested_now(tmp_path, monkeypatch, grace=4)
    store = LocalStore(tmp_path / "store")
    sender = cp.Checkpoint(store.uri, path=tmp_path / "w", uploader="sidecar")
    handle = sender.save(b"state")
    finished, outcome = in_thread(handle.wait, 30)
    assert finished and isinstance(outcome, cp.CheckpointError)
    finished, outcome = in_thread(sender.flush, 30)
    assert finished and isinstance(outcome, TimeoutError)


def test_before_a_stop_a_wait_is_bounded_by_many_grace_periods(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(contract.ENV_GRACE_SECONDS, "0.05")  # 60 of them: 3 s
    sender = cp.Checkpoint(LocalStore(tmp_path / "store").uri, path=tmp_path / "w",
                           uploader="sidecar")
    started = time.monotonic()
    finished, outcome = in_thread(sender.save(b"state").wait, 30)
    assert finished and isinstance(outcome, cp.CheckpointDeadlineExceeded)
    assert 2.5 < time.monotonic() - started < 20


def test_the_agent_stops_at_its_deadline_while_the_store_never_answers(
    s3_uri: str, proxy: FaultProxy, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    uploader = agent_module.UploadAgent(spool, open_store(s3_uri), grace_seconds=5.0)
    sender = cp.Checkpoint(s3_uri, path=tmp_path / "w", spool_dir=spool, uploader="sidecar")
    proxy.inject("stall")
    handle = sender.save(b"final state")
    uploader.stopping.set()
    started = time.monotonic()
    finished, _ = in_thread(lambda: uploader.run(poll_seconds=0.05), 30)
    elapsed = time.monotonic() - started
    assert finished and elapsed < 5.0
    with pytest.raises(cp.CheckpointError, match="deadline"):
        handle.wait(timeout=5)


def test_a_stale_partial_staging_does_not_hold_the_agent(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    partial = spool / "pending" / "00000000000000000001-999999-000000.partial"
    (partial / STAGED_FILES).mkdir(parents=True)
    (partial / STAGED_FILES / "half.bin").write_bytes(b"x" * 1000)
    old = time.time() - 120
    for path in (partial / STAGED_FILES / "half.bin", partial / STAGED_FILES, partial):
        os.utime(path, (old, old))
    uploader = agent_module.UploadAgent(spool, LocalStore(tmp_path / "store"), grace_seconds=30)
    uploader.stopping.set()
    started = time.monotonic()
    finished, _ = in_thread(lambda: uploader.run(poll_seconds=0.05), 40)
    assert finished and time.monotonic() - started < 5.0
    # One still being written does hold it (until it goes quiet).
    (partial / STAGED_FILES / "half.bin").write_bytes(b"x" * 2000)
    assert agent_module._trainer_may_still_save(spool)


# -- S3 answering badly -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "requests"),
    [
        ("latency", 20),
        ("reset", 3),
        ("503", 6),
        ("500", 6),
        ("truncate", 2),
        ("truncate_upload", 2),
        ("flip_upload", 2),
    ],
)
def test_s3_faults_never_tear_or_lose_a_commit(
    fault: str,
    requests: int,
    s3_uri: str,
    proxy: FaultProxy,
    s3_env: dict[str, str],
    tmp_path: Path,
) -> None:
    clean = direct_store(s3_uri, s3_env)
    checkpoint = cp.Checkpoint(s3_uri, path=tmp_path / "w", keep=2)
    state = tmp_path / "state"
    last = 0
    for step in range(1, 5):
        match = is_blob_put if fault.endswith("_upload") else None
        proxy.inject(fault, requests=requests, match=match)
        try:
            checkpoint.save(make_state(state, step), {"step": step}).wait(timeout=60)
            last = step
        except cp.CheckpointError:
            pass
        proxy.heal()
        assert restored_step(clean, tmp_path / "r") == last
    assert proxy.injected.get(fault, 0) > 0
    assert last == 4, f"{fault}: the commit protocol gave up on a fault that passes"


def test_a_403_burst_is_retried_and_a_lasting_one_is_reported_at_the_deadline(
    s3_uri: str, proxy: FaultProxy, s3_env: dict[str, str], tmp_path: Path
) -> None:
    clean = direct_store(s3_uri, s3_env)
    checkpoint = cp.Checkpoint(s3_uri, path=tmp_path / "w")
    checkpoint.save_sync(make_state(tmp_path / "s", 1))
    proxy.inject("403", seconds=2.0)  # credentials being rotated
    assert checkpoint.save(make_state(tmp_path / "s", 2)).wait(timeout=30).seq == 2
    assert proxy.injected["403"] > 0
    proxy.inject("403", seconds=600)  # a bucket policy that shuts us out
    with pytest.raises(cp.CheckpointDeadlineExceeded, match="403 Forbidden|AccessDenied"):
        checkpoint.save(make_state(tmp_path / "s", 3)).wait(timeout=3)
    assert restored_step(clean, tmp_path / "r") == 2
    proxy.heal()
    # Step 3 is still being retried in the background: it is superseded if step 4 is queued
    # before its next try (seq 3 is then step 4's), or commits first if that try comes in
    # between (seen in CI under load). Either way the newest commit is step 4's.
    assert checkpoint.save(make_state(tmp_path / "s", 4)).wait(timeout=30).seq in (3, 4)
    assert restored_step(clean, tmp_path / "r") == 4


def test_random_store_faults_keep_the_newest_commit_restorable(
    s3_uri: str, proxy: FaultProxy, s3_env: dict[str, str], tmp_path: Path
) -> None:
    rng = random.Random(20261201)
    clean = direct_store(s3_uri, s3_env)
    faults = ["latency", "reset", "503", "500", "403", "truncate", "truncate_upload", "flip_upload"]
    checkpoint = cp.Checkpoint(s3_uri, path=tmp_path / "w", keep=2)
    committed = 0
    for step in range(1, 13):
        proxy.inject(rng.choice(faults), requests=rng.randint(1, 4))
        try:
            checkpoint.save(make_state(tmp_path / "s", step), {"step": step}).wait(timeout=60)
            committed = step
        except cp.CheckpointError:
            pass
        proxy.heal()
        assert restored_step(clean, tmp_path / "r") == (committed or None)
    assert committed >= 8
