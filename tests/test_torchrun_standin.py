"""The torchrun stand-in the real node's examples image and `durapipe run` tests launch the
multi-node example with: the ranks torchrun would give, SIGTERM forwarded, a failed worker
stopping the others (tests/torchrun_standin.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

STANDIN = Path(__file__).resolve().parent / "torchrun_standin.py"
FLAGS = ["--nnodes=2", "--nproc-per-node=2", "--node-rank=1", "--master-addr=m0.js",
         "--master-port=29500"]


def launch(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(STANDIN), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_workers_get_the_ranks_torchrun_gives_them(tmp_path: Path) -> None:
    # Each worker writes a file of its own: two processes printing to one pipe may interleave
    # their lines (seen under pytest -n 2).
    code = ("import json, os; open(os.path.join(" + repr(str(tmp_path)) + ", os.environ['RANK']"
            "), 'w').write(json.dumps({k: os.environ[k] for k in ('RANK', "
            "'LOCAL_RANK', 'WORLD_SIZE', 'GROUP_RANK', 'MASTER_ADDR', 'MASTER_PORT')}))")
    proc = launch(*FLAGS, "-c", code)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    envs = [json.loads((tmp_path / rank).read_text()) for rank in sorted(os.listdir(tmp_path))]
    assert envs == [
        {"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "GROUP_RANK": "1",
         "MASTER_ADDR": "m0.js", "MASTER_PORT": "29500"},
        {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "GROUP_RANK": "1",
         "MASTER_ADDR": "m0.js", "MASTER_PORT": "29500"},
    ]


def test_sigterm_reaches_every_worker_and_their_exit_is_the_launchers(tmp_path: Path) -> None:
    up, seen = tmp_path / "up", tmp_path / "seen"
    up.mkdir()
    seen.mkdir()
    code = ("import os, signal, sys, time\n"
            "def bye(*_):\n"
            f"    open(os.path.join({str(seen)!r}, os.environ['RANK']), 'w').close()\n"
            "    sys.exit(143)\n"
            "signal.signal(signal.SIGTERM, bye)\n"
            f"open(os.path.join({str(up)!r}, os.environ['RANK']), 'w').close()\n"
            "time.sleep(60)\n")
    proc = launch(*FLAGS, "-c", code)
    deadline = time.monotonic() + 60
    while len(os.listdir(up)) < 2:  # both workers have their handler
        assert time.monotonic() < deadline and proc.poll() is None, os.listdir(up)
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        tree = subprocess.run(["ps", "-o", "pid,ppid,stat,wchan:24,etime,cmd", "--ppid",
                               str(proc.pid), "--pid", str(proc.pid)],
                              capture_output=True, text=True).stdout
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"the launcher outlived its SIGTERM by 20 s:\n{tree}\n{err}"
                             f"\nworkers that saw it: {sorted(os.listdir(seen))}") from None
    assert code == 143
    assert sorted(os.listdir(seen)) == ["2", "3"]


def test_a_failed_worker_stops_the_others_and_fails_the_launcher() -> None:
    code = ("import os, sys, time\n"
            "if os.environ['LOCAL_RANK'] == '1': sys.exit(3)\n"
            "time.sleep(60)\n")
    t0 = time.monotonic()
    proc = launch(*FLAGS, "-c", code)
    assert proc.wait(timeout=30) == 3
    assert time.monotonic() - t0 < 30  # the sleeping worker was stopped, not waited for


def test_no_program_is_a_usage_error() -> None:
    proc = launch(*FLAGS)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "no training program" in err
