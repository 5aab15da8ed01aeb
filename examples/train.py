"""The spot-training example's script (examples/spot_training.pipe), stdlib only.

Fits y = 3x + 1 by gradient descent, one epoch at a time, and keeps its progress in the
checkpoint directory the runtime restores before each attempt (``DURAPIPE_CHECKPOINT_PATH``,
``/checkpoints`` in the pod), so a preempted attempt resumes at the epoch it reached.  The
dataset URI is only recorded: the points are generated.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--epochs", required=True, type=int)
    parser.add_argument("--lr", required=True, type=float)
    # The toy's stand-in for an epoch's work, so that a run can be preempted mid-training.
    parser.add_argument("--epoch-seconds", type=float, default=0.0)
    args = parser.parse_args()
    ckpt = Path(os.environ.get("DURAPIPE_CHECKPOINT_PATH", "/checkpoints"))
    ckpt.mkdir(parents=True, exist_ok=True)
    state_path = ckpt / "state.json"
    state = (json.loads(state_path.read_text()) if state_path.exists()
             else {"epoch": 0, "w": 0.0, "b": 0.0})
    print(f"train: starting at epoch {state['epoch']}", flush=True)
    points = [(x / 10, 3 * x / 10 + 1) for x in range(-20, 21)]
    lr = min(args.lr * 100, 0.1)  # the real trainer's lr is per-sample; this toy's is per-epoch
    while state["epoch"] < args.epochs:
        for _ in range(50):
            gw = sum(2 * (state["w"] * x + state["b"] - y) * x for x, y in points) / len(points)
            gb = sum(2 * (state["w"] * x + state["b"] - y) for x, y in points) / len(points)
            state["w"] -= lr * gw
            state["b"] -= lr * gb
        time.sleep(args.epoch_seconds)
        state["epoch"] += 1
        staging = state_path.with_suffix(".tmp")
        staging.write_text(json.dumps(state))
        os.replace(staging, state_path)
        print(f"train: epoch {state['epoch']} done", flush=True)
    print(f"train: {args.data} epoch {state['epoch']}: w={state['w']:.3f} b={state['b']:.3f}")


if __name__ == "__main__":
    main()
