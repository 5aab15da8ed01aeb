"""Multi-node stages run one process per GPU under torchrun, all sharing one checkpoint line:
only global rank 0 writes it (one writer, whatever each rank's code calls), and the processes
of a node, which share the checkpoint path, each restore into a directory of their own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from durapipe.runtime import contract
from durapipe.runtime.checkpoint import Checkpoint
from durapipe.runtime.manifest import MANIFEST_DIR, decode_manifest
from durapipe.runtime.store import open_store

REPO = Path(__file__).resolve().parents[2]

#: What every rank of a DDP script does: restore, then save its (identical) state.
RANK_PROGRAM = r"""
import json, os, sys, time
from pathlib import Path
from durapipe.runtime.checkpoint import Checkpoint

uri, local, step = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
checkpoint = Checkpoint(uri, path=local, spool_dir=local / "spool")
restored = checkpoint.load_sync()
seen = json.loads((restored / "state.json").read_text()) if restored else None
# A barrier, as a collective would be: no rank saves before every rank has restored.
barrier, world = Path(sys.argv[4]), int(os.environ["WORLD_SIZE"])
(barrier / os.environ["RANK"]).touch()
while len(list(barrier.iterdir())) < world:
    time.sleep(0.01)
state = local / f"state-{os.environ['RANK']}"
state.mkdir(parents=True, exist_ok=True)
(state / "state.json").write_text(json.dumps({"step": step, "rank": os.environ["RANK"]}))
commit = checkpoint.save_sync(state, metadata={"step": step})
checkpoint.close()
print(json.dumps({"rank": int(os.environ["RANK"]), "restored": seen,
                  "restored_into": str(restored) if restored else None,
                  "commit": None if commit is None else commit.seq}))
"""


def run_ranks(uri: str, local: Path, step: int, world: int, per_node: int) -> list[dict]:
    """``world`` processes as torchrun starts them, ``per_node`` to a node sharing ``local``."""
    procs = []
    barrier = local / "barrier"
    barrier.mkdir(parents=True)
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank % per_node),
               "WORLD_SIZE": str(world), "PYTHONPATH": str(REPO)}
        node_dir = local / f"node-{rank // per_node}"
        procs.append(subprocess.Popen(
            [sys.executable, "-c", RANK_PROGRAM, uri, str(node_dir), str(step), str(barrier)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return sorted(results, key=lambda r: r["rank"])


def committed_states(uri: str) -> list[tuple[int, dict]]:
    store = open_store(uri)
    states = []
    for key in sorted(store.list(MANIFEST_DIR)):
        body = decode_manifest(store.get_bytes(key))
        states.append((body["metadata"]["step"], body))
    return states


def test_only_rank_zero_commits_and_every_rank_restores_its_state(tmp_path: Path) -> None:
    uri = (tmp_path / "store").as_uri()
    first = run_ranks(uri, tmp_path / "run1", step=5, world=4, per_node=2)
    assert [r["commit"] for r in first] == [1, None, None, None]
    assert [r["restored"] for r in first] == [None] * 4
    commits = committed_states(uri)
    assert [step for step, _ in commits] == [5], "one commit: rank 0's, and only rank 0's"

    # A restart of the whole set: four processes restore at once, two of them on each node
    # into the same checkpoint path, and every one reads rank 0's state.
    second = run_ranks(uri, tmp_path / "run2", step=10, world=4, per_node=2)
    assert [r["restored"] for r in second] == [{"step": 5, "rank": "0"}] * 4
    into = [Path(r["restored_into"]) for r in second]
    assert [p.name for p in into] == ["restored", "restored.local-rank-1"] * 2
    assert len(set(into)) == 4
    assert [r["commit"] for r in second] == [2, None, None, None]
    assert [step for step, _ in committed_states(uri)] == [5, 10]


def test_without_torchrun_the_only_process_is_the_writer(tmp_path: Path) -> None:
    checkpoint = Checkpoint((tmp_path / "store").as_uri(), path=tmp_path / "local", env={})
    assert checkpoint.is_writer and checkpoint.rank == checkpoint.local_rank == 0
    handle = checkpoint.save(b"state")
    commit = handle.wait()
    assert commit is not None and commit.seq == 1
    checkpoint.close()


def test_a_skipped_save_stages_nothing_and_flush_does_not_wait(tmp_path: Path) -> None:
    local = tmp_path / "local"
    checkpoint = Checkpoint((tmp_path / "store").as_uri(), path=local, uploader="sidecar",
                            env={contract.ENV_RANK: "3", contract.ENV_LOCAL_RANK: "1"})
    assert not checkpoint.is_writer
    handle = checkpoint.save(b"state")
    assert handle.done() and handle.wait() is None
    checkpoint.flush(timeout=0.1)  # nothing pending: returns at once, no agent needed
    assert not (local / ".spool").exists() or not any((local / ".spool").rglob("*.json"))


@pytest.mark.parametrize("value", ["one", "-1", "1.5"])
def test_a_rank_that_is_not_a_rank_is_refused(tmp_path: Path, value: str) -> None:
    with pytest.raises(ValueError, match="RANK"):
        Checkpoint((tmp_path / "store").as_uri(), path=tmp_path, env={"RANK": value})
