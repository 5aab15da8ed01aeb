"""Record the Workflow objects `durapipe status` is tested on: ``python -m
tests.cluster.record_workflows`` from the repository root.

Each case of ``recordings.yaml`` compiles an example, runs it through Argo v4.1.2's workflow
controller (tools/argo-sim, see docs/argo-harness.md) as the case's attempts say, and writes
the final Workflow object of every run to ``recorded/<case>-<run>.json``: what the API server
would return for it, never written by hand.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
CASES = HERE / "recordings.yaml"
RECORDED = HERE / "recorded"
REPO = HERE.parents[1]


def cases() -> list[dict[str, Any]]:
    loaded: list[dict[str, Any]] = yaml.safe_load(CASES.read_text(encoding="utf-8"))
    return loaded


def compiled(source: str) -> dict[str, Any]:
    from durapipe.compiler import CompileOptions, compile_pipeline
    from durapipe.dsl import load_path

    loaded = load_path(str(REPO / source))
    assert loaded.pipeline is not None and loaded.ok, source
    result = compile_pipeline(loaded.pipeline, CompileOptions(source_map=loaded.source_map))
    assert result.ok, result.diagnostics
    (doc,) = [d for d in result.documents if d["kind"] == "Workflow"]
    return doc


def run_case(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The final Workflow object of each of the case's runs."""
    from tests.argo.argo_tools import run_scenario

    doc = compiled(case["source"])
    # The harness runs in the default namespace (its WorkflowTaskResults are read there).
    doc["metadata"] = {"name": case["name"], "labels": doc["metadata"].get("labels", {})}
    report = run_scenario({"name": case["name"], "workflow": doc, "runs": case["runs"],
                           "expect": {}, "recordWorkflow": True,
                           "maxSteps": case.get("maxSteps", 400)})
    assert not report.get("error"), report.get("error")
    objects = []
    for run in report["runs"]:
        obj = run["object"]
        obj.setdefault("apiVersion", "argoproj.io/v1alpha1")
        obj.setdefault("kind", "Workflow")
        objects.append(obj)
    return objects


def recorded_path(case: str, run: int) -> Path:
    return RECORDED / f"{case}-{run}.json"


def load_recorded(case: str, run: int = 0) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(recorded_path(case, run).read_text(encoding="utf-8"))
    return loaded


def main(names: list[str]) -> int:
    RECORDED.mkdir(exist_ok=True)
    for case in cases():
        if names and case["name"] not in names:
            continue
        for i, obj in enumerate(run_case(case)):
            path = recorded_path(case["name"], i)
            path.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n", encoding="utf-8")
            print(f"{path.relative_to(REPO)}: {obj['status'].get('phase')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
