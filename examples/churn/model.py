"""A depth-limited decision tree on integer features: enough to be real, small enough to read."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

FEATURES = ("tenure_months", "monthly_spend", "support_tickets")
Tree = dict[str, Any]


def load(data_dir: Path) -> list[dict[str, int]]:
    with open(data_dir / "customers.csv", newline="") as f:
        return [{k: int(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _gini(rows: list[dict[str, int]]) -> float:
    if not rows:
        return 0.0
    p = sum(r["churned"] for r in rows) / len(rows)
    return 2 * p * (1 - p)


def fit(rows: list[dict[str, int]], depth: int) -> Tree:
    majority = int(sum(r["churned"] for r in rows) * 2 >= len(rows))
    if depth == 0 or len(rows) < 10 or _gini(rows) == 0:
        return {"leaf": majority}
    best: tuple[float, str, int] | None = None
    for feature in FEATURES:
        for threshold in sorted({r[feature] for r in rows})[1:]:
            left = [r for r in rows if r[feature] < threshold]
            right = [r for r in rows if r[feature] >= threshold]
            score = (len(left) * _gini(left) + len(right) * _gini(right)) / len(rows)
            if best is None or score < best[0]:
                best = (score, feature, threshold)
    if best is None:
        return {"leaf": majority}
    _, feature, threshold = best
    return {"feature": feature, "threshold": threshold,
            "lt": fit([r for r in rows if r[feature] < threshold], depth - 1),
            "ge": fit([r for r in rows if r[feature] >= threshold], depth - 1)}


def predict(tree: Tree, row: dict[str, int]) -> int:
    while "leaf" not in tree:
        tree = tree["lt"] if row[tree["feature"]] < tree["threshold"] else tree["ge"]
    return int(tree["leaf"])
