"""The GPU-fallback example's script (examples/gpu_fallback.pipe), stdlib only.

Started by torchrun (RANK, WORLD_SIZE, LOCAL_RANK per process).  It reports the GPU type the
attempt got (``DURAPIPE_GPU_TYPE``, which decides the per-device batch: A100 40GB runs 16 GPUs
at half the batch) and commits its progress to the checkpoint directory on rank 0.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    gpu = os.environ.get("DURAPIPE_GPU_TYPE", "")
    batch = 4 if gpu == "A100" else 8
    ckpt = Path(os.environ.get("DURAPIPE_CHECKPOINT_PATH", "/checkpoints"))
    if rank == 0:
        ckpt.mkdir(parents=True, exist_ok=True)
        staging = ckpt / "progress.json.tmp"
        staging.write_text(json.dumps({"model": args.model, "world": world, "batch": batch}))
        os.replace(staging, ckpt / "progress.json")
    print(f"finetune: {args.model} rank {rank}/{world} on {gpu or 'cpu'} batch {batch}")


if __name__ == "__main__":
    main()
