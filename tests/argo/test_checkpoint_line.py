"""An inputs-scoped checkpoint line (``checkpoint { scope = "inputs" }``, the default) as
Argo's controller names it: the compiled key expression, evaluated by Argo v4.1.2 over the
run's params, is what ``memo.runtime_key`` gives (the local runner's), the same for two runs
with the same inputs and another when a param changes, for a single pod (its own expression)
and a grid's pods (the key the grid passes as ``checkpoint-key``).  The upstream content
hashes enter the same expression as they enter ``memoize.key`` (tests/argo/scenarios/
memoize-reuse.yaml); tools/argo-sim cannot complete a pod with output artifacts, which an
upstream stage needs."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from durapipe.cluster import run_status
from durapipe.compiler import CompileOptions, compile_pipeline, memo
from durapipe.compiler.argo_pod import RESUME_FROM_PARAM
from durapipe.compiler.plan import cache_static
from durapipe.dsl import load_path
from durapipe.runtime import contract

from .argo_tools import run_scenario

pytestmark = pytest.mark.harness

SOURCE = """
pipeline "lines" {{ storage = "s3://b/p" }}
params {{ lr: float = 0.1 }}
stage "train" {{
  image = "busybox"
  command = ["train", "--lr", params.lr]
  checkpoint = true
  {retry}
}}
"""


def run_pod(run: dict[str, Any], task: str) -> dict[str, Any]:
    (pod,) = [a["pod"] for a in run["attempts"] if a["displayName"].startswith(task)]
    return pod  # type: ignore[no-any-return]


def compiled(tmp_path: Path, retry: str) -> tuple[dict[str, Any], Any]:
    source = tmp_path / "lines.pipe"
    source.write_text(textwrap.dedent(SOURCE.format(retry=retry)))
    loaded = load_path(source)
    assert loaded.pipeline is not None, loaded.diagnostics
    result = compile_pipeline(loaded.pipeline, CompileOptions())
    assert result.ok, result.diagnostics
    (doc,) = [d for d in result.documents if d["kind"] == "Workflow"]
    # The harness runs in the default namespace (its WorkflowTaskResults are read there).
    doc["metadata"] = {"name": "lines", "labels": doc["metadata"].get("labels", {})}
    (train,) = [s for s in loaded.pipeline.stages if s.name == "train"]
    return doc, train


@pytest.mark.parametrize("retry,task", [("", "train"), ("retry { attempts = 1 }", "train-app-0")],
                         ids=["single-pod", "grid"])
def test_argo_names_the_line_by_the_stages_inputs(tmp_path: Path, retry: str, task: str) -> None:
    workflow, train = compiled(tmp_path, retry)
    runs = ["0.1", "0.1", "0.2"]
    earlier = {"train": "s3://b/p/lines/inputs/train/0123/checkpoints"}
    report = run_scenario({
        "name": "checkpoint-line", "workflow": workflow, "recordWorkflow": True,
        "runs": [{"parameters": {"lr": lr, **({RESUME_FROM_PARAM: json.dumps(earlier)}
                                             if i == 2 else {})},
                  "attempts": {task: [{"outcome": "succeeded", "minutes": 1}]}}
                 for i, lr in enumerate(runs)],
    })
    assert not report.get("error"), report.get("error")
    lines = []
    for run, lr in zip(report["runs"], runs):
        assert run["phase"] == "Succeeded", run
        (pod,) = [a["pod"] for a in run["attempts"] if a["displayName"].startswith(task)]
        lines.append(pod["env"][contract.ENV_CHECKPOINT_URI])
        key = memo.runtime_key(cache_static(train), {"lr": lr}, {})
        assert lines[-1] == f"s3://b/p/lines/inputs/train/{key}/checkpoints"
        # `durapipe submit --resume-from` reads the same line back from the Workflow object.
        assert run_status.checkpoint_lines(run["object"]) == {"train": lines[-1]}
    # The earlier run's lines reach the pod as given; by default, none.
    assert [json.loads(run_pod(run, task)["env"][contract.ENV_CHECKPOINT_RESUME_FROM] or "{}")
            for run in report["runs"]] == [{}, {}, earlier]
    assert lines[0] == lines[1] and len(set(lines)) == 2
