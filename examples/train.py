"""The spot-training example's script (examples/spot_training.pipe), stdlib and durapipe's runtime.

Fits y = 3x + 1 by gradient descent, one epoch at a time, and checkpoints through the runtime's
store (``checkpoint.save`` after every epoch, once more when a stop is requested): a preempted or
retried attempt resumes at the epoch the last committed checkpoint reached, on a cluster as under
``durapipe run``.  Writing files into the checkpoint path is not enough: nothing but
``checkpoint.save`` commits them (docs/runtime.md, "What training code sees").  The dataset URI
is only recorded: the points are generated.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from durapipe import runtime


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--epochs", required=True, type=int)
    parser.add_argument("--lr", required=True, type=float)
    # The toy's stand-in for an epoch's work, so that a run can be preempted mid-training.
    parser.add_argument("--epoch-seconds", type=float, default=0.0)
    args = parser.parse_args()
    ctx = runtime.context()
    checkpoint = ctx.checkpoint  # None where the stage has no `checkpoint`
    restored = checkpoint.load() if checkpoint is not None else None
    state = (json.loads(restored.read_text()) if restored is not None
             else {"epoch": 0, "w": 0.0, "b": 0.0})
    print(f"train: starting at epoch {state['epoch']}", flush=True)
    points = [(x / 10, 3 * x / 10 + 1) for x in range(-20, 21)]
    lr = min(args.lr * 100, 0.1)  # the real trainer's lr is per-sample; this toy's is per-epoch
    while state["epoch"] < args.epochs and not ctx.stop_requested():
        for _ in range(50):
            gw = sum(2 * (state["w"] * x + state["b"] - y) * x for x, y in points) / len(points)
            gb = sum(2 * (state["w"] * x + state["b"] - y) for x, y in points) / len(points)
            state["w"] -= lr * gw
            state["b"] -= lr * gb
        ctx.wait_for_stop(timeout=args.epoch_seconds)
        state["epoch"] += 1
        if checkpoint is not None:  # in the background: only the newest queued save uploads
            checkpoint.save(json.dumps(state).encode(), metadata={"epoch": state["epoch"]})
        print(f"train: epoch {state['epoch']} done", flush=True)
    if checkpoint is not None:
        checkpoint.close()  # the last save reaches the store before the attempt ends
    if ctx.stop_requested():
        print(f"train: stopped at epoch {state['epoch']}", flush=True)
        return 143
    print(f"train: {args.data} epoch {state['epoch']}: w={state['w']:.3f} b={state['b']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
