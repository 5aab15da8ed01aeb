"""Build feature shards: per shard, running statistics of a deterministic synthetic stream.

Shards already written (and committed by rename) are kept, so an attempt after an OOM kill or a
preemption continues where the last one stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path


def shard(index: int, rows: int) -> dict[str, float]:
    rng = random.Random(index)
    values = [rng.gauss(0.0, 1.0) for _ in range(rows)]
    mean = sum(values) / rows
    return {"shard": index, "rows": rows, "mean": mean,
            "var": sum((v - mean) ** 2 for v in values) / rows}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", required=True, type=int)
    # A shard's rows are held in memory at once: its size is the stage's memory need.
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    done = 0
    for index in range(args.shards):
        path = args.out / f"shard-{index:05d}.json"
        if path.exists():
            continue
        staging = path.with_suffix(".tmp")
        staging.write_text(json.dumps(shard(index, args.rows), sort_keys=True))
        os.replace(staging, path)
        done += 1
    print(f"features: {done} shards built, {args.shards - done} kept from an earlier attempt")


if __name__ == "__main__":
    main()
