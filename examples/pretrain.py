"""The multi-node pretraining example's script (examples/multinode_pretrain.pipe), stdlib only.

Under torchrun each process has RANK and WORLD_SIZE; run alone (``durapipe run``) it is rank 0
of 1.  It counts steps of a toy objective, committing progress to the checkpoint directory the
runtime restores (``DURAPIPE_CHECKPOINT_PATH``), so a restarted job resumes at its last step.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def read_config(path: Path) -> dict[str, int]:
    config = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            key, _, value = line.partition(":")
            config[key.strip()] = int(value)
    return config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True, type=Path)
    args = parser.parse_args()
    config = read_config(args.config)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    ckpt = Path(os.environ.get("DURAPIPE_CHECKPOINT_PATH", "/checkpoints"))
    ckpt.mkdir(parents=True, exist_ok=True)
    state_path = ckpt / "state.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {"step": 0, "loss": 10.0}
    while state["step"] < config["steps"]:
        state["step"] += 1
        state["loss"] = round(state["loss"] * 0.9, 6)
        if rank == 0 and state["step"] % config["checkpoint_every"] == 0:
            staging = state_path.with_suffix(".tmp")
            staging.write_text(json.dumps(state))
            os.replace(staging, state_path)
    print(f"pretrain: rank {rank}/{world} step {state['step']} loss {state['loss']}")


if __name__ == "__main__":
    main()
