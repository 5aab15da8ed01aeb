"""The runtime's report of an attempt's first restore (``DURAPIPE_RESUME_REPORT``), which the
cluster reads as the pod's ``resumed-from`` output and the local runner from the attempt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from durapipe.runtime import contract, resume_report
from durapipe.runtime.checkpoint import Checkpoint
from durapipe.runtime.manifest import decode_manifest, manifest_key
from durapipe.runtime.restore import list_commits
from durapipe.runtime.store import open_store


def _checkpoint(tmp_path: Path, report: Path, rank: str = "0") -> Checkpoint:
    env = {contract.ENV_RESUME_REPORT: str(report), contract.ENV_RANK: rank}
    return Checkpoint((tmp_path / "line").as_uri(), path=tmp_path / f"work-{rank}", env=env)


def test_the_first_restore_reports_the_line_commit_and_step(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh.json"
    first = _checkpoint(tmp_path, fresh)
    assert first.load_sync() is None
    line = (tmp_path / "line").as_uri()
    assert json.loads(fresh.read_text()) == {"line": line, "seq": None, "step": None, "epoch": None}
    assert resume_report.read_text(fresh) == ""
    for step in (1, 2):
        first.save_sync(b"state %d" % step, metadata={"step": step})
    first.close()
    again = tmp_path / "again.json"
    assert _checkpoint(tmp_path, again).load_sync() is not None
    assert json.loads(again.read_text()) == {"line": line, "seq": 2, "step": 2, "epoch": None}
    assert resume_report.read_text(again) == "#2 (step 2)"


def test_only_rank_0_reports(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    assert _checkpoint(tmp_path, report, rank="1").load_sync() is None
    assert not report.exists()


def test_what_is_no_report_reads_as_none() -> None:
    for text in ("", "not json", "[]", '{"seq": 3}'):
        assert resume_report.parse(text) is None
    assert resume_report.describe({"line": "s3://b/l", "seq": 4, "step": None}) == "#4"
    assert resume_report.describe({"line": "s3://b/l", "seq": 4, "epoch": 2}) == "#4 (epoch 2)"


def test_an_earlier_runs_line_is_restored_from_while_the_own_line_is_empty(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    earlier = (tmp_path / "earlier").as_uri()
    old = Checkpoint(earlier, path=tmp_path / "old")
    old.save_sync(b"trained 8 steps", metadata={"step": 8})
    old.close()
    own = (tmp_path / "own").as_uri()
    report = tmp_path / "report.json"
    env = {contract.ENV_STAGE: "train", contract.ENV_RESUME_REPORT: str(report),
           contract.ENV_CHECKPOINT_RESUME_FROM: json.dumps({"train": earlier, "eval": own})}
    resumed = Checkpoint(own, path=tmp_path / "new", env=env)
    restored = resumed.load_sync()
    assert restored is not None and restored.read_bytes() == b"trained 8 steps"
    assert json.loads(report.read_text())["line"] == earlier
    resumed.save_sync(b"trained 9 steps", metadata={"step": 9})
    resumed.close()
    # Commits go to the own line; the earlier one is only read.
    assert _commit_metadata(earlier) == [{"step": 8}]
    assert _commit_metadata(own) == [{"step": 9}]
    # Once the own line has a commit, it wins.
    again = Checkpoint(own, path=tmp_path / "again", env=env).load_sync()
    assert again is not None and again.read_bytes() == b"trained 9 steps"
    # A value that is no such object is said and ignored.
    for bad in ("not json", '["train"]', '{"train": 3}'):
        with caplog.at_level("ERROR", logger="durapipe.checkpoint"):
            fresh = Checkpoint((tmp_path / f"fresh-{len(bad)}").as_uri(), path=tmp_path / "f",
                               env={**env, contract.ENV_CHECKPOINT_RESUME_FROM: bad})
        assert fresh.resume_from is None
        assert contract.ENV_CHECKPOINT_RESUME_FROM in caplog.text
        caplog.clear()


def _commit_metadata(uri: str) -> list[Any]:
    store = open_store(uri)
    return [decode_manifest(store.get_bytes(manifest_key(seq)))["metadata"]
            for seq in list_commits(store)]
