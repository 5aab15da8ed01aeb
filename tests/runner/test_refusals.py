"""`durapipe run` refuses what `durapipe check` and `compile` refuse (issue 22): the lowering's
checks (P04xx) too, with the same diagnostics and exit code, before anything runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from durapipe.cli import main

REPO = Path(__file__).resolve().parents[2]
#: The lowering's cases that default options refuse (P0401 needs Argo 3.7, P0408 `--kind
#: cron`: neither is something `run` is asked for).
CASES = sorted(p for p in (REPO / "tests" / "compiler" / "cases").glob("P04*.pipe")
               if p.name[:5] not in {"P0401", "P0408"})


def _check_then_run(path: str, home: Path,
                    capsys: pytest.CaptureFixture[str]) -> tuple[int, str, int, str]:
    checked = main(["check", path])
    check_err = capsys.readouterr().err
    ran = main(["run", path, "--home", str(home), "--plain"])
    return checked, check_err, ran, capsys.readouterr().err


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_run_refuses_a_lowering_error_as_check_does(
        case: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    shown = case.relative_to(REPO).as_posix()
    home = tmp_path / "home"
    checked, check_err, ran, run_err = _check_then_run(shown, home, capsys)
    assert checked == 1
    assert case.name[:5] in check_err
    assert (ran, run_err) == (checked, check_err)
    assert not (home / "runs").exists()


def test_a_refused_multi_node_stage_never_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A P0407 file used to run locally (rank 0 of 1) although no cluster would take it."""
    marker = tmp_path / "ran"
    pipe = tmp_path / "multi.pipe"
    pipe.write_text(f"""\
pipeline "multi" {{}}

stage "pretrain" {{
  image   = "python:3.12"
  command = ["{sys.executable}", "-c", "open('{marker}', 'w').write('x')"]
  resources {{ cpu = 1 }}
  distributed {{ replicas = 2 }}
  outputs {{ model = "/out/model" }}
}}
""")
    monkeypatch.chdir(tmp_path)
    checked, check_err, ran, run_err = _check_then_run("multi.pipe", tmp_path / "home", capsys)
    assert checked == ran == 1
    assert "P0407" in run_err and run_err == check_err
    assert not marker.exists()
    assert not (tmp_path / "home").exists()


def test_a_pipeline_check_accepts_still_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    pipe = tmp_path / "ok.pipe"
    pipe.write_text(f"""\
pipeline "ok" {{}}

stage "say" {{
  image   = "python:3.12"
  command = ["{sys.executable}", "-c", "print('hello')"]
}}
""")
    monkeypatch.chdir(tmp_path)
    checked, _, ran, _ = _check_then_run("ok.pipe", tmp_path / "home", capsys)
    assert (checked, ran) == (0, 0)
