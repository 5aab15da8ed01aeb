"""The checkpoint store: save/load of bytes, files and trees, retention, dedupe, fallbacks."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from durapipe.runtime import contract
from durapipe.runtime.checkpoint import (
    Checkpoint,
    CheckpointError,
    latest_checkpoint,
    restore_newest,
)
from durapipe.runtime.manifest import BLOB_DIR, MANIFEST_DIR, blob_key, manifest_key
from durapipe.runtime.hashing import hash_tree
from durapipe.runtime.store import (
    PART_SIZE,
    LocalStore,
    Store,
    TransientStoreError,
    open_store,
)
from tests.runtime.runtime_helpers import child_env, runtime_cmd


def make_state(root: Path, step: int, frozen: bytes = b"tokenizer" * 1000) -> Path:
    (root / "shards").mkdir(parents=True, exist_ok=True)
    (root / "shards" / "weights.bin").write_bytes(step.to_bytes(8, "little") * 4096)
    (root / "frozen.bin").write_bytes(frozen)
    (root / "step.json").write_text(json.dumps({"step": step}))
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "last").symlink_to("step.json") if not (root / "last").is_symlink() else None
    return root


def new_checkpoint(uri: str, local: Path, **options: Any) -> Checkpoint:
    return Checkpoint(uri, path=local, spool_dir=local / "spool", **options)


def manifests(store: Store) -> list[str]:
    return store.list(MANIFEST_DIR)


def test_first_attempt_loads_none(store_uri: str, tmp_path: Path) -> None:
    assert new_checkpoint(store_uri, tmp_path / "a").load() is None


def test_bytes_round_trip(store_uri: str, tmp_path: Path) -> None:
    writer = new_checkpoint(store_uri, tmp_path / "w")
    commit = writer.save(b"\x00state\xff", metadata={"step": 7}).wait()
    assert commit.seq == 1
    reader = new_checkpoint(store_uri, tmp_path / "r")
    restored = reader.load()
    assert restored is not None and restored.read_bytes() == b"\x00state\xff"
    assert reader.restored_commit is not None
    assert reader.restored_commit.metadata == {"step": 7}


def test_file_round_trip_keeps_the_name(store_uri: str, tmp_path: Path) -> None:
    source = tmp_path / "model.pt"
    source.write_bytes(os.urandom(100_000))
    new_checkpoint(store_uri, tmp_path / "w").save_sync(source)
    restored = new_checkpoint(store_uri, tmp_path / "r").load_sync()
    assert restored is not None and restored.name == "model.pt"
    assert restored.read_bytes() == source.read_bytes()


def test_tree_round_trip_is_identical(store_uri: str, tmp_path: Path) -> None:
    state = make_state(tmp_path / "state", 3)
    new_checkpoint(store_uri, tmp_path / "w").save_sync(state)
    restored = new_checkpoint(store_uri, tmp_path / "r").load_sync()
    assert restored is not None and restored.is_dir()
    assert hash_tree(restored) == hash_tree(state)
    assert os.access(restored / "run.sh", os.X_OK)
    assert os.readlink(restored / "last") == "step.json"
    # Modification times come back too, so "newest file" lookups in the tree still work.
    for name in ("step.json", "shards/weights.bin"):
        assert (restored / name).stat().st_mtime_ns == (state / name).stat().st_mtime_ns


def test_newest_of_several_commits_is_loaded_and_only_k_are_kept(
    store_uri: str, tmp_path: Path
) -> None:
    writer = new_checkpoint(store_uri, tmp_path / "w", keep=2)
    for step in range(1, 6):
        # Every state has a different "frozen" file, so old blobs become garbage.
        state = make_state(tmp_path / f"s{step}", step, frozen=bytes([step]) * 5000)
        assert writer.save_sync(state, metadata={"step": step}).seq == step
    store = writer.store
    assert manifests(store) == [manifest_key(4), manifest_key(5)]
    # 2 commits x 4 distinct files (run.sh is shared) -> 2*3 + 1 blobs.
    assert len(store.list(BLOB_DIR)) == 7
    restored = new_checkpoint(store_uri, tmp_path / "r").load_sync()
    assert restored is not None
    assert json.loads((restored / "step.json").read_text()) == {"step": 5}


def test_unchanged_files_are_not_uploaded_again(store_uri: str, tmp_path: Path) -> None:
    writer = new_checkpoint(store_uri, tmp_path / "w")
    state = make_state(tmp_path / "state", 1)
    first = writer.save_sync(state)
    again = writer.save_sync(state)
    assert first.uploaded_bytes > 0
    assert again.uploaded_bytes == 0 and again.reused_bytes == first.uploaded_bytes
    make_state(state, 2)  # only weights.bin and step.json change
    changed = writer.save_sync(state)
    weights = (state / "shards" / "weights.bin").stat().st_size
    assert changed.uploaded_bytes == weights + (state / "step.json").stat().st_size


def test_large_files_use_parallel_parts(store_uri: str, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(2 * PART_SIZE + 12345))
    new_checkpoint(store_uri, tmp_path / "w").save_sync(big)
    restored = new_checkpoint(store_uri, tmp_path / "r").load_sync()
    assert restored is not None and restored.read_bytes() == big.read_bytes()


def test_async_api(store_uri: str, tmp_path: Path) -> None:
    async def train() -> tuple[Path | None, Path | None]:
        checkpoint = new_checkpoint(store_uri, tmp_path / "w")
        first = await checkpoint.load()
        await checkpoint.save(b"async state")
        again = new_checkpoint(store_uri, tmp_path / "r")
        return first, await again.load()

    first, second = asyncio.run(train())
    assert first is None
    assert second is not None and second.read_bytes() == b"async state"


def test_background_save_returns_before_the_upload_and_flush_waits(
    tmp_path: Path,
) -> None:
    gate = threading.Event()

    class SlowStore(LocalStore):
        def put_file(
            self, key: str, path: Path, *, consume: bool = False, digest: str | None = None
        ) -> str:
            gate.wait(30)
            return super().put_file(key, path, consume=consume, digest=digest)

    checkpoint = Checkpoint("mem://", path=tmp_path / "w", store=SlowStore(tmp_path / "store"))
    handle = checkpoint.save(b"state")
    # The caller got control back while the upload is blocked.
    assert not handle.done()
    assert restore_newest(LocalStore(tmp_path / "store"), tmp_path / "r") is None
    gate.set()
    checkpoint.flush()
    assert handle.done() and handle.wait().seq == 1


def test_a_newer_pending_save_supersedes_a_queued_one(tmp_path: Path) -> None:
    uploading, gate = threading.Event(), threading.Event()

    class SlowStore(LocalStore):
        def put_file(
            self, key: str, path: Path, *, consume: bool = False, digest: str | None = None
        ) -> str:
            uploading.set()
            gate.wait(30)
            return super().put_file(key, path, consume=consume, digest=digest)

    checkpoint = Checkpoint("x://", path=tmp_path / "w", store=SlowStore(tmp_path / "store"))
    handles = [checkpoint.save(b"state 0")]
    assert uploading.wait(30)
    handles += [checkpoint.save(f"state {i}".encode()) for i in range(1, 4)]
    gate.set()
    commits = [h.wait() for h in handles]
    # The first was already uploading; 2 and 3 waited together, and the newest covered both.
    assert commits[0].seq == 1
    assert commits[1].seq == commits[2].seq == commits[3].seq == 2
    restored = Checkpoint("x://", path=tmp_path / "r", store=LocalStore(tmp_path / "store"))
    path = restored.load_sync()
    assert path is not None and path.read_bytes() == b"state 3"


# -- fallbacks ----------------------------------------------------------------------------------


def committed_three(uri: str, tmp_path: Path) -> Store:
    writer = new_checkpoint(uri, tmp_path / "w", keep=5)
    for step in (1, 2, 3):
        writer.save_sync(make_state(tmp_path / f"s{step}", step))
    return writer.store


def restored_step(uri: str, local: Path) -> int:
    restored = new_checkpoint(uri, local).load_sync()
    assert restored is not None
    return int(json.loads((restored / "step.json").read_text())["step"])


def test_torn_newest_manifest_falls_back_to_the_previous(store_uri: str, tmp_path: Path) -> None:
    store = committed_three(store_uri, tmp_path)
    body = store.get_bytes(manifest_key(3))
    store.put_bytes(manifest_key(4), body[: len(body) // 2])
    store.put_bytes(manifest_key(5), body.replace(b'"step"', b'"stop"'))
    assert restored_step(store_uri, tmp_path / "r") == 3


def test_missing_or_corrupt_blob_falls_back_to_the_previous(store_uri: str, tmp_path: Path) -> None:
    store = committed_three(store_uri, tmp_path)
    newest = json.loads(store.get_bytes(manifest_key(3)))["body"]
    weights = next(e for e in newest["entries"] if e["path"] == "shards/weights.bin")
    step_file = next(e for e in newest["entries"] if e["path"] == "step.json")
    store.delete(blob_key(weights["digest"]))
    assert restored_step(store_uri, tmp_path / "r1") == 2
    # Same size, different bytes: only the digest check can tell.
    previous = json.loads(store.get_bytes(manifest_key(2)))["body"]
    step_file_2 = next(e for e in previous["entries"] if e["path"] == "step.json")
    original = store.get_bytes(blob_key(step_file_2["digest"]))
    store.put_bytes(blob_key(step_file_2["digest"]), original.replace(b"2", b"9"))
    assert restored_step(store_uri, tmp_path / "r2") == 1
    assert step_file["digest"] != step_file_2["digest"]


def test_no_verifying_checkpoint_raises_instead_of_returning_none(tmp_path: Path) -> None:
    uri = (tmp_path / "store").as_uri()
    store = committed_three(uri, tmp_path)
    for key in store.list(BLOB_DIR):
        store.delete(key)
    with pytest.raises(CheckpointError, match="no committed checkpoint verifies"):
        new_checkpoint(uri, tmp_path / "r").load_sync()


class FlakyStore:
    """Wraps a store; the first ``failures`` calls of the listed operations raise."""

    def __init__(self, inner: Store, failures: int, operations: tuple[str, ...]) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.failures = failures
        self.operations = operations
        self.calls = 0

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.inner, name)
        if name not in self.operations:
            return method  # type: ignore[no-any-return]

        def flaky(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.failures > 0:
                self.failures -= 1
                raise TransientStoreError(f"injected failure of {name}")
            return method(*args, **kwargs)

        return flaky


def test_transient_load_errors_are_retried(tmp_path: Path) -> None:
    store = committed_three((tmp_path / "store").as_uri(), tmp_path)
    flaky = FlakyStore(store, failures=3, operations=("list", "get_bytes", "get_file"))
    restored = restore_newest(flaky, tmp_path / "r", sleep=lambda _: None)  # type: ignore[arg-type]
    assert restored is not None and restored.commit.seq == 3


def test_persistent_load_errors_raise_and_never_mean_no_checkpoint(tmp_path: Path) -> None:
    store = committed_three((tmp_path / "store").as_uri(), tmp_path)
    for operation in ("list", "get_bytes", "get_file"):
        flaky = FlakyStore(store, failures=10**6, operations=(operation,))
        with pytest.raises(TransientStoreError):
            restore_newest(flaky, tmp_path / "r", sleep=lambda _: None)  # type: ignore[arg-type]


def test_s3_errors_for_an_unreachable_endpoint_are_transient(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("obstore", reason="obstore is the S3 client; it is in the test extra")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "x"),
        ("AWS_SECRET_ACCESS_KEY", "x"),
        ("AWS_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    store = open_store("s3://nowhere/prefix", retry_config={"max_retries": 0})
    with pytest.raises(TransientStoreError):
        restore_newest(store, tmp_path / "r", attempts=2, sleep=lambda _: None)


def test_latest_checkpoint_picks_the_newest_match(tmp_path: Path) -> None:
    assert latest_checkpoint(None) is None
    for index, name in enumerate(("a/last.ckpt", "b/c/last.ckpt", "last.ckpt")):
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(name)
        os.utime(target, ns=(index * 10**9, [2, 3, 1][index] * 10**9))
    assert latest_checkpoint(tmp_path) == tmp_path / "b/c/last.ckpt"
    steps = [tmp_path / f"checkpoint-{n}" for n in (5, 40, 300)]
    for step in steps:
        step.mkdir()
    assert (
        latest_checkpoint(tmp_path, "checkpoint-*", key=lambda p: int(p.name.split("-")[1]))
        == steps[-1]
    )


def test_checkpoint_from_env(tmp_path: Path) -> None:
    env = {
        contract.ENV_CHECKPOINT_URI: (tmp_path / "store").as_uri(),
        contract.ENV_CHECKPOINT_PATH: str(tmp_path / "local"),
        contract.ENV_CHECKPOINT_KEEP: "4",
        contract.ENV_SPOOL_DIR: str(tmp_path / "spool"),
    }
    checkpoint = Checkpoint.from_env(env)
    assert checkpoint is not None
    assert (checkpoint.keep, checkpoint.path, checkpoint.spool_dir) == (
        4,
        tmp_path / "local",
        tmp_path / "spool",
    )
    assert Checkpoint.from_env({}) is None


# -- the sidecar agent --------------------------------------------------------------------------


def start_agent(spool: Path, uri: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        runtime_cmd("agent", "--spool", str(spool), "--uri", uri, "--poll-seconds", "0.02"),
        env=env,
    )


def wait_for_heartbeat(spool: Path) -> None:
    """The agent writes its heartbeat after installing its SIGTERM handler."""
    for _ in range(3000):
        if (spool / "agent.json").exists():
            return
        time.sleep(0.01)
    raise AssertionError("the agent did not start")


def test_sidecar_agent_commits_what_the_trainer_staged(store_uri: str, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    env = child_env(
        **{k: v for k, v in os.environ.items() if k.startswith("AWS_")},
        **{contract.ENV_GRACE_SECONDS: "20"},
    )
    agent = start_agent(spool, store_uri, env)
    try:
        trainer = Checkpoint(
            store_uri, path=tmp_path / "w", spool_dir=spool, uploader="sidecar", keep=2
        )
        state = make_state(tmp_path / "state", 1)
        assert trainer.save(state).wait(timeout=60).seq == 1
        for step in (2, 3):
            make_state(state, step)
            trainer.save(state)
        trainer.flush(timeout=60)
    finally:
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == 0
    assert restored_step(store_uri, tmp_path / "r") == 3


def test_the_upload_agent_runs_until_sigterm(tmp_path: Path) -> None:
    """The agent has no end of its own: with the trainer gone and the spool drained it keeps
    running until SIGTERM. So in a pod no wait container tends (a JobSet's), a plain sidecar
    would hold the pod Running for ever; the compiler makes it a native sidecar, and the e2e
    watcher plays a plain one as still running (tests/e2e/fates.py)."""
    uri = (tmp_path / "store").as_uri()
    spool = tmp_path / "spool"
    agent = start_agent(spool, uri, child_env(**{contract.ENV_GRACE_SECONDS: "20"}))
    try:
        wait_for_heartbeat(spool)
        trainer = Checkpoint(uri, path=tmp_path / "w", spool_dir=spool, uploader="sidecar")
        assert trainer.save(b"last").wait(timeout=60).seq == 1
        assert not list((spool / "pending").iterdir())
        del trainer
        for _ in range(20):  # 2 s with nothing to do
            assert agent.poll() is None, "the agent ended without a SIGTERM"
            time.sleep(0.1)
    finally:
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == 0


def test_state_handed_to_the_agent_survives_the_trainer_being_killed(
    tmp_path: Path,
) -> None:
    uri = (tmp_path / "store").as_uri()
    spool = tmp_path / "spool"
    # The trainer stages its final state and is SIGKILLed at once (as by an OOM kill); the
    # agent is started only afterwards and on SIGTERM still drains the spool before exiting.
    trainer = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import os, signal\n"
                "from durapipe.runtime.checkpoint import Checkpoint\n"
                f"cp = Checkpoint({uri!r}, path={str(tmp_path / 'w')!r},"
                f" spool_dir={str(spool)!r}, uploader='sidecar')\n"
                "cp.save(b'final words')\n"
                "os.kill(os.getpid(), signal.SIGKILL)\n"
            ),
        ],
        env=child_env(),
        check=False,
    )
    assert trainer.returncode == -signal.SIGKILL
    agent = start_agent(spool, uri, child_env(**{contract.ENV_GRACE_SECONDS: "20"}))
    wait_for_heartbeat(spool)
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=60) == 0
    restored = new_checkpoint(uri, tmp_path / "r").load_sync()
    assert restored is not None and restored.read_bytes() == b"final words"
    assert not list((spool / "pending").iterdir())


def test_a_failed_upload_is_reported_to_the_waiter_and_later_saves_still_work(
    tmp_path: Path,
) -> None:
    failures = [RuntimeError("disk on fire")]

    class BrokenOnce(LocalStore):
        def put_file(
            self, key: str, path: Path, *, consume: bool = False, digest: str | None = None
        ) -> str:
            if failures:
                raise failures.pop()
            return super().put_file(key, path, consume=consume, digest=digest)

    checkpoint = Checkpoint("x://", path=tmp_path / "w", store=BrokenOnce(tmp_path / "store"))
    with pytest.raises(CheckpointError, match="disk on fire"):
        checkpoint.save(b"lost").wait(timeout=60)
    assert checkpoint.save(b"kept").wait(timeout=60).seq == 1
    restored = new_checkpoint((tmp_path / "store").as_uri(), tmp_path / "r").load_sync()
    assert restored is not None and restored.read_bytes() == b"kept"


def test_saves_handed_over_are_uploaded_before_the_interpreter_exits(tmp_path: Path) -> None:
    uri = (tmp_path / "store").as_uri()
    code = (
        "from durapipe.runtime.checkpoint import Checkpoint\n"
        f"cp = Checkpoint({uri!r}, path={str(tmp_path / 'w')!r})\n"
        "for step in range(5):\n"
        "    cp.save(f'step {step}'.encode())\n"
        # no close(), no flush(): the script just ends
    )
    subprocess.run([sys.executable, "-c", code], env=child_env(), check=True)
    restored = new_checkpoint(uri, tmp_path / "r").load_sync()
    assert restored is not None and restored.read_bytes() == b"step 4"


def test_s3_transient_server_errors_are_retried(
    s3_uri: str, s3_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.runtime.faults import FaultProxy

    # The first attempt of every distinct request (method and URL) is answered 503 SlowDown:
    # every single operation meets a transient server error on the real protocol.
    proxy = FaultProxy(s3_env["AWS_ENDPOINT_URL"], first_attempt="503")
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    monkeypatch.setattr(time, "sleep", lambda _seconds: None)  # our backoff
    try:
        # obstore's own retries are off, so the 503s reach durapipe's retry layer.
        def flaky_store() -> Store:
            return open_store(s3_uri, retry_config={"max_retries": 0})

        writer = Checkpoint(s3_uri, path=tmp_path / "w", store=flaky_store(), keep=2)
        for step in (1, 2, 3):
            writer.save_sync(make_state(tmp_path / f"s{step}", step), metadata={"step": step})
        reader = Checkpoint(s3_uri, path=tmp_path / "r", store=flaky_store())
        restored = reader.load_sync()
    finally:
        proxy.close()
    assert proxy.failed >= 20, "the proxy failed too few requests"
    assert restored is not None
    assert json.loads((restored / "step.json").read_text()) == {"step": 3}
    assert reader.restored_commit is not None and reader.restored_commit.seq == 3
