"""The torchrun stand-in the real node's examples image and `durapipe run` tests launch the
multi-node example with: the ranks torchrun would give, SIGTERM forwarded, a failed worker
stopping the others (tests/torchrun_standin.py)."""

from __future__ import annotations

import json
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


def test_workers_get_the_ranks_torchrun_gives_them() -> None:
    code = ("import json, os; print(json.dumps({k: os.environ[k] for k in ('RANK', "
            "'LOCAL_RANK', 'WORLD_SIZE', 'GROUP_RANK', 'MASTER_ADDR', 'MASTER_PORT')}))")
    proc = launch(*FLAGS, "-c", code)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    envs = sorted((json.loads(line) for line in out.splitlines()), key=lambda e: e["RANK"])
    assert envs == [
        {"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "GROUP_RANK": "1",
         "MASTER_ADDR": "m0.js", "MASTER_PORT": "29500"},
        {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "GROUP_RANK": "1",
         "MASTER_ADDR": "m0.js", "MASTER_PORT": "29500"},
    ]


def test_sigterm_reaches_every_worker_and_their_exit_is_the_launchers(tmp_path: Path) -> None:
    code = ("import os, signal, sys, time\n"
            "def bye(*_):\n"
            f"    open(os.path.join({str(tmp_path)!r}, os.environ['RANK']), 'w').close()\n"
            "    sys.exit(143)\n"
            "signal.signal(signal.SIGTERM, bye)\n"
            "print('up', flush=True)\n"
            "time.sleep(60)\n")
    proc = launch(*FLAGS, "-c", code)
    assert proc.stdout is not None
    assert [proc.stdout.readline() for _ in range(2)] == ["up\n", "up\n"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 143
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2", "3"]


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
