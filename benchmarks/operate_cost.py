"""What one fleet run costs Argo's reconciliation, in process: durapipe's output beside minimal
Workflows, and beside what another checkout of durapipe compiles.

    python benchmarks/operate_cost.py [--runs 20] [--rounds 4] [--baseline DIR ...]

The fleet benchmark (benchmarks/fleet_scale.py) measures the whole controller on a control
plane, which takes half an hour and mixes in informers, the API server and the machine's load.
This one runs the same work in Argo v4.1.2's own controller code in one process (the argo-sim
harness of tests/argo, the played executor of tests/compiler/test_argo_controller.py), and
times only ``operate``, the reconcile function whose CPU the fleet benchmark's profile put at
most of the controller's: a quick and steady measure of what a change of the lowering does to
it.

The work is fleet_scale's: ``FLEET_PIPELINE`` as ``durapipe compile`` writes it (inline kind,
artifacts removed: the harness moves none), and fleet_scale's ``minimal_workflow``; train's
first pod fails with exit 1 and every other pod succeeds, and each run has its own
``snapshot`` so each misses the cache. Each form runs ``--runs`` runs per scenario, rounds
interleaved across forms; printed per form: the median over rounds of ``operate``
milliseconds per run, and the ratio to the minimal form measured in the same rounds.

``--baseline DIR`` adds the output of the durapipe checkout in ``DIR`` (compiled with
``PYTHONPATH=DIR``), e.g. a ``git worktree`` of an earlier commit, to compare a change.
``--what-if NAME`` (repeatable) adds durapipe's output rewritten by one of
benchmarks/what_if.py's ``WHAT_IFS``: lowerings not built, measured as bounds. ``--folded`` is
``--what-if folded``: each stage's application budget folded into one ``retryStrategy``.

``--argo-patch DIFF`` measures every form a second time on Argo's controller with a unified
diff applied (paths relative to Argo's module, as in benchmarks/argo-patches/): what an
upstream change to Argo would do to each form, each ratio still to the minimal form on the
same controller.

Needs Go and ../shared (as tests/argo). Not a test and not part of CI.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

import yaml  # noqa: E402

from benchmarks.fleet_scale import FLEET_PIPELINE, minimal_workflow  # noqa: E402
from benchmarks.what_if import WHAT_IFS  # noqa: E402
from tests.argo import argo_tools  # noqa: E402
from tests.argo.argo_tools import run_scenario  # noqa: E402
from tests.compiler.test_argo_controller import strip_artifacts  # noqa: E402

#: Train fails once with an application error (exit 1), as in the fleet benchmark; the
#: durapipe form's first train pod is the H100 probe.
MINIMAL_FATES = {"train": [{"outcome": "failed", "exitCode": 1, "minutes": 1}]}
DURAPIPE_FATES = {"train-h100": [{"outcome": "failed", "exitCode": 1, "minutes": 1}]}


def compiled_by(checkout: Path) -> dict[str, Any]:
    """``FLEET_PIPELINE``'s Workflow as the durapipe in ``checkout`` compiles it."""
    with tempfile.TemporaryDirectory(prefix="operate-cost-") as tmp:
        src = Path(tmp) / "fleet.pipe"
        src.write_text(FLEET_PIPELINE)
        out = Path(tmp) / "out.yaml"
        proc = subprocess.run([sys.executable, "-m", "durapipe", "compile", "-o", str(out),
                               str(src)], capture_output=True, text=True, cwd=tmp,
                              env={**os.environ, "PYTHONPATH": str(checkout)})
        if proc.returncode:
            raise SystemExit(f"durapipe compile in {checkout} failed:\n{proc.stdout}"
                             f"{proc.stderr}")
        docs = [d for d in yaml.safe_load_all(out.read_text()) if d]
    workflow: dict[str, Any] = next(d for d in docs if d["kind"] == "Workflow")
    workflow["metadata"] = {"name": "fleet"}
    strip_artifacts(workflow)
    return workflow


def minimal() -> dict[str, Any]:
    workflow = minimal_workflow("")
    workflow["metadata"] = {"name": "fleet-m"}
    strip_artifacts(workflow)
    return workflow


