"""Speed of `durapipe check`: a typical example in a fresh process, and generated big files.

Prints ratios measured in this one run (machines here are noisy; compare within a run):
- cold check of each example vs `python -c "import hera.workflows"` (target: <= 0.4 s and >= 4x faster)
- in-process check of 2,000 and 4,000 generated stages (target: 2,000 < 2 s; 4,000/2,000 <= 2.2)
- the same for 2,000 and 4,000 copies of examples/spot_training.pipe's stage, interpolated
  strings included, each copy also interpolating its predecessor's output (4,000/2,000 <= 2.2)

Usage: python benchmarks/check_bench.py [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timing import ensure_bytecode

ROOT = Path(__file__).resolve().parents[1]
DIGEST = "df2438aa87b7678c006b6e60e708e5a56828de5ed5d5a61a3f14719079eded9b"


def generate(stages: int) -> str:
    """A pipeline of `stages` stages in chains of 10, each reading its predecessor's output."""
    out = ['pipeline "big" {\n  storage = "s3://bucket/big"\n}\n',
           "params {\n  epochs: int = 3\n}\n",
           # Pinned by digest, as cached stages should be (W0005).
           'defaults {\n  image = "ghcr.io/acme/x:1@sha256:' + DIGEST + '"\n'
           '  retry { attempts = 2  backoff = 10s }\n}\n']
    for i in range(stages):
        reads = f', "--in", s{i - 1}.outputs.data' if i % 10 else ""
        out.append(
            f'stage "s{i}" {{\n'
            f'  command = ["python", "step.py", "--epochs", params.epochs{reads}]\n'
            f"  resources {{ cpu = 2  memory = 8Gi }}\n"
            f'  outputs {{ data = "/out/data" }}\n'
            f"  cache {{ max_age = 7d }}\n"
            f"}}\n")
    return "".join(out)


def copy_example(stages: int) -> str:
    """`stages` copies of spot_training.pipe's stage, chained through interpolated strings."""
    text = (ROOT / "examples" / "spot_training.pipe").read_text()
    head, _, stage = text.partition('stage "train" {')
    body, _, tail = stage.rpartition("}")
    assert '"--lr=${params.lr}",' in body, "the example's interpolated string changed"
    out = [head]
    for i in range(stages):
        command = '"--lr=${params.lr}",' + (f' "--after=${{train{i - 1}.outputs.model}}",'
                                            if i else "")
        copy = body.replace('"--lr=${params.lr}",', command, 1)
        out.append(f'stage "train{i}" {{{copy}  outputs {{ model = "/out/model" }}\n}}{tail}')
    return "".join(out)


def cold(cmd: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def warm_check(path: Path, repeat: int) -> float:
    from durapipe.dsl import load_path

    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = load_path(path)
        times.append(time.perf_counter() - start)
        assert result.pipeline is not None, "generated file must be valid"
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    py = sys.executable
    ensure_bytecode()
    hera = cold([py, "-c", "import hera.workflows"], args.repeat)
    print(f"python -c 'import hera.workflows' (cold, median of {args.repeat}): {hera:.3f} s")
    for example in sorted((ROOT / "examples").glob("*.pipe")):
        t = cold([py, "-m", "durapipe", "check", str(example)], args.repeat)
        print(f"durapipe check {example.name:<24} {t:.3f} s   hera/durapipe = {hera / t:.1f}x")
    with tempfile.TemporaryDirectory() as tmp:
        best_of = max(1, args.repeat // 2)
        for name, make, what in (("big", generate, "stages"),
                                 ("spot", copy_example, "copies of spot_training's stage")):
            results = {}
            for n in (2000, 4000):
                path = Path(tmp) / f"{name}{n}.pipe"
                path.write_text(make(n))
                results[n] = warm_check(path, best_of)
                print(f"check {n} {what} (in-process, best of {best_of}): {results[n]:.3f} s")
            growth = results[4000] / results[2000]
            print(f"growth 4000/2000 = {growth:.2f}x (linear = 2.0, target <= 2.2: "
                  f"{'met' if growth <= 2.2 else 'MISSED'})")
        t = cold([py, "-m", "durapipe", "check", str(Path(tmp) / "big2000.pipe")], 1)
        print(f"durapipe check 2000 stages (cold process): {t:.3f} s")


if __name__ == "__main__":
    main()
