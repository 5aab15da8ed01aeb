"""How the cost of Argo's own reconciliation grows with a compiled pipeline, in one run.

    python benchmarks/argo_scale.py [--sizes 40,80,160] [--shape chain|fan-out]

Each size is compiled as `durapipe compile` would (split into WorkflowTemplates where the
limits say so) and run to completion in Argo v4.1.2's controller (tools/argo-sim), every pod
succeeding at once.  Printed per size: the reconciliations (steps), the seconds Argo's
`operate` took in all, the seconds per step, and the ratios to the previous size.  A chain
finishes one stage per couple of steps while every step walks the whole DAG, so its total
grows as N^2 (a ratio near 4 when N doubles); a fan-out takes a fixed number of steps.  The
last line extrapolates the largest chain measured to 2,000 stages.  Needs Go and ../shared.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from durapipe.compiler import CompileOptions, compile_pipeline  # noqa: E402
from tests.argo.argo_tools import run_scenario  # noqa: E402
from tests.compiler.test_argo_controller import strip_artifacts  # noqa: E402
from tests.compiler.test_argo_controller_scale import fan_out  # noqa: E402
from tests.compiler.test_split import chain  # noqa: E402


def measure(shape: str, n: int) -> dict[str, Any]:
    pipeline = chain(n) if shape == "chain" else fan_out(n)
    result = compile_pipeline(pipeline, CompileOptions())
    *parts, workflow = result.documents
    for doc in result.documents:
        strip_artifacts(doc)
    workflow["metadata"] = {"name": pipeline.name}
    outcomes = {s.name: [{"outcome": "succeeded", "outputs": {"out-hash": f"sha-{s.name}"}}]
                for s in pipeline.stages}
    report = run_scenario({"name": pipeline.name, "workflow": workflow, "workflowTemplates": parts,
                           "runs": [{"attempts": outcomes}], "maxSteps": 20 * n + 100,
                           "expect": {}}, timeout=7200)
    run: dict[str, Any] = report["runs"][0]
    if report.get("error") or run["phase"] != "Succeeded":
        raise SystemExit(f"{shape} {n}: {report.get('error') or run['phase']}")
    return {"n": n, "parts": len(parts), "steps": run["steps"], "operate": run["operateSeconds"],
            "patches": run["podPatches"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="40,80,160")
    ap.add_argument("--shape", choices=("chain", "fan-out"), default="chain")
    args = ap.parse_args()
    rows = [measure(args.shape, int(n)) for n in args.sizes.split(",")]
    print(f"{'stages':>7} {'parts':>5} {'steps':>6} {'operate s':>10} {'ms/step':>8} "
          f"{'x total':>8} {'x ms/step':>9} {'pod patches':>11}")
    previous: dict[str, Any] | None = None
    for row in rows:
        per_step = 1000 * row["operate"] / row["steps"]
        ratio_total = ratio_step = ""
        if previous:
            ratio_total = f"{row['operate'] / previous['operate']:.2f}"
            ratio_step = f"{per_step / (1000 * previous['operate'] / previous['steps']):.2f}"
        print(f"{row['n']:>7} {row['parts']:>5} {row['steps']:>6} {row['operate']:>10.1f} "
              f"{per_step:>8.1f} {ratio_total:>8} {ratio_step:>9} {row['patches']:>11}")
        previous = row
    last = rows[-1]
    if args.shape == "chain":
        scale = (2000 / last["n"]) ** 2
        print(f"a 2,000-stage chain at this rate: about {last['operate'] * scale / 60:.0f} min of "
              f"Argo reconciliation ({last['n']} stages x {scale:.0f})")


if __name__ == "__main__":
    main()