def operate_ms_per_run(workflow: dict[str, Any], fates: dict[str, Any], runs: int,
                       params: tuple[str, str], binary: Path | None = None) -> float:
    """``operate`` milliseconds per run over ``runs`` runs of ``workflow``, each with its own
    values of the two params ``params`` names (snapshot, depth)."""
    snapshot, depth = params
    report = run_scenario({
        "name": "operate-cost", "workflow": workflow, "expect": {},
        "runs": [{"parameters": {snapshot: f"s{i}", depth: str(i)}, "attempts": fates}
                 for i in range(runs)]}, timeout=1800, binary=binary)
    if report.get("error"):
        raise SystemExit(f"the harness failed: {report['error']}")
    phases = {r["phase"] for r in report["runs"]}
    if phases != {"Succeeded"}:
        raise SystemExit(f"runs ended {sorted(phases)}, not all Succeeded")
    return 1000 * sum(r["operateSeconds"] for r in report["runs"]) / runs


def build_patched_argo_sim(diff: Path, out: Path) -> Path:
    """argo-sim built as tests/argo builds it, with the Argo files ``diff`` names patched: each
    is copied out of the read-only module, patched there and overlaid, so nothing is edited."""
    tool_dir = REPO / "tools" / "argo-sim"
    argo_dir = argo_tools.go_module_dir(tool_dir)
    replace = argo_tools.harness_overlay(tool_dir, argo_dir)
    for name in sorted(set(re.findall(r"^\+\+\+ (\S+)", diff.read_text(), re.M))):
        patched = out / name
        patched.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["patch", "--quiet", "-o", str(patched), str(argo_dir / name)],
                       input=diff.read_bytes(), check=True)
        replace[str(argo_dir / name)] = str(patched)
    (out / "overlay.json").write_text(json.dumps({"Replace": replace}))
    binary = out / "argo-sim"
    argo_tools.compile_test_binary("go", tool_dir, out / "overlay.json",
                                   argo_tools.CONTROLLER_PKG, binary)
    return binary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--baseline", type=Path, action="append", default=[])
    parser.add_argument("--folded", action="store_true",
                        help="add the application budget folded into one retryStrategy")
    parser.add_argument("--what-if", action="append", default=[], choices=sorted(WHAT_IFS),
                        help="add durapipe's output rewritten by this what-if")
    parser.add_argument("--argo-patch", type=Path, default=None, metavar="DIFF",
                        help="also measure every form on Argo's controller with DIFF applied")
    args = parser.parse_args()
    forms: dict[str, tuple[dict[str, Any], dict[str, Any], tuple[str, str]]] = {
        "minimal": (minimal(), MINIMAL_FATES, ("snapshot", "max-depth")),
        "durapipe": (compiled_by(REPO), DURAPIPE_FATES, ("snapshot", "max_depth")),
    }
    for what_if in (["folded"] if args.folded else []) + args.what_if:
        forms[f"durapipe-{what_if}"] = (WHAT_IFS[what_if](forms["durapipe"][0]),
                                        DURAPIPE_FATES, ("snapshot", "max_depth"))
    for checkout in args.baseline:
        forms[f"durapipe@{checkout}"] = (compiled_by(checkout.resolve()), DURAPIPE_FATES,
                                         ("snapshot", "max_depth"))
    controllers = {"": argo_tools.build_argo_sim()}
    if args.argo_patch:
        patched_dir = Path(tempfile.mkdtemp(prefix="operate-cost-argo-"))
        controllers["@patched"] = build_patched_argo_sim(args.argo_patch.resolve(), patched_dir)
    names = [name + suffix for suffix in controllers for name in forms]
    samples: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(args.rounds):
        measured: dict[str, float] = {}
        for suffix, binary in controllers.items():
            on_this = {name: operate_ms_per_run(wf, fates, args.runs, params, binary)
                       for name, (wf, fates, params) in forms.items()}
            for name, value in on_this.items():
                measured[name + suffix] = value
                samples[name + suffix].append(value)
                ratios[name + suffix].append(value / on_this["minimal"])
        print(f"round {round_index + 1}: " + ", ".join(
            f"{name} {value:.1f}" for name, value in measured.items()), flush=True)
    print(f"\noperate ms per run, median of {args.rounds} rounds of {args.runs} runs "
          "(ratio: to minimal within each round, median)")
    for name in names:
        print(f"  {name:<48} {statistics.median(samples[name]):8.1f} ms   "
              f"{statistics.median(ratios[name]):5.2f}x")
    print(json.dumps({name: {"ms_per_run": statistics.median(samples[name]),
                             "ratio_to_minimal": statistics.median(ratios[name])}
                      for name in names}))


if __name__ == "__main__":
    main()
