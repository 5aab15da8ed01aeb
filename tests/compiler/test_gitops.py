"""GitOps output: `-o DIR/` and `--gitops` give what kustomize, Argo CD and Flux apply.

Each complaint of issue 11 it answers has a test here: `kubectl kustomize` failed on the
default Workflow's `generateName`, `schedule` was dropped into a plain Workflow, the pods had no
RBAC.  kubectl is /usr/bin/kubectl (Debian's `kubectl` package; skips, and fails in CI, where it
is absent).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from durapipe.cli import main
from durapipe.compiler import CompileOptions, compile_pipeline
from durapipe.dsl import load_path
from durapipe.dsl.load import loads as load_text

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.pipe"))
ARGO_KINDS = {"Workflow", "WorkflowTemplate", "CronWorkflow"}


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl is not installed (apt-get install kubectl); CI has it")
    return found


def kustomize(directory: Path) -> list[dict[str, Any]]:
    proc = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def canonical(doc: dict[str, Any]) -> str:
    return json.dumps(doc, sort_keys=True)


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(d["kind"] for d in docs)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_kubectl_kustomize_accepts_every_example(path: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    out = tmp_path / "deploy"
    assert main(["compile", str(path.relative_to(REPO)), "-o", f"{out}/",
                 "--kustomization"]) == 0
    docs = kustomize(out)
    argo = [d for d in docs if d["kind"] in ARGO_KINDS]
    assert len(argo) >= 1
    for doc in docs:
        assert doc["metadata"].get("name"), doc["kind"]
        assert "generateName" not in doc["metadata"]
    # No run-once Workflow unless asked for: a template, or a CronWorkflow for a schedule.
    assert {d["kind"] for d in argo} <= {"WorkflowTemplate", "CronWorkflow"}
    pipeline = load_path(path).pipeline
    assert pipeline is not None
    account = pipeline.service_account or f"{pipeline.name}-durapipe"
    for doc in argo:
        spec = doc["spec"].get("workflowSpec", doc["spec"])
        assert spec["serviceAccountName"] == account
    # The runtime every pod mounts travels with the pipeline (durapipe-runtime.yaml).
    runtime = [d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"]
    assert len(runtime) == 1 and runtime[0].startswith("durapipe-runtime-")
    assert all(runtime[0] in json.dumps(d) for d in argo)
    rbac = kinds([d for d in docs if d["kind"] not in {*ARGO_KINDS, "ConfigMap"}])
    # An account the pipeline names is the cluster's: bound, not created.
    assert rbac == (["Role", "RoleBinding"] if pipeline.service_account else
                    ["Role", "RoleBinding", "ServiceAccount"])
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    assert account in [s["name"] for s in binding["subjects"]]


def test_all_examples_in_one_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    out = tmp_path / "deploy"
    rel = [str(p.relative_to(REPO)) for p in EXAMPLES]
    assert main(["compile", *rel, "-o", f"{out}/", "--kustomization"]) == 0
    kust = yaml.safe_load((out / "kustomization.yaml").read_text())
    on_disk = sorted(p.name for p in out.iterdir() if p.name != "kustomization.yaml")
    assert kust["resources"] == on_disk  # every file written is named, nothing else
    written = [d for n in on_disk for d in yaml.safe_load_all((out / n).read_text()) if d]
    built = kustomize(out)
    assert sorted(map(canonical, built)) == sorted(map(canonical, written))
    # One Role and RoleBinding per pipeline, named after it: no clashes.
    assert kinds(built).count("RoleBinding") == len(EXAMPLES)
    assert main(["compile", *rel, "-o", f"{out}/", "--kustomization", "--check"]) == 0


def test_a_run_once_workflow_where_asked_has_a_fixed_name(tmp_path: Path) -> None:
    """The issue's failure: `generateName` made `kubectl kustomize` fail with "missing
    metadata.name"; asked for, the Workflow now carries `metadata.name`."""
    out = tmp_path / "deploy"
    path = str(REPO / "examples" / "prep_train_eval.pipe")
    assert main(["compile", path, "-o", f"{out}/", "--kind", "workflow",
                 "--kustomization"]) == 0
    workflow = [d for d in kustomize(out) if d["kind"] == "Workflow"]
    assert [w["metadata"]["name"] for w in workflow] == ["churn-model"]
    # stdout keeps `generateName`, for `argo submit` / `kubectl create` of a new run each time.
    result = compile_pipeline(load_path(path).pipeline, CompileOptions())
    assert result.documents[0]["metadata"]["generateName"] == "churn-model-"


SCHEDULED = """
pipeline "nightly" {
  schedule = "0 3 * * *"
  timezone = "Europe/Berlin"
}
stage "train" {
  image = "python:3.12"
  command = ["python", "-c", "print(1)"]
}
"""


