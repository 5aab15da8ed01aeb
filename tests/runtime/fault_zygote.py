"""A pre-imported process that forks checkpoint-saving workers on demand (fault tests).

Forking from an already-initialised, single-threaded Python keeps each of the many kill rounds
to milliseconds.  Protocol on stdin/stdout, one line each:

    go <seed>   -> fork a worker; prints "<pid>" once the worker has restored and is saving
    reap <pid>  -> waits for that (killed) worker; prints its wait status
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

from durapipe.runtime.checkpoint import Checkpoint

FROZEN = b"frozen-embedding" * 4096


def write_state(root: Path, step: int, rng: random.Random) -> None:
    (root / "shards").mkdir(parents=True, exist_ok=True)
    size = rng.choice((4096, 65536, 1 << 20))
    (root / "shards" / "weights.bin").write_bytes(step.to_bytes(8, "little") * (size // 8))
    (root / "frozen.bin").write_bytes(FROZEN)
    (root / "step.json").write_text(json.dumps({"step": step}))


def worker(uri: str, local: Path, seed: int, ready_fd: int) -> None:
    rng = random.Random(seed)
    checkpoint = Checkpoint(uri, path=local, spool_dir=local / "spool", keep=2)
    restored = checkpoint.load_sync()
    step = json.loads((restored / "step.json").read_text())["step"] if restored else 0
    os.write(ready_fd, b"x")
    os.close(ready_fd)
    state = local / "state"
    while True:
        step += 1
        write_state(state, step, rng)
        handle = checkpoint.save(state, metadata={"step": step})
        if rng.random() < 0.5:
            handle.wait()


def main() -> None:
    uri, local = sys.argv[1], Path(sys.argv[2])
    for line in sys.stdin:
        command, argument = line.split()
        if command == "go":
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read_fd)
                try:
                    worker(uri, local / f"worker-{argument}", int(argument), write_fd)
                finally:
                    os._exit(1)
            os.close(write_fd)
            os.read(read_fd, 1)
            os.close(read_fd)
            print(pid, flush=True)
        elif command == "reap":
            _, status = os.waitpid(int(argument), 0)
            print(status, flush=True)


if __name__ == "__main__":
    main()
