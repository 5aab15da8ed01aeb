"""Score the model on the table and write the report."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from churn.model import load, predict


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--report", required=True, type=Path)
    args = parser.parse_args()
    tree = json.loads((args.model / "model.json").read_text())
    rows = load(args.data)
    accuracy = sum(predict(tree, r) == r["churned"] for r in rows) / len(rows)
    args.report.mkdir(parents=True, exist_ok=True)
    staging = args.report / "report.json.tmp"
    staging.write_text(json.dumps({"rows": len(rows), "accuracy": round(accuracy, 4)}))
    os.replace(staging, args.report / "report.json")
    print(f"eval: accuracy {accuracy:.3f} on {len(rows)} rows")


if __name__ == "__main__":
    main()
