"""Fault injection: killed savers and failing stores never lose the newest committed checkpoint.

``DURAPIPE_FAULT_KILLS`` scales the crash test (default 60 kills over four checkpoint lines),
``DURAPIPE_FAULT_ROUNDS`` the faulty-store test (default 300 faulty saves).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from durapipe.runtime.checkpoint import CheckpointError, Committer, restore_newest, stage
from durapipe.runtime.manifest import MANIFEST_DIR
from durapipe.runtime.store import LocalStore, Store, StoreError, TransientStoreError
from tests.runtime.crash import child_env as crash_child_env
from tests.runtime.crash import run_kills

ROUNDS = int(os.environ.get("DURAPIPE_FAULT_ROUNDS", "200"))
#: Kills of the crash test in CI; ``benchmarks/runtime_checkpoint.py --soak`` runs 1,000.
KILLS = int(os.environ.get("DURAPIPE_FAULT_KILLS", "60"))
FROZEN = b"frozen-embedding" * 4096


def newest_seq(store: Store) -> int | None:
    seqs = [int(k.rsplit("/", 1)[1].split(".")[0]) for k in store.list(MANIFEST_DIR)]
    return max(seqs) if seqs else None


def check_consistent(path: Path, metadata: dict[str, Any]) -> int:
    """The restored tree is one whole state: every file agrees on the step."""
    step = int(json.loads((path / "step.json").read_text())["step"])
    assert metadata == {"step": step}
    weights = (path / "shards" / "weights.bin").read_bytes()
    assert weights == step.to_bytes(8, "little") * (len(weights) // 8)
    assert (path / "frozen.bin").read_bytes() == FROZEN
    return step


def test_sigkill_at_random_points_of_save_commit_upload_and_hand_over_on_both_stores(
    s3_uri: str, s3_env: dict[str, str], tmp_path: Path
) -> None:
    counts = run_kills(
        tmp_path, KILLS, seed=20261201, s3_bucket_uri=s3_uri, env=crash_child_env(s3_env)
    )
    assert counts.torn == 0 and counts.lost == 0, "\n".join(counts.problems)
    # All four lines were exercised, agents included, and the kills interrupted progress.
    assert len([name for name in counts.kills if name.endswith("trainer")]) == 4
    assert len([name for name in counts.kills if name.endswith("agent")]) == 2
    assert sum(counts.landed.values()) >= KILLS // 10


class FaultyStore:
    """A local store whose writes and reads fail at random.

    Transient failures are retried by the protocol; "fatal" ones end the operation.  A failing
    ``put_file`` may first leave a truncated object behind, as a store without atomic puts would.
    """

    def __init__(self, inner: LocalStore, rng: random.Random, rate: float) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.parallel_files = inner.parallel_files
        self.rng = rng
        self.rate = rate

    def _maybe_fail(self, name: str, tear: Callable[[], None] | None = None) -> None:
        roll = self.rng.random()
        if roll < self.rate:
            if tear is not None and roll < self.rate / 2:
                tear()
            raise TransientStoreError(f"injected transient failure of {name}")
        if roll < self.rate * 1.3:
            raise StoreError(f"injected fatal failure of {name}")

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        self._maybe_fail("put_bytes")
        self.inner.put_bytes(key, data, create_only=create_only)

    def put_file(
        self, key: str, path: Path, *, consume: bool = False, digest: str | None = None
    ) -> str:
        def tear() -> None:
            data = path.read_bytes()
            self.inner.put_bytes(key, data[: len(data) // 2])

        self._maybe_fail("put_file", tear)
        return self.inner.put_file(key, path, consume=consume, digest=digest)

    def get_bytes(self, key: str) -> bytes:
        self._maybe_fail("get_bytes")
        return self.inner.get_bytes(key)

    def get_file(
        self, key: str, path: Path, size: int | None = None, *, algorithm: str | None = None
    ) -> str | None:
        self._maybe_fail("get_file")
        return self.inner.get_file(key, path, size, algorithm=algorithm)

    def fingerprint(self, key: str, algorithm: str) -> str | None:
        self._maybe_fail("fingerprint")
        return self.inner.fingerprint(key, algorithm)

    def size(self, key: str) -> int | None:
        self._maybe_fail("size")
        return self.inner.size(key)

    def list(self, prefix: str) -> list[str]:
        self._maybe_fail("list")
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self._maybe_fail("delete")
        self.inner.delete(key)


def test_store_errors_mid_upload_never_tear_or_lose_a_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(time, "sleep", lambda _seconds: None)  # retry backoff
    clean = LocalStore(tmp_path / "store", fsync=False)
    rng = random.Random(7)
    faulty = FaultyStore(clean, rng, rate=0.08)
    committer = Committer(faulty, keep=2)  # type: ignore[arg-type]
    spool = tmp_path / "spool"
    state = tmp_path / "state"
    committed_step, failures, load_errors = 0, 0, 0
    for step in range(1, int(ROUNDS * 1.5) + 1):
        (state / "shards").mkdir(parents=True, exist_ok=True)
        (state / "shards" / "weights.bin").write_bytes(step.to_bytes(8, "little") * 512)
        (state / "frozen.bin").write_bytes(FROZEN)
        (state / "step.json").write_text(json.dumps({"step": step}))
        request = stage(state, spool, {"step": step})
        try:
            committer.commit(request)
            committed_step = step
        except (StoreError, CheckpointError):
            failures += 1
        finally:
            import shutil

            shutil.rmtree(request, ignore_errors=True)
        restored = restore_newest(clean, tmp_path / "check")
        if committed_step == 0:
            assert restored is None
            continue
        assert restored is not None and restored.commit.seq == newest_seq(clean)
        # A failure after the manifest was written (during retention) still committed it.
        assert check_consistent(restored.path, restored.commit.metadata) >= committed_step
        # Loading through the failing store: the newest commit or a raised error, nothing else.
        try:
            through_faults = restore_newest(faulty, tmp_path / "check2")  # type: ignore[arg-type]
        except (StoreError, CheckpointError):
            load_errors += 1
        else:
            assert through_faults is not None
            assert through_faults.commit.seq == restored.commit.seq
    assert failures > 0 and load_errors > 0, "the injected faults never fired"
    assert committed_step > ROUNDS // 2


def test_a_collector_killed_at_random_beside_killed_writers_loses_nothing_and_tears_nothing(
    s3_uri: str, s3_env: dict[str, str], tmp_path: Path
) -> None:
    """#25 item 3: the crash test with a checkpoint collector in passes (`max_age` 0) beside
    the writers, SIGKILLed at a random moment of each round, often in the middle of removing
    a finished run's line: the writers' lines (their run has not finished) lose and tear
    nothing, what a killed collector leaves restores, and a final pass removes the rest."""
    counts = run_kills(tmp_path, KILLS // 2, seed=20261203, s3_bucket_uri=s3_uri,
                       env=crash_child_env(s3_env), collector=True)
    print(counts.summary())
    assert counts.torn == 0 and counts.lost == 0 and counts.dangling == 0, \
        "\n".join(counts.problems)
    assert not counts.problems, "\n".join(counts.problems)
    assert counts.kills["collector"] >= KILLS // 2
    # Finished runs' lines were written on both stores and all were collected in the end,
    # some by a collector that was then killed (the rest by the final pass).
    assert counts.finished_lines == 2 * len(range(0, KILLS // 2, 5))
    assert counts.collected == counts.finished_lines
    assert sum(counts.landed.values()) >= KILLS // 20
