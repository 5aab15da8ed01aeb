"""Cluster settings (issue 11: all were P0201) and `pod_patch`, from `.pipe` and builder alike,
and what each becomes in the compiled pod."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from durapipe.compiler import CompileOptions, compile_pipeline
from durapipe.compiler.argo_pod import strategic_merge
from durapipe.dsl import builder as b
from durapipe.dsl import kube
from durapipe.dsl.load import loads
from durapipe.dsl.model import Pipeline

SETTINGS = """
pipeline "p" {
  service_account = "trainer"
  image_pull_secrets = ["regcred"]
}
defaults {
  node_selector { "example.com/pool" = "ml" }
  tolerations = ["dedicated=ml:NoSchedule"]
  priority_class = "batch-low"
}
stage "train" {
  image = "python:3.12"
  command = ["python", "-c", "print(1)"]
  env {
    MODE = config_map("train-config", "mode")
    TOKEN = secret("hf", "token")
  }
  service_account = "gpu-trainer"
  tolerations = ["nvidia.com/gpu"]
  affinity {
    required { "topology.kubernetes.io/zone" = ["us-east-1a", "us-east-1b"] }
    preferred { "example.com/disk" = ["nvme"] }
  }
  labels { team = "vision" }
  annotations { "example.com/owner" = "ana" }
  volumes {
    data { claim = "datasets" path = "/data" read_only = true }
    creds { secret = "gcs-key" path = "/etc/gcs" }
    conf { config_map = "train-config" path = "/etc/train" }
  }
  pod_patch = <<EOT
  {"securityContext": {"runAsNonRoot": true},
   "containers": [{"name": "main", "securityContext": {"runAsUser": 1000}}]}
  EOT
}
"""


def builder_twin() -> Pipeline:
    p = b.Pipeline("p", service_account="trainer", image_pull_secrets=["regcred"])
    p.defaults(node_selector={"example.com/pool": "ml"},
               tolerations=["dedicated=ml:NoSchedule"], priority_class="batch-low")
    p.stage("train", image="python:3.12", command=["python", "-c", "print(1)"],
            env={"MODE": b.config_map("train-config", "mode"), "TOKEN": b.secret("hf", "token")},
            service_account="gpu-trainer", tolerations=["nvidia.com/gpu"],
            affinity=b.Affinity(required={"topology.kubernetes.io/zone": ["us-east-1a",
                                                                          "us-east-1b"]},
                                preferred={"example.com/disk": ["nvme"]}),
            labels={"team": "vision"}, annotations={"example.com/owner": "ana"},
            volumes={"data": b.Volume(claim="datasets", path="/data", read_only=True),
                     "creds": {"secret": "gcs-key", "path": "/etc/gcs"},
                     "conf": b.Volume(config_map="train-config", path="/etc/train")},
            pod_patch={"containers": [{"name": "main", "securityContext": {"runAsUser": 1000}}],
                       "securityContext": {"runAsNonRoot": True}})
    return p.build()


def loaded() -> Pipeline:
    result = loads(SETTINGS, "p.pipe")
    assert result.diagnostics == [] and result.pipeline is not None
    return result.pipeline


def template(pipeline: Pipeline) -> dict[str, Any]:
    docs = compile_pipeline(pipeline, CompileOptions()).documents
    return next(t for t in docs[0]["spec"]["templates"] if t["name"] == "train")


def test_settings_were_unknown_and_are_now_accepted() -> None:
    """Issue 11: every one of these was P0201 (unknown attribute)."""
    pipeline = loaded()
    stage = pipeline.stages[0]
    assert stage.service_account == "gpu-trainer" and stage.priority_class == "batch-low"
    assert stage.tolerations == ("nvidia.com/gpu",)  # a stage's list replaces the default
    assert stage.node_selector == {"example.com/pool": "ml"}  # from defaults
    assert pipeline.image_pull_secrets == ("regcred",)


def test_builder_twin_builds_an_equal_model() -> None:
    assert builder_twin() == loaded()


def test_what_each_setting_becomes() -> None:
    pipeline = loaded()
    docs = compile_pipeline(pipeline, CompileOptions()).documents
    spec = docs[0]["spec"]
    assert spec["serviceAccountName"] == "trainer"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    t = template(pipeline)
    assert t["serviceAccountName"] == "gpu-trainer"
    assert t["priorityClassName"] == "batch-low"
    assert t["nodeSelector"] == {"example.com/pool": "ml"}
    assert t["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    node = t["affinity"]["nodeAffinity"]
    assert node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In",
                               "values": ["us-east-1a", "us-east-1b"]}]}]
    assert node["preferredDuringSchedulingIgnoredDuringExecution"][-1]["preference"] == {
        "matchExpressions": [{"key": "example.com/disk", "operator": "In", "values": ["nvme"]}]}
    assert t["metadata"]["labels"]["team"] == "vision"
    assert t["metadata"]["annotations"] == {"example.com/owner": "ana"}
    volumes = {v["name"]: v for v in t["volumes"]}
    assert volumes["v-data"]["persistentVolumeClaim"] == {"claimName": "datasets",
                                                          "readOnly": True}
    assert volumes["v-creds"]["secret"] == {"secretName": "gcs-key"}
    assert volumes["v-conf"]["configMap"] == {"name": "train-config"}
    mounts = {m["name"]: m for m in t["container"]["volumeMounts"]}
    assert mounts["v-data"] == {"name": "v-data", "mountPath": "/data", "readOnly": True}
    assert mounts["v-creds"]["readOnly"] is True
    env = {e["name"]: e for e in t["container"]["env"]}
    assert env["MODE"]["valueFrom"] == {"configMapKeyRef": {"name": "train-config",
                                                            "key": "mode"}}
    assert env["TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    # The sidecar gets no user volume and no user env.
    sidecar = t.get("sidecars", [{}])[0]
    assert not any(m["name"].startswith("v-") for m in sidecar.get("volumeMounts", []))
    patch = json.loads(t["podSpecPatch"])
    assert patch["securityContext"] == {"runAsNonRoot": True}
    assert patch["containers"] == [{"name": "main", "securityContext": {"runAsUser": 1000}}]


def test_user_affinity_joins_the_gpu_type_affinity() -> None:
    text = SETTINGS.replace('  service_account = "gpu-trainer"',
                            '  resources { gpu { types = ["H100", "A100"] } }')
    result = loads(text, "p.pipe")
    assert result.pipeline is not None, result.diagnostics
    terms = (template(result.pipeline)["affinity"]["nodeAffinity"]
             ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"])
    assert len(terms) == 1 and len(terms[0]["matchExpressions"]) == 2  # GPU type AND zone


def test_pod_patch_merges_with_durapipes_own_patch() -> None:
    text = SETTINGS.replace('"runAsUser": 1000}}]}',
                            '"runAsUser": 1000}}], "terminationGracePeriodSeconds": 30}')
    text = text.replace('  service_account = "gpu-trainer"', '  checkpoint = true')
    text = text.replace('pipeline "p" {', 'pipeline "p" {\n  storage = "s3://b/p"')
    result = loads(text, "p.pipe")
    assert result.pipeline is not None, result.diagnostics
    patch = json.loads(template(result.pipeline)["podSpecPatch"])
    assert patch["terminationGracePeriodSeconds"] == 30  # the user's wins


def test_pod_patch_applies_to_jobset_pods() -> None:
    text = (Path(__file__).resolve().parents[2] / "examples" / "multinode_pretrain.pipe"
            ).read_text()
    text = text.replace('stage "pretrain" {', 'stage "pretrain" {\n  pod_patch = '
                        '"{\\"hostIPC\\": true}"', 1)
    result = loads(text, "m.pipe")
    assert result.pipeline is not None and result.pipeline.stages[-1].pod_patch, \
        result.diagnostics
    yaml_text = json.dumps(compile_pipeline(result.pipeline, CompileOptions()).documents)
    assert '\\"hostIPC\\": true' in yaml_text or "hostIPC: true" in yaml_text


def test_strategic_merge() -> None:
    base = {"containers": [{"name": "main", "image": "a"}, {"name": "side", "image": "b"}],
            "nodeSelector": {"a": "1"}, "hostIPC": True}
    patch = {"containers": [{"name": "main", "image": "c"}, {"name": "new"}],
             "nodeSelector": {"b": "2"}, "hostIPC": None, "tolerations": [{"key": "k"}]}
    assert strategic_merge(base, patch) == {
        "containers": [{"name": "main", "image": "c"}, {"name": "side", "image": "b"},
                       {"name": "new"}],
        "nodeSelector": {"a": "1", "b": "2"}, "tolerations": [{"key": "k"}]}


@pytest.mark.parametrize(("patch", "path", "message"), [
    ('{"hostIPCs": true}', ("hostIPCs",), "not a field"),
    ('{"hostIPC": "yes"}', ("hostIPC",), "expected boolean"),
    ('{"containers": [{"name": "main", "resources": {"limit": {}}}]}',
     ("containers", 0, "resources", "limit"), "not a field"),
    ('{"volumes": [{"name": "x", "emptyDir": {"sizeLimit": "1Gi"}}], "$patch": "merge"}',
     None, None),
    ("[1]", (), "not a JSON object"),
    ("{", (), "not JSON"),
])
def test_pod_patch_is_checked_against_the_pod_schema(patch: str, path: Any,
                                                     message: Any) -> None:
    problems = kube.patch_problems(patch)
    if path is None:
        assert problems == []
    else:
        assert [p.path for p in problems] == [path]
        assert message in problems[0].message


def test_the_pod_patch_diagnostic_points_at_the_bad_key() -> None:
    text = SETTINGS.replace('"runAsUser": 1000', '"runAsUsr": 1000')
    result = loads(text, "p.pipe")
    [diag] = result.diagnostics
    assert diag.code == "P0344"
    span = diag.labels[0].span
    assert span is not None and text[span.start:span.end] == '"runAsUsr"'



@pytest.mark.parametrize(("setting", "code"), [
    ('service_account = "Bad_Name"', "P0321"),
    ('priority_class = "-x"', "P0321"),
    ('env { A = config_map("Bad Name", "k") }', "P0321"),
    ('volumes { "Data" { claim = "d" path = "/data" } }', "P0321"),
    ('node_selector { "bad key!" = "x" }', "P0321"),
    ('affinity { required { zone = ["a b"] } }', "P0321"),
    ('tolerations = ["k=v:Never"]', "P0342"),
    ('volumes { d { path = "/data" } }', "P0343"),
    ('volumes { d { claim = "d" path = "data" } }', "P0343"),
    ('volumes { d { claim = "d" path = "/x" }  e { claim = "e" path = "/x/" } }', "P0343"),
    ('volumes { d { claim = "d" path = "/dev/shm" } }', "P0343"),
    ('pod_patch = "{\\"nope\\": 1}"', "P0344"),
])
def test_values_the_api_server_would_reject(setting: str, code: str) -> None:
    text = f"""pipeline "p" {{ }}
stage "s" {{
  image = "python:3.12"
  command = ["true"]
  {setting}
}}
"""
    result = loads(text, "p.pipe")
    assert [d.code for d in result.diagnostics] == [code], result.diagnostics


def test_runtime_root_agrees_with_the_compiler() -> None:
    from durapipe.compiler.plan import RUNTIME_ROOT

    assert kube.RUNTIME_ROOT == RUNTIME_ROOT
