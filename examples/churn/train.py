"""Fit the churn model on the prepared table."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from churn.model import fit, load


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--max-depth", required=True, type=int)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    rows = load(args.data)
    tree = fit(rows, args.max_depth)
    args.out.mkdir(parents=True, exist_ok=True)
    staging = args.out / "model.json.tmp"
    staging.write_text(json.dumps(tree, sort_keys=True))
    os.replace(staging, args.out / "model.json")
    print(f"train: fitted depth <= {args.max_depth} on {len(rows)} rows")


if __name__ == "__main__":
    main()
