#!/usr/bin/python3
"""A stand-in for torchrun's process launching, for the machines the tests run on (no torch).

It takes the flags durapipe's lowering passes (``--nnodes``, ``--nproc-per-node``,
``--node-rank``, ``--master-addr``, ``--master-port``, ``--module``, ``--no-python``) and
starts ``nproc-per-node`` workers with the environment torchrun gives them (``RANK`` =
node rank x procs + local rank, ``LOCAL_RANK``, ``WORLD_SIZE``, ``GROUP_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``).  Like torchrun's agent it forwards
SIGTERM to its workers and, when one worker fails, stops the others and fails.

What it does not do is the rendezvous, which the example programs do not need: it is on
``PATH`` for ``durapipe run`` of the examples in the fast tier
(tests/runner/test_examples_run.py), where importing torch in each launch would cost seconds.
The real node runs PyTorch's own torchrun (tests/realnode/test_multinode.py).  Unlike torchrun
before PyTorch 2.0 it takes both spellings of a flag (``--nproc-per-node``, ``--nproc_per_node``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import FrameType


def parse(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    flags: dict[str, str] = {}
    args = list(argv)
    while args and args[0].startswith("--"):
        flag = args.pop(0)
        name, eq, value = flag[2:].partition("=")
        name = name.replace("_", "-")
        if name in ("module", "no-python"):
            flags[name] = "1"
            if eq:
                raise SystemExit(f"torchrun: --{name} takes no value")
            continue
        if not eq:
            if not args:
                raise SystemExit(f"torchrun: --{name} needs a value")
            value = args.pop(0)
        flags[name] = value
    if not args:
        raise SystemExit("torchrun: no training program given")
    return flags, args


def worker_argv(flags: dict[str, str], program: list[str]) -> list[str]:
    if "no-python" in flags:
        return program
    if "module" in flags:
        return [sys.executable, "-u", "-m", *program]
    return [sys.executable, "-u", *program]


def main(argv: list[str]) -> int:
    flags, program = parse(argv)
    nnodes = int(flags.get("nnodes", "1"))
    procs = int(flags.get("nproc-per-node", "1"))
    node_rank = int(flags.get("node-rank", "0"))
    if not 0 <= node_rank < nnodes:
        raise SystemExit(f"torchrun: --node-rank={node_rank} outside --nnodes={nnodes}")
    print(f"torchrun (stand-in): node {node_rank}/{nnodes}, {procs} worker(s), master "
          f"{flags.get('master-addr', '127.0.0.1')}:{flags.get('master-port', '29500')}",
          file=sys.stderr, flush=True)
    workers = []
    for local in range(procs):
        env = {**os.environ, "RANK": str(node_rank * procs + local), "LOCAL_RANK": str(local),
               "WORLD_SIZE": str(nnodes * procs), "LOCAL_WORLD_SIZE": str(procs),
               "GROUP_RANK": str(node_rank),
               "MASTER_ADDR": flags.get("master-addr", "127.0.0.1"),
               "MASTER_PORT": flags.get("master-port", "29500")}
        workers.append(subprocess.Popen(worker_argv(flags, program), env=env))
    stopping: list[int] = []

    def stop(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    first_failure: int | None = None
    while True:
        codes = [worker.poll() for worker in workers]
        failed = [c for c in codes if c not in (None, 0)]
        if failed and first_failure is None:
            first_failure = failed[0]
            if not stopping:
                stop(signal.SIGTERM, None)
        if all(c is not None for c in codes):
            if first_failure is None:
                return 0
            # A worker killed by a signal shows as -N: report it as a shell would.
            return 128 - first_failure if first_failure < 0 else first_failure
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
