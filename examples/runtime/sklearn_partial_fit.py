"""scikit-learn ``partial_fit`` training that resumes bit-identically from durapipe checkpoints.

The checkpoint is the pickled estimator plus the epoch reached and the NumPy generator that
orders the data, so a resumed run sees the same batches in the same order.

    DURAPIPE_CHECKPOINT_URI=file:///tmp/ckpt python examples/runtime/sklearn_partial_fit.py --out m.pkl
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time

import numpy as np
from sklearn.linear_model import SGDClassifier

from durapipe import runtime

HOLD_SECONDS = 120.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    # A test preempts the run at a known step, however slow the machine, by holding it there.
    parser.add_argument("--hold-at", type=int, default=None,
                        help="after this step, wait up to 120 s for a stop request")
    parser.add_argument("--out", required=True)
    options = parser.parse_args()

    data_rng = np.random.default_rng(0)
    features = data_rng.normal(size=(600, 8))
    labels = (features @ data_rng.normal(size=8) > 0).astype(int)
    classes = np.array([0, 1])

    ctx = runtime.context()
    checkpoint = ctx.checkpoint
    assert checkpoint is not None, "DURAPIPE_CHECKPOINT_URI is not set"
    restored = checkpoint.load()
    if restored:
        state = pickle.loads(restored.read_bytes())
    else:
        state = {
            "model": SGDClassifier(loss="log_loss", random_state=0),
            "epoch": 0,
            "order_rng": np.random.default_rng(1),
        }
    print(f"resumed at {state['epoch']}", flush=True)
    while state["epoch"] < options.epochs:
        order = state["order_rng"].permutation(len(features))
        for batch in np.array_split(order, 6):
            state["model"].partial_fit(features[batch], labels[batch], classes=classes)
        state["epoch"] += 1
        print(f"epoch {state['epoch']}", flush=True)
        time.sleep(options.step_seconds)
        if state["epoch"] == options.hold_at:
            ctx.wait_for_stop(HOLD_SECONDS)
        checkpoint.save(pickle.dumps(state), metadata={"epoch": state["epoch"]})
        if ctx.stop_requested():
            checkpoint.close()
            print(f"stopped at {state['epoch']}", flush=True)
            return 0
    checkpoint.close()
    with open(options.out, "wb") as handle:
        pickle.dump(state["model"], handle)
    print(f"finished at {state['epoch']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
