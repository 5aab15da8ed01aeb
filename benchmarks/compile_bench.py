"""Benchmark `durapipe compile`: cold process vs `import hera.workflows`, a 2,000-stage pipeline,
and how check and compile grow from 2,000 to 20,000 stages, against another revision.

    python benchmarks/compile_bench.py [--runs N] [--stages N] [--validate]
                                       [--scale 2000,20000] [--against REV]

Prints one line per measurement and a JSON summary.  Cold times are the median wall time of
N fresh processes, interleaved so that machine load affects both sides alike.  Targets
(issue 3): cold compile <= 0.5 s and >= 3x faster than importing hera; 2,000 stages < 3 s, every
object within Argo's limits (and, with --validate, passing the strict CRD validator).
Issue 13: 20,000 stages check and compile in time linear in 2,000 (ratio about 10), and no
regression against the previous commit (``--against``, default ``HEAD~1``; ``--against ''``
skips it).  Each size runs in its own child process, this checkout's and the other revision's
interleaved.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from previous import resolve, tree
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


def scale_child(stages: int) -> dict[str, float]:
    """Check (parse and validate generated text) and compile ``stages`` stages: the best of a
    few runs (one at 20,000), after a small warm-up run that pays the imports."""
    from check_bench import generate

    from durapipe.compiler import CompileOptions, compile_pipeline
    from durapipe.dsl import loads

    def once(n: int) -> tuple[float, float]:
        text = generate(n)
        t0 = time.perf_counter()
        loaded = loads(text, "big.pipe")
        t1 = time.perf_counter()
        assert loaded.pipeline is not None, loaded.diagnostics
        result = compile_pipeline(loaded.pipeline, CompileOptions())
        t2 = time.perf_counter()
        # 20,000 stages need more than Argo's 200 parts: the compiler does all of its work
        # and then reports P0403, which is what a user with such a file gets.
        assert result.ok or {d.code for d in result.diagnostics} == {"P0403"}
        return t1 - t0, t2 - t1

    once(20)
    runs = [once(stages) for _ in range(max(1, min(3, 10_000 // stages)))]
    return {"check_s": min(r[0] for r in runs), "compile_s": min(r[1] for r in runs)}


def run_child(stages: int, old_tree: Path | None) -> dict[str, float]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(stages)]
    if old_tree is not None:
        cmd += ["--tree", str(old_tree)]
    out = subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True).stdout
    times: dict[str, float] = json.loads(out.splitlines()[-1])
    return times


def scale(sizes: list[int], against: str) -> dict[str, object]:
    """Check and compile at each size, here and (when ``against``) at that revision."""
    sides: dict[str, dict[int, dict[str, float]]] = {"here": {}}
    with contextlib.ExitStack() as stack:
        old_tree = stack.enter_context(tree(against)) if against else None
        if old_tree is not None:
            sides[resolve(against)] = {}
        for n in sizes:
            sides["here"][n] = run_child(n, None)
            if old_tree is not None:
                sides[resolve(against)][n] = run_child(n, old_tree)
    summary: dict[str, object] = {}
    low, high = min(sizes), max(sizes)
    for side, times in sides.items():
        for n in sizes:
            print(f"{side:>8}: {n} stages: check {times[n]['check_s']:.2f} s, "
                  f"compile {times[n]['compile_s']:.2f} s")
        for phase in ("check_s", "compile_s"):
            ratio = times[high][phase] / times[low][phase]
            print(f"{side:>8}: {phase[:-2]} {high}/{low} = {ratio:.1f}x (linear = {high / low:g})")
            summary[f"{side}_{phase[:-2]}_{high}_over_{low}"] = round(ratio, 2)
    if len(sides) == 2:
        old = sides[resolve(against)]
        for n in sizes:
            for phase in ("check_s", "compile_s"):
                ratio = sides["here"][n][phase] / old[n][phase]
                print(f"here / {resolve(against)}: {phase[:-2]} {n} stages = {ratio:.2f}x")
                summary[f"here_over_previous_{phase[:-2]}_{n}"] = round(ratio, 2)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--stages", type=int, default=2000)
    parser.add_argument("--validate", action="store_true",
                        help="also run the strict CRD validator (tests/argo_schema) on every object")
    parser.add_argument("--scale", default="2000,20000",
                        help="stage counts for the growth measurement ('' to skip)")
    parser.add_argument("--against", default="HEAD~1",
                        help="git revision to compare the growth measurement with ('' to skip)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        if args.tree:
            sys.path.insert(0, args.tree)
        print(json.dumps(scale_child(args.child)))
        return 0

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
    if args.scale:
        summary.update(scale([int(n) for n in args.scale.split(",")], args.against))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
