"""The command line: exit codes, output streams, formats."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from durapipe.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_check_passes_on_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", *map(str, sorted((ROOT / "examples").glob("*.pipe")))]) == 0
    assert "5 files ok" in capsys.readouterr().err


def test_check_reports_errors_and_exits_1(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.pipe"
    bad.write_text('pipeline "x" {}\nstage "a" { image: "i" command = ["true"] }\n')
    assert main(["check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "error[P0101]" in err and f"{bad}:2:18" in err and "^" in err


def test_check_json_is_machine_readable(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.pipe"
    bad.write_text('pipeline "x" {}\nstage "a" { image = "i" command = ["true"] cpu = 1 }\n')
    assert main(["check", "--format", "json", str(bad)]) == 1
    (record,) = json.loads(capsys.readouterr().out)
    assert record["code"] == "P0201"
    assert (record["line"], record["column"], record["file"]) == (2, 44, str(bad))


def test_missing_file_is_a_diagnostic_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "/nonexistent/x.pipe"]) == 1
    err = capsys.readouterr().err
    assert "P0001" in err and "Traceback" not in err


def test_binary_file_is_a_diagnostic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.pipe"
    junk.write_bytes(bytes(range(256)) * 4)
    assert main(["check", str(junk)]) == 1
    assert "P0002" in capsys.readouterr().err


def test_explain(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "p0101"]) == 0
    assert capsys.readouterr().out.startswith("P0101: `:` used where `=` belongs")
    assert main(["explain", "P9999"]) == 2


def test_help_is_available_for_every_command() -> None:
    for command in ([], ["check"], ["fmt"], ["explain"], ["compile"], ["bound"]):
        run = subprocess.run([sys.executable, "-m", "durapipe", *command, "--help"],
                             capture_output=True, text=True, check=False)
        assert run.returncode == 0, run.stderr
        assert "usage: durapipe" in run.stdout


def test_examples_are_in_canonical_layout(capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted(str(p) for p in (ROOT / "examples").rglob("*.pipe"))
    assert main(["fmt", "--check", *files]) == 0, capsys.readouterr().out


def test_fmt_rewrites_in_place_and_check_reports_drift(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x.pipe"
    path.write_text('pipeline "x" {}\nstage "a" {\nimage="i"   # the image\ncommand=["true"]\n}\n')
    assert main(["fmt", "--check", str(path)]) == 1
    assert "+  image   = \"i\"  # the image" in capsys.readouterr().out
    assert main(["fmt", str(path)]) == 0
    assert path.read_text() == ('pipeline "x" {}\n\nstage "a" {\n  image   = "i"  # the image\n'
                                '  command = ["true"]\n}\n')
    assert main(["fmt", "--check", str(path)]) == 0


def test_compile_to_a_fifo_writes_through_it_and_leaves_it_a_fifo(tmp_path: Path) -> None:
    """`-o /dev/null` (tests/test_layering.py) renamed a temporary file onto the device:
    run as root, /dev/null became a regular file and broke every other process on the
    machine. A special file is written in place; a FIFO shows it without touching /dev."""
    import os
    import stat
    import threading

    fifo = tmp_path / "out.yaml"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    assert main(["compile", str(ROOT / "examples" / "prep_train_eval.pipe"), "-o", str(fifo)]) == 0
    reader.join(timeout=30)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert got and b"kind: Workflow" in got[0]
    assert not list(tmp_path.glob(".durapipe-*"))


# -- the size limit on .pipe input (issue 23, item 13) ------------------------------------------


def _just_too_large(tmp_path: Path) -> Path:
    """A valid pipeline padded with comments to one byte over the limit: every command would
    accept it but for its size."""
    from durapipe.dsl.source import MAX_SOURCE_BYTES

    path = tmp_path / "huge.pipe"
    pipeline = b'pipeline "p" {}\n\nstage "s" {\n  image   = "busybox"\n  command = ["true"]\n}\n'
    fill = MAX_SOURCE_BYTES + 1 - len(pipeline)
    path.write_bytes(pipeline + (b"# padding\n" * (fill // 10 + 1))[:fill - 1] + b"\n")
    assert path.stat().st_size == MAX_SOURCE_BYTES + 1
    return path


@pytest.mark.parametrize("command", [["check"], ["compile"], ["fmt"], ["graph"],
                                     ["run", "--home", "{home}"]], ids=lambda c: c[0])
def test_every_command_refuses_an_oversized_file_up_front_with_one_diagnostic(
        command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _just_too_large(tmp_path)
    before = path.read_bytes()
    argv = [command[0], str(path), *(a.format(home=tmp_path / "home") for a in command[1:])]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.err.count("error[") == 1, captured.err
    assert "error[P0003]" in captured.err
    assert f"--> {path}:1:1" in captured.err  # file:line:col, as every placed diagnostic
    assert f"{path.stat().st_size:,} bytes; the limit is 4,194,304 bytes (4 MiB)" in captured.err
    assert "kind: Workflow" not in captured.out and "flowchart" not in captured.out
    assert path.read_bytes() == before  # fmt left it alone
    assert not (tmp_path / "home").exists()  # run ran nothing


def test_a_file_at_the_limit_is_read_and_an_endless_one_is_refused() -> None:
    from durapipe.dsl.load import read_source
    from durapipe.dsl.source import MAX_SOURCE_BYTES

    source, problems = read_source("/dev/zero")  # read whole, it would never end
    assert source is None and [d.code for d in problems] == ["P0003"]
    assert "/dev/zero is larger than the limit of 4,194,304 bytes" in problems[0].message
    assert str(problems[0].span) == "/dev/zero:1:1"
    assert MAX_SOURCE_BYTES == 4 * 1024 * 1024  # docs/language.md and `explain P0003` say so


# -- directories, standard input, the list of codes (issue #27) --------------------------------

STAGE_CODE = "import torch  # a stage's program: not a pipeline\nraise SystemExit('not run')\n"
BUILDER = '''from durapipe.dsl.builder import Pipeline

p = Pipeline("from-builder")
p.stage("a", image="busybox", command=["true"])
pipeline = p
'''


def _repository(tmp_path: Path) -> Path:
    repo = tmp_path / "pipelines"
    (repo / "team-a").mkdir(parents=True)
    (repo / "team-a" / "train.pipe").write_text(
        'pipeline "train" {}\nstage "a" { image = "busybox" command = ["true"] }\n')
    (repo / "team-a" / "train_step.py").write_text(STAGE_CODE)
    (repo / "builder.py").write_text(BUILDER)
    (repo / "__pycache__").mkdir()
    (repo / "__pycache__" / "stale.pipe").write_text("not a pipeline {")
    return repo


def test_check_and_compile_take_a_directory_and_leave_stage_code_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = _repository(tmp_path)
    assert main(["check", str(repo)]) == 0
    err = capsys.readouterr().err
    assert "2 files ok" in err and "P0004" not in err  # train.pipe and builder.py
    out = tmp_path / "deploy"
    assert main(["compile", str(repo), "-o", f"{out}/"]) == 0
    assert sorted(p.name for p in out.glob("*.yaml")) == [
        "durapipe-runtime.yaml", "from-builder.rbac.yaml", "from-builder.yaml",
        "train.rbac.yaml", "train.yaml"]
    (repo / "team-a" / "train.pipe").write_text('pipeline "train" {}\nstage "a" { image: "x" }\n')
    assert main(["check", str(repo)]) == 1
    assert "team-a/train.pipe:2:18" in capsys.readouterr().err


def test_a_directory_without_pipelines_is_refused_by_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "nothing"
    empty.mkdir()
    (empty / "train_step.py").write_text(STAGE_CODE)
    for command in (["check"], ["fmt"], ["compile"]):
        assert main([*command, str(empty)]) == 2
        assert f"{empty} holds no pipeline" in capsys.readouterr().err


def test_fmt_formats_a_directory_s_pipe_files_and_standard_input() -> None:
    messy = 'pipeline "p" {\nstorage="s3://x"}\nstage "a" {image="i" command=["x"]}\n'

    def fmt(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "durapipe", "fmt", *args], input=stdin,
                              capture_output=True, text=True, timeout=60, check=False)

    done = fmt("-", stdin=messy)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith('pipeline "p" {\n  storage = "s3://x"\n}\n')
    assert fmt("-", stdin=done.stdout).stdout == done.stdout  # a fixed point
    check = fmt("--check", "-", stdin=messy)
    assert check.returncode == 1 and check.stdout.startswith("--- <stdin> (current)")
    assert fmt("--check", "-", stdin=done.stdout).returncode == 0
    broken = fmt("-", stdin='pipeline "p" {\n')
    assert broken.returncode == 1 and "error[P01" in broken.stderr and not broken.stdout
    assert fmt("-", "other.pipe").returncode == 2


def test_fmt_of_a_directory_rewrites_only_its_pipe_files(tmp_path: Path) -> None:
    repo = _repository(tmp_path)
    messy = 'pipeline "p" {\nstorage="s3://x"}\nstage "a" {image="i" command=["x"]}\n'
    (repo / "team-a" / "messy.pipe").write_text(messy)
    assert main(["fmt", "--check", str(repo)]) == 1
    assert main(["fmt", str(repo)]) == 0
    assert main(["fmt", "--check", str(repo)]) == 0
    assert (repo / "team-a" / "train_step.py").read_text() == STAGE_CODE
    assert (repo / "__pycache__" / "stale.pipe").read_text() == "not a pipeline {"


def test_explain_without_a_code_lists_every_code(capsys: pytest.CaptureFixture[str]) -> None:
    from durapipe.dsl import codes

    assert main(["explain"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(codes.CODES)
    assert all(line.endswith(codes.CODES[line.split()[0]].title) for line in lines)
