"""Every examples/*.pipe runs under `durapipe run` as it is, with the scripts kept next to it
(issue 11: the README's own example used to fail with exit code 1), and compiles from the same
file.  Work is tiny (stdlib only), so this stays fast."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from durapipe.cli import main
from durapipe.compiler import CompileOptions, compile_pipeline
from durapipe.dsl import load_path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PIPES = sorted(EXAMPLES.glob("*.pipe"))

#: torchrun's process launching without torch (workers and their ranks; no rendezvous, which
#: these scripts do not need); the real node runs PyTorch's own (tests/realnode).
TORCHRUN = (Path(__file__).resolve().parents[1] / "torchrun_standin.py").read_text()


def test_every_example_is_covered() -> None:
    assert {p.stem for p in PIPES} == {"gpu_fallback", "multinode_pretrain", "oom_escalation",
                                       "prep_train_eval", "spot_training"}


@pytest.mark.parametrize("pipe", PIPES, ids=lambda p: p.stem)
def test_example_runs_locally_and_compiles(pipe: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    torchrun = bin_dir / "torchrun"
    torchrun.write_text(f"#!{sys.executable}\n{TORCHRUN}")
    torchrun.chmod(torchrun.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    home = tmp_path / "home"
    code = main(["run", str(pipe), "--home", str(home), "--plain"])
    err = capsys.readouterr().err
    assert code == 0, err
    (run_dir,) = (home / "runs").iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "succeeded"
    if pipe.stem == "prep_train_eval":
        report = json.loads((run_dir / "eval" / "outputs" / "report" / "report.json").read_text())
        assert report["rows"] == 400 and 0.5 < report["accuracy"] <= 1.0
    loaded = load_path(str(pipe))
    assert loaded.pipeline is not None
    assert compile_pipeline(loaded.pipeline, CompileOptions()).ok
