"""Benchmark `durapipe compile`: cold process vs `import hera.workflows`, and a 2,000-stage pipeline.

    python benchmarks/compile_bench.py [--runs N] [--stages N] [--validate]

Prints one line per measurement and a JSON summary.  Cold times are the median wall time of
N fresh processes, interleaved so that machine load affects both sides alike.  Targets
(issue 3): cold compile <= 0.5 s and >= 3x faster than importing hera; 2,000 stages < 3 s, every
object within Argo's limits (and, with --validate, passing the strict CRD validator).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from timing import ensure_bytecode

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "prep_train_eval.pipe"


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def big_pipeline(n: int) -> object:
    from durapipe.dsl.model import Cache, Param, Pipeline, Ref, Stage

    stages = []
    for i in range(n):
        ups = [f"s{j}" for j in (i - 1, i // 2) if 0 <= j < i]
        command: list[object] = ["python", "step.py", "--epochs", Ref(path=("params", "epochs"))]
        command += [Ref(path=(u, "outputs", "out")) for u in ups[:1]]
        stages.append(Stage(
            name=f"s{i}", image="ghcr.io/acme/step:1", command=tuple(command),  # type: ignore[arg-type]
            needs=tuple(ups[1:]), outputs={"out": "/out"},
            cache=Cache() if i % 3 == 0 else None,
        ))
    return Pipeline(name="big", params=(Param(name="epochs", type="int", default=1),),
                    stages=tuple(stages))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--stages", type=int, default=2000)
    parser.add_argument("--validate", action="store_true",
                        help="also run the strict CRD validator (tests/argo_schema) on every object")
    args = parser.parse_args()

    ensure_bytecode()
    compile_cmd = [sys.executable, "-m", "durapipe", "compile", str(EXAMPLE)]
    hera_cmd = [sys.executable, "-c", "import hera.workflows"]
    wall(compile_cmd)  # warm the OS file cache and __pycache__ for both sides
    wall(hera_cmd)
    compile_times: list[float] = []
    hera_times: list[float] = []
    for _ in range(args.runs):
        compile_times.append(wall(compile_cmd))
        hera_times.append(wall(hera_cmd))
    cold = statistics.median(compile_times)
    hera = statistics.median(hera_times)
    print(f"cold `durapipe compile {EXAMPLE.name}`: {cold:.3f} s (median of {args.runs})")
    print(f"`python -c 'import hera.workflows'`:   {hera:.3f} s; ratio {hera / cold:.2f}x")

    from durapipe.compiler import CompileOptions, compile_pipeline, to_yaml

    t0 = time.perf_counter()
    pipeline = big_pipeline(args.stages)
    t1 = time.perf_counter()
    result = compile_pipeline(pipeline, CompileOptions())
    t2 = time.perf_counter()
    text = to_yaml(result.documents)
    t3 = time.perf_counter()
    assert result.ok, result.diagnostics
    largest = max(len(json.dumps(d)) for d in result.documents)
    print(f"{args.stages} stages: model {t1 - t0:.2f} s, compile {t2 - t1:.2f} s, "
          f"YAML {t3 - t2:.2f} s -> {len(result.documents)} objects, {len(text) / 1e6:.1f} MB, "
          f"largest object {largest / 1e6:.2f} MB")
    summary: dict[str, object] = {
        "cold_compile_s": round(cold, 3), "hera_import_s": round(hera, 3),
        "ratio": round(hera / cold, 2), "big_stages": args.stages,
        "big_compile_s": round(t2 - t1, 3), "big_yaml_s": round(t3 - t2, 3),
        "big_compile_and_yaml_s": round(t3 - t1, 3), "big_objects": len(result.documents),
    }
    if args.validate:
        sys.path.insert(0, str(REPO / "tests"))
        from argo_schema.strict import StrictValidator

        validator = StrictValidator.for_crd_dir(REPO.parent / "shared" / "argo" / "v4.1.2" / "crds")
        t4 = time.perf_counter()
        problems = [p for d in result.documents for p in validator.validate(d)]
        print(f"strict validation of {len(result.documents)} objects: {len(problems)} problems "
              f"({time.perf_counter() - t4:.1f} s)")
        summary["big_strict_problems"] = len(problems)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
