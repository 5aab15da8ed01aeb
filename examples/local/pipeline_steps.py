"""The steps of cached_eval.pipe: a tiny least-squares classifier in pure Python."""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path


def prep(rows: int, out: Path) -> None:
    rng = random.Random(7)
    points = []
    for _ in range(rows):
        x, y = rng.uniform(-1, 1), rng.uniform(-1, 1)
        points.append([x, y, 1 if x + 0.5 * y > 0 else 0])
    out.mkdir(parents=True, exist_ok=True)
    (out / "points.json").write_text(json.dumps(points))


def train(data: Path, out: Path) -> None:
    points = json.loads((data / "points.json").read_text())
    w = [0.0, 0.0, 0.0]
    for _ in range(20):
        for x, y, label in points:
            guess = 1 if w[0] * x + w[1] * y + w[2] > 0 else 0
            error = label - guess
            w = [w[0] + 0.1 * error * x, w[1] + 0.1 * error * y, w[2] + 0.1 * error]
    out.mkdir(parents=True, exist_ok=True)
    (out / "weights.json").write_text(json.dumps(w))
    print("trained", w)


def evaluate(data: Path, model: Path, min_accuracy: float) -> int:
    points = json.loads((data / "points.json").read_text())
    w = json.loads((model / "weights.json").read_text())
    right = sum((1 if w[0] * x + w[1] * y + w[2] > 0 else 0) == label for x, y, label in points)
    accuracy = right / len(points)
    print(f"accuracy {accuracy:.3f} (required {min_accuracy})")
    return 0 if accuracy >= min_accuracy else 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("step", choices=("prep", "train", "eval"))
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--data", type=Path)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--min-accuracy", type=float, default=0.9)
    args = parser.parse_args()
    if args.step == "prep":
        prep(args.rows, args.out)
    elif args.step == "train":
        train(args.data, args.out)
    else:
        return evaluate(args.data, args.model, args.min_accuracy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
