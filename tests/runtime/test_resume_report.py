"""The runtime's report of an attempt's first restore (``DURAPIPE_RESUME_REPORT``), which the
cluster reads as the pod's ``resumed-from`` output and the local runner from the attempt."""

from __future__ import annotations

import json
from pathlib import Path

from durapipe.runtime import contract, resume_report
from durapipe.runtime.checkpoint import Checkpoint


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
