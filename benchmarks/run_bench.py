"""Orchestration cost of `durapipe run`.

Prints, measured in this one run:
- per-stage overhead: a chain of N stages running `true`, minus N direct spawns of `true`
  (target: at most 100 ms per stage);
- a 200-stage fan-out (one root, 199 independent children) with --jobs 2 (target: under 30 s).

Usage: python benchmarks/run_bench.py [--stages N]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from timing import ensure_bytecode

from durapipe.dsl import loads
from durapipe.runner.engine import Runner, RunOptions


def chain(n: int) -> str:
    stages = [f'stage "s{i}" {{ image = "x"  command = ["true"]'
              + (f"  needs = [s{i - 1}]" if i else "") + " }" for i in range(n)]
    return 'pipeline "chain" {}\n' + "\n".join(stages) + "\n"


def fanout(n: int) -> str:
    stages = ['stage "root" { image = "x"  command = ["true"] }']
    stages += [f'stage "leaf{i}" {{ image = "x"  command = ["true"]  needs = [root] }}'
               for i in range(n - 1)]
    return 'pipeline "fanout" {}\n' + "\n".join(stages) + "\n"


def run(text: str, jobs: int, home: Path) -> float:
    result = loads(text, "bench.pipe")
    assert result.pipeline is not None
    runner = Runner(result.pipeline, str(home / "bench.pipe"),
                    RunOptions(jobs=jobs, home=home))
    start = time.perf_counter()
    record = runner.run()
    elapsed = time.perf_counter() - start
    assert record.status == "succeeded", record.status
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=20)
    args = parser.parse_args()
    ensure_bytecode()
    true = shutil.which("true") or "true"
    start = time.perf_counter()
    for _ in range(args.stages):
        subprocess.run([true], check=True)
    direct = (time.perf_counter() - start) / args.stages
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        per_stage = run(chain(args.stages), 1, home / "a") / args.stages
        print(f"direct spawn of `true`:        {direct * 1000:7.1f} ms")
        print(f"durapipe run, per chained stage: {per_stage * 1000:7.1f} ms")
        print(f"overhead per stage:            {(per_stage - direct) * 1000:7.1f} ms "
              "(target <= 100 ms)")
        took = run(fanout(200), 2, home / "b")
        print(f"200-stage fan-out, --jobs 2:   {took:7.2f} s (target < 30 s)")


if __name__ == "__main__":
    main()
