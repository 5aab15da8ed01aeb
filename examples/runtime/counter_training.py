"""A tiny "training" loop that checkpoints through durapipe's runtime and stops on request.

State is a JSON counter.  Each step adds the step number to a running total; a checkpoint is
saved every ``--every`` steps and once more when a stop is requested.  Prints ``ready`` after the
first committed checkpoint so tests know the loop is running, and ``stopped at <step>`` /
``finished <total>`` at the end.

    python examples/runtime/counter_training.py --steps 100000 --every 50
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from durapipe import runtime


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--step-seconds", type=float, default=0.001)
    options = parser.parse_args()

    ctx = runtime.context()
    checkpoint = ctx.checkpoint
    assert checkpoint is not None, "DURAPIPE_CHECKPOINT_URI is not set"
    restored = checkpoint.load()
    state = json.loads(restored.read_text()) if restored else {"step": 0, "total": 0}
    print(f"resumed at {state['step']}", flush=True)
    announced = False
    while state["step"] < options.steps:
        state["step"] += 1
        state["total"] += state["step"]
        time.sleep(options.step_seconds)
        stopping = ctx.stop_requested()
        if state["step"] % options.every == 0 or stopping:
            handle = checkpoint.save(json.dumps(state).encode(), metadata={"step": state["step"]})
            if not announced:
                handle.wait()
                print("ready", flush=True)
                announced = True
        if stopping:
            checkpoint.close()
            print(f"stopped at {state['step']}", flush=True)
            return 0
    checkpoint.save(json.dumps(state).encode(), metadata={"step": state["step"]})
    checkpoint.close()
    print(f"finished {state['total']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
