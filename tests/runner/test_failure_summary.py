"""What `durapipe run` says when a stage fails, and how it numbers attempts (issue 11)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from durapipe.cli import main

FAILING = """\
pipeline "fails" {}

stage "boom" {
  image   = "python:3.12"
  command = ["python3", "-c", "import os, sys; print('attempt', os.environ['DURAPIPE_ATTEMPT']); sys.exit('no such column: churned')"]
  retry { attempts = 1 }
}
"""


def test_a_failed_stage_says_why_and_numbers_attempts_as_durapipe_attempt(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    pipe = tmp_path / "fails.pipe"
    pipe.write_text(FAILING)
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    assert main(["run", str(pipe), "--home", str(home), "--plain"]) == 1
    err = capsys.readouterr().err
    row = next(line for line in err.splitlines() if line.startswith("boom "))
    assert "failed" in row and "app_failure" in row
    # The child's own last words, without opening the attempt log.
    assert "| no such column: churned" in err
    # One numbering: the attempt directories, the summary's #N and DURAPIPE_ATTEMPT agree.
    (run_dir,) = (home / "runs").iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    numbers = [a["number"] for a in record["stages"]["boom"]["attempts"]]
    assert len(numbers) == 2
    for number in numbers:
        log = (run_dir / "boom" / f"attempt-{number}" / "log").read_text()
        assert f"attempt {number}" in log
        assert f"    #{number} rung 0" in err
