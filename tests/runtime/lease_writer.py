"""A checkpoint writer in a process of its own, driven line by line on stdin (the lease tests).

    python lease_writer.py URI LOCAL_DIR      (run id and lease from the environment)

Commands: ``load`` (restore, which claims the line), ``save N`` (commit step N), ``close``,
``exit`` (end without close: the exit hook releases).  Each answers one line on stdout:
``ok ...`` or ``refused <ExceptionClass>: <message>``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from durapipe.runtime.checkpoint import Checkpoint
from durapipe.runtime.errors import CheckpointError


def main() -> int:
    uri, local = sys.argv[1], Path(sys.argv[2])
    checkpoint = Checkpoint(uri, path=local, spool_dir=local / "spool", keep=2)
    print("ready", flush=True)
    for line in sys.stdin:
        command, _, argument = line.strip().partition(" ")
        try:
            if command == "load":
                restored = checkpoint.load_sync()
                print(f"ok loaded {restored}", flush=True)
            elif command == "save":
                state = local / f"state-{argument}"
                state.mkdir(parents=True, exist_ok=True)
                (state / "step.json").write_text(json.dumps({"step": int(argument)}))
                commit = checkpoint.save_sync(state)
                print(f"ok committed {commit.seq if commit else None}", flush=True)
            elif command == "close":
                checkpoint.close()
                print("ok closed", flush=True)
            elif command == "exit":
                return 0
        except CheckpointError as error:
            print(f"refused {type(error).__name__}: {error}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
