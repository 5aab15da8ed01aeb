"""Build the training table for one snapshot: synthetic customers, deterministic per snapshot."""

from __future__ import annotations

import argparse
import csv
import os
import random
from pathlib import Path

FIELDS = ("tenure_months", "monthly_spend", "support_tickets", "churned")


def customers(snapshot: str, n: int = 400) -> list[dict[str, int]]:
    rng = random.Random(snapshot)
    rows = []
    for _ in range(n):
        tenure = rng.randint(1, 72)
        spend = rng.randint(10, 120)
        tickets = rng.randint(0, 8)
        risk = 0.6 * (tickets >= 4) + 0.3 * (tenure < 12) + 0.1 * (spend > 90)
        rows.append({"tenure_months": tenure, "monthly_spend": spend,
                     "support_tickets": tickets, "churned": int(rng.random() < risk)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--snapshot", required=True)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = customers(args.snapshot)
    staging = args.out / "customers.csv.tmp"
    with open(staging, "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(staging, args.out / "customers.csv")
    print(f"prep: {len(rows)} customers for snapshot {args.snapshot}")


if __name__ == "__main__":
    main()
