"""A pre-imported process that forks checkpoint-saving trainers and upload agents on demand.

Forking from an already-initialised, single-threaded Python keeps each of the many kill rounds
to milliseconds.  No store is opened here before a fork (obstore's runtime does not survive
one); each child opens its own.  Protocol on stdin/stdout, one line each:

    train <uri> <workdir> <spool> <uploader> <seed>
                  -> fork a trainer; prints "<pid>" once it has restored and starts saving
    agent <uri> <spool>
                  -> fork an upload agent; prints "<pid>" once it is running
    collect <root>... --protect <run> --log <file>
                  -> fork a checkpoint collector that runs passes (max_age 0) over each
                     root, keeping the lines of <run>, until killed; prints "<pid>"
    reap <pid>    -> waits for that (killed) child; prints its wait status

A trainer appends ``handed <step>`` to ``<workdir>/acks`` once ``save()`` returned (the state is
staged, or with the sidecar handed over) and ``committed <step>`` once ``wait()`` returned.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

from durapipe.runtime.agent import UploadAgent
from durapipe.runtime.checkpoint import Checkpoint
from durapipe.runtime.store import open_store

FROZEN = b"frozen-embedding" * 4096


def write_state(root: Path, step: int, rng: random.Random) -> None:
    (root / "shards").mkdir(parents=True, exist_ok=True)
    size = rng.choice((4096, 65536, 1 << 20))
    (root / "shards" / "weights.bin").write_bytes(step.to_bytes(8, "little") * (size // 8))
    (root / "frozen.bin").write_bytes(FROZEN)
    (root / "step.json").write_text(json.dumps({"step": step}))


def trainer(uri: str, workdir: Path, spool: Path, uploader: str, seed: int, ready: int) -> None:
    rng = random.Random(seed)
    checkpoint = Checkpoint(uri, path=workdir, spool_dir=spool, keep=2, uploader=uploader)
    restored = checkpoint.load_sync()
    step = json.loads((restored / "step.json").read_text())["step"] if restored else 0
    acks = open(workdir / "acks", "a", buffering=1)  # noqa: SIM115 (lives until the kill)
    os.write(ready, b"x")
    os.close(ready)
    state = workdir / "state"
    while True:
        step += 1
        write_state(state, step, rng)
        handle = checkpoint.save(state, metadata={"step": step})
        acks.write(f"handed {step}\n")
        if rng.random() < 0.5:
            handle.wait(timeout=120)
            acks.write(f"committed {step}\n")


def agent(uri: str, spool: Path, ready: int) -> None:
    uploader = UploadAgent(spool, open_store(uri), keep=2)
    os.write(ready, b"x")
    os.close(ready)
    uploader.run(poll_seconds=0.01)


def collector(arguments: list[str], ready: int) -> None:
    from durapipe.runtime import linegc

    log_at = arguments.index("--log")
    protect_at = arguments.index("--protect")
    roots = arguments[:protect_at]
    protection = linegc.Protection(frozenset({arguments[protect_at + 1]}))
    log = open(arguments[log_at + 1], "a", buffering=1)  # noqa: SIM115 (lives until the kill)
    os.write(ready, b"x")
    os.close(ready)
    while True:
        for root in roots:
            outcomes = linegc.collect(open_store(root), max_age=0, apply=True,
                                      protection=protection)
            log.write(f"{os.getpid()} {root}: " + ", ".join(
                f"{o.line.prefix} {o.action}" for o in outcomes) + "\n")


def main() -> None:
    for line in sys.stdin:
        command, *arguments = line.split()
        if command in ("train", "agent", "collect"):
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read_fd)
                try:
                    if command == "train":
                        uri, workdir, spool, uploader, seed = arguments
                        Path(workdir).mkdir(parents=True, exist_ok=True)
                        trainer(uri, Path(workdir), Path(spool), uploader, int(seed), write_fd)
                    elif command == "collect":
                        collector(arguments, write_fd)
                    else:
                        agent(arguments[0], Path(arguments[1]), write_fd)
                finally:
                    os._exit(1)
            os.close(write_fd)
            os.read(read_fd, 1)
            os.close(read_fd)
            print(pid, flush=True)
        elif command == "reap":
            _, status = os.waitpid(int(arguments[0]), 0)
            print(status, flush=True)


if __name__ == "__main__":
    main()
