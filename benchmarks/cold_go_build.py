"""What a cold CI machine pays for the Go tools: every tool the tests build, from empty caches.

Runs in a child process per tool with fresh ``GOMODCACHE`` (module downloads from the proxy
included), ``GOCACHE`` and ``DURAPIPE_TOOLS_CACHE`` under one temporary directory, in the order
the test suite first needs them (argo-check, argo-sim, then the control plane), and prints the
seconds of each plus the load average before and after, since a loaded 2-core machine can
double them. A warm rebuild (same caches, nothing changed) is timed last: that is what a warm CI
run pays. Nothing is left behind unless ``--keep`` is given.

    python benchmarks/cold_go_build.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPS = {
    "argo-check": "from argo.argo_tools import build_argo_check as b; b()",
    "argo-sim": "from argo.argo_tools import build_argo_sim as b; b()",
    "control plane (etcd, kube-*, kwok, workflow-controller)":
        "from e2e.cluster import build_binaries as b; b()",
}


def run_step(code: str, env: dict[str, str]) -> float:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", f"import sys; sys.path[:0] = ['{REPO / 'tests'}', "
                    f"'{REPO}']; {code}"], env=env, check=True, cwd=REPO)
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="use (and keep) this directory for the caches")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="durapipe-cold-go-"))
    env = {**os.environ, "GOMODCACHE": str(root / "gomod"), "GOCACHE": str(root / "gocache"),
           "DURAPIPE_TOOLS_CACHE": str(root / "tools"),
           "PATH": os.environ.get("PATH", "") + ":/usr/local/go/bin"}
    print(f"load average before: {os.getloadavg()}", flush=True)
    total = 0.0
    try:
        for name, code in STEPS.items():
            seconds = run_step(code, env)
            total += seconds
            print(f"cold  {name:58s} {seconds:8.1f} s", flush=True)
        print(f"cold  {'all':58s} {total:8.1f} s", flush=True)
        warm = sum(run_step(code, env) for code in STEPS.values())
        print(f"warm  {'all (cached binaries reused)':58s} {warm:8.1f} s", flush=True)
        print(f"load average after: {os.getloadavg()}", flush=True)
    finally:
        if not args.keep:
            subprocess.run(["chmod", "-R", "u+w", str(root)], check=False)  # module cache is r/o
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