def test_schedule_makes_a_cron_workflow() -> None:
    """The issue's failure: `schedule` compiled to a plain Workflow, the schedule dropped."""
    loaded = load_text(SCHEDULED, "nightly.pipe")
    assert loaded.ok and loaded.pipeline is not None
    docs = compile_pipeline(loaded.pipeline, CompileOptions()).documents
    assert [d["kind"] for d in docs] == ["CronWorkflow"]
    assert docs[0]["spec"]["schedules"] == ["0 3 * * *"]
    assert docs[0]["spec"]["timezone"] == "Europe/Berlin"


@pytest.mark.parametrize("kind", ["workflow", "template"])
def test_schedule_with_another_kind_is_an_error_in_check_and_compile(kind: str) -> None:
    text = SCHEDULED.replace('timezone = "Europe/Berlin"', f'kind = "{kind}"')
    loaded = load_text(text, "nightly.pipe")
    assert [d.code for d in loaded.diagnostics] == ["P0345"]
    ok = load_text(SCHEDULED, "nightly.pipe")
    assert ok.pipeline is not None
    result = compile_pipeline(ok.pipeline, CompileOptions(kind=kind))  # type: ignore[arg-type]
    assert [d.code for d in result.diagnostics] == ["P0345"] and not result.documents


def test_rbac_has_exactly_what_the_pods_use() -> None:
    from durapipe.compiler.rbac import rbac_documents

    pipeline = load_path(REPO / "examples" / "prep_train_eval.pipe").pipeline
    assert pipeline is not None
    sa, role, binding = rbac_documents(pipeline)
    assert (sa["kind"], sa["metadata"]["name"]) == ("ServiceAccount", "churn-model-durapipe")
    assert role["rules"] == [
        {"apiGroups": ["argoproj.io"], "resources": ["workflowtaskresults"],
         "verbs": ["create", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "churn-model-durapipe",
                                    "namespace": "ml-training"}]
    multi = load_path(REPO / "examples" / "multinode_pretrain.pipe").pipeline
    assert multi is not None
    [multi_role] = [d for d in rbac_documents(multi) if d["kind"] == "Role"]
    assert multi_role["rules"][-1] == {
        "apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["create", "get"]}


def test_a_named_service_account_is_bound_not_created(tmp_path: Path) -> None:
    text = SCHEDULED.replace('timezone = "Europe/Berlin"',
                             'service_account = "trainer"\n  namespace = "ml"')
    src = tmp_path / "nightly.pipe"
    src.write_text(text)
    out = tmp_path / "deploy"
    assert main(["compile", str(src), "-o", f"{out}/", "--kustomization"]) == 0
    docs = kustomize(out)
    assert kinds(docs) == ["ConfigMap", "CronWorkflow", "Role", "RoleBinding"]
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "trainer",
                                    "namespace": "ml"}]
    cron = next(d for d in docs if d["kind"] == "CronWorkflow")
    assert cron["spec"]["workflowSpec"]["serviceAccountName"] == "trainer"


def test_no_rbac_leaves_the_objects_and_the_account_out(tmp_path: Path) -> None:
    out = tmp_path / "deploy"
    path = str(REPO / "examples" / "prep_train_eval.pipe")
    assert main(["compile", path, "-o", f"{out}/", "--kustomization", "--no-rbac"]) == 0
    docs = kustomize(out)
    # The runtime's ConfigMap stays: it is the pods' code, not RBAC.
    assert kinds(docs) == ["ConfigMap", "WorkflowTemplate"]
    template = next(d for d in docs if d["kind"] == "WorkflowTemplate")
    assert "serviceAccountName" not in template["spec"]


def test_gitops_stdout_is_the_directory_in_one_stream(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = str(REPO / "examples" / "prep_train_eval.pipe")
    out = tmp_path / "deploy"
    assert main(["compile", path, "-o", f"{out}/"]) == 0
    capsys.readouterr()
    assert main(["compile", path, "--gitops"]) == 0
    streamed = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    written = [d for f in sorted(out.iterdir()) for d in yaml.safe_load_all(f.read_text()) if d]
    assert sorted(map(canonical, streamed)) == sorted(map(canonical, written))


def test_conflicting_objects_of_two_pipelines_are_refused(tmp_path: Path) -> None:
    """The directory writer lists whatever the compiler emits; the same object from two
    pipelines is written once, and two different objects of one name are refused."""
    from durapipe.compiler.cli import Compiled, DirectoryConflict, directory_files

    shared = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "shared"},
              "data": {"a": "1"}}
    args = type("Args", (), {"output": f"{tmp_path}/", "kustomization": True})()
    a = Compiled("a.pipe", "a", "", [shared, {"apiVersion": "v1", "kind": "X",
                                              "metadata": {"name": "a"}}], [])
    b = Compiled("b.pipe", "b", "", [shared], [])
    files = directory_files([a, b], args)  # type: ignore[arg-type]
    assert sorted(Path(p).name for p in files) == ["a.yaml", "kustomization.yaml"]
    changed = {**shared, "data": {"a": "2"}}
    with pytest.raises(DirectoryConflict):
        directory_files([a, Compiled("b.pipe", "b", "", [changed], [])], args)  # type: ignore[arg-type]
