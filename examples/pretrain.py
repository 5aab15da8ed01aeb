"""The multi-node pretraining example's script (examples/multinode_pretrain.pipe), stdlib and
durapipe's runtime.

Under torchrun each process has RANK and WORLD_SIZE; run alone (``durapipe run``) it is rank 0
of 1.  It counts steps of a toy objective and checkpoints through the runtime's store every
``checkpoint_every`` steps (and once more when a stop is requested).  Every rank calls
``checkpoint.save``, as data-parallel ranks hold the same state: the runtime keeps rank 0's and
skips the others', so the line has one writer.  A restarted JobSet (a node preempted, a rank
failed) resumes every rank at the step the last commit reached.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from durapipe import runtime


def read_config(path: Path) -> dict[str, int]:
    config = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            key, _, value = line.partition(":")
            config[key.strip()] = int(value)
    return config


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True, type=Path)
    # The toy's stand-in for a step's work, so that a run can be preempted mid-training.
    parser.add_argument("--step-seconds", type=float, default=0.0)
    args = parser.parse_args()
    config = read_config(args.config)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    ctx = runtime.context()
    checkpoint = ctx.checkpoint  # None where the stage has no `checkpoint`
    restored = checkpoint.load() if checkpoint is not None else None
    state = (json.loads(restored.read_text()) if restored is not None
             else {"step": 0, "loss": 10.0})
    print(f"pretrain: rank {rank}/{world} starting at step {state['step']}", flush=True)
    while state["step"] < config["steps"] and not ctx.stop_requested():
        ctx.wait_for_stop(timeout=args.step_seconds)
        state["step"] += 1
        state["loss"] = round(state["loss"] * 0.9, 6)
        if checkpoint is not None and (state["step"] % config["checkpoint_every"] == 0
                                       or ctx.stop_requested()):
            handle = checkpoint.save(json.dumps(state).encode(), metadata={"step": state["step"]})
            kept = "left to rank 0" if handle.skipped else "saved"
            print(f"pretrain: rank {rank} step {state['step']} {kept}", flush=True)
    if checkpoint is not None:
        checkpoint.close()  # the last save reaches the store before the process ends
    if ctx.stop_requested():
        print(f"pretrain: rank {rank} stopped at step {state['step']}", flush=True)
        return 143
    print(f"pretrain: rank {rank}/{world} step {state['step']} loss {state['loss']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
