"""`queue` (#26 item 1): Kueue's label on every pod a stage creates, on a multi-node stage's
JobSet instead of its pods, nothing where no queue is named; and what `check` says of a queue
name Kubernetes would refuse, or of a GPU stage left out of the queues."""

from __future__ import annotations

import json
from typing import Any

import pytest

from durapipe.compiler import CompileOptions, compile_pipeline
from durapipe.compiler.checkpoint_gc import is_collector
from durapipe.dsl import builder as b
from durapipe.dsl.load import loads
from durapipe.dsl.model import Pipeline

LABEL = "kueue.x-k8s.io/queue-name"
SOURCE = """
pipeline "q" {
  storage = "s3://acme/durapipe"
  queue   = "team-a"
  checkpoint_gc { max_age = 7d }
}
stage "prep" { image = "busybox" command = ["true"] }
stage "train" {
  image = "python:3.12"
  command = ["python", "train.py"]
  needs = [prep]
  checkpoint = true
  resources { gpu { count = 1  types = ["H100", "A100"]  fallback_after = 30m } }
  retry { on_oom { memory = [8Gi, 16Gi] } }
}
stage "pretrain" {
  image = "python:3.12"
  command = ["python", "pretrain.py"]
  queue = "gpu-large"
  resources { gpu { count = 8  types = ["H100"] } }
  distributed { replicas = 2 }
}
"""


def _load(text: str) -> Pipeline:
    loaded = loads(text, "q.pipe")
    assert loaded.pipeline is not None and loaded.ok, loaded.diagnostics
    return loaded.pipeline


def _pod_templates(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc["spec"].get("workflowSpec", doc["spec"])
    return [t for t in spec["templates"] if "container" in t or "script" in t
            or "resource" in t]


def test_every_pod_carries_its_stage_s_queue_and_pod_less_templates_none() -> None:
    result = compile_pipeline(_load(SOURCE), CompileOptions())
    assert result.ok, result.diagnostics
    (workflow,) = [d for d in result.documents if not is_collector(d)]
    pods = _pod_templates(workflow)
    # prep, train's rungs (the GPU type is a parameter of each) and the ladder's end, and
    # pretrain's resource pod.
    assert len(pods) >= 5
    for template in pods:
        stage = template["metadata"]["labels"]["durapipe.dev/stage"]
        assert template["metadata"]["labels"][LABEL] == (
            "gpu-large" if stage == "pretrain" else "team-a"), template["name"]
    for template in workflow["spec"]["templates"]:
        if template not in pods:  # the DAG and the waits create no pod
            assert LABEL not in json.dumps(template.get("metadata", {})), template["name"]
    (collector,) = [d for d in result.documents if is_collector(d)]
    (pod,) = collector["spec"]["workflowSpec"]["templates"]
    assert pod["metadata"]["labels"][LABEL] == "team-a"
    assert LABEL not in collector["metadata"]["labels"]


def test_a_multi_node_stage_is_admitted_as_one_jobset() -> None:
    import yaml

    result = compile_pipeline(_load(SOURCE), CompileOptions())
    (template,) = [t for t in result.documents[0]["spec"]["templates"] if "resource" in t]
    jobset = yaml.safe_load(template["resource"]["manifest"])
    assert jobset["metadata"]["labels"][LABEL] == "gpu-large"
    (replicated,) = jobset["spec"]["replicatedJobs"]
    pod_labels = replicated["template"]["spec"]["template"]["metadata"]["labels"]
    assert LABEL not in pod_labels  # Kueue admits the JobSet, never its pods one by one


def test_without_a_queue_nothing_of_kueue_is_written() -> None:
    plain = SOURCE.replace('  queue   = "team-a"\n', "").replace('  queue = "gpu-large"\n', "")
    result = compile_pipeline(_load(plain), CompileOptions())
    assert "kueue" not in json.dumps(result.documents)


def test_the_builder_names_queues_alike() -> None:
    p = b.Pipeline("q", queue="team-a")
    p.stage("prep", image="busybox", command=["true"], queue="cpu")
    p.stage("train", image="busybox", command=["true"])
    labels = {t["name"]: t["metadata"]["labels"].get(LABEL)
              for t in _pod_templates(compile_pipeline(p.build()).documents[0])}
    assert labels == {"prep": "cpu", "train": "team-a"}


@pytest.mark.parametrize("where", ["pipeline", "stage"])
def test_a_queue_kubernetes_would_refuse_is_p0321_at_its_place(where: str) -> None:
    text = SOURCE.replace('queue   = "team-a"' if where == "pipeline" else
                          'queue = "gpu-large"', 'queue = "Team_A"')
    loaded = loads(text, "q.pipe")
    (found,) = [d for d in loaded.diagnostics if d.code == "P0321"]
    span = found.labels[0].span
    assert span is not None and text[span.start:span.end] == '"Team_A"'


def test_a_gpu_stage_outside_the_queues_is_warned_about() -> None:
    text = SOURCE.replace('  queue   = "team-a"\n', "")
    loaded = loads(text, "q.pipe")
    assert loaded.ok  # a warning
    (found,) = [d for d in loaded.diagnostics if d.code == "W0004"]
    assert "`train`" in found.message
    # Every stage inherits the pipeline's queue: nothing to warn about.
    assert not [d for d in loads(SOURCE, "q.pipe").diagnostics if d.code == "W0004"]
