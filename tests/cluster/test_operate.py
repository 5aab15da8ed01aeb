"""`durapipe list`, `stop`, `terminate`, `delete`, `resubmit`, `logs` and `submit --dry-run`
on the client side: what they send, how they render, how each failure reads (against
tests/cluster/fake_api.py, with Workflows the real controller produced in
tests/cluster/recorded).  The `logs` tests are here, not on the e2e control plane, because
KWOK's pods have no logs: the pod-log API is answered by the fake server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
import yaml

from durapipe.cluster import operate, run_status
from durapipe.runtime import contract
from durapipe.runtime.verdict import verdict_line
from tests.cluster.fake_api import run_cli as run
from tests.cluster.fake_api import FakeApi, status_object
from tests.cluster.record_workflows import load_recorded

pytest.importorskip("kubernetes", reason="the `cluster` extra (kubernetes client) is missing")

BASE = "/apis/argoproj.io/v1alpha1/namespaces"
PODS = "/api/v1/namespaces/ml/pods"




def recorded(case: str, run_: int = 0, name: str = "", phase: str | None = None) -> Any:
    wf = load_recorded(case, run_)
    wf["metadata"]["namespace"] = "ml"
    if name:
        wf["metadata"]["name"] = name
    if phase:
        wf["status"]["phase"] = phase
    return wf


def test_list_shows_each_run_newest_first_with_duration_and_stages(
        api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = recorded("cache-hit", 0), recorded("cache-hit", 1)
    api.routes[("GET", f"{BASE}/ml/workflows")] = (200, {"items": [first, second]})
    code, out, err = run(capsys, "list", "churn-model", "-n", "ml",
                         "--kubeconfig", str(api.kubeconfig(tmp_path)))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "PHASE", "STARTED", "DURATION", "STAGES"]
    assert [line.split()[0] for line in lines[1:]] == [second["metadata"]["name"],
                                                       first["metadata"]["name"]]
    assert "Succeeded" in lines[1] and "Failed" in lines[2]
    assert "3/3 succeeded" in lines[1] and "2 cached" in lines[1]
    assert "1 failed" in lines[2]
    # Both selectors are asked: compiled Workflows and runs of the WorkflowTemplate.
    queries = [unquote(path) for method, path, _ in api.requests if method == "GET"]
    assert any("labelSelector=durapipe.dev/pipeline=churn-model" in q for q in queries)
    assert any("labelSelector=workflows.argoproj.io/workflow-template=churn-model" in q
               for q in queries)


def test_list_of_a_file_reads_its_pipeline_and_namespace(
        api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api.routes[("GET", f"{BASE}/ml-training/workflows")] = (200, {"items": []})
    code, out, err = run(capsys, "list", "examples/prep_train_eval.pipe",
                         "--kubeconfig", str(api.kubeconfig(tmp_path)), "--json")
    assert (code, json.loads(out)) == (0, []), err
    assert any("labelSelector=durapipe.dev/pipeline=churn-model" in unquote(p)
               for _, p, _ in api.requests)


def test_durations_read_as_people_say_them() -> None:
    assert operate.duration("2026-01-01T00:00:00Z", "2026-01-01T00:00:12Z") == "12s"
    assert operate.duration("2026-01-01T00:00:00Z", "2026-01-01T00:04:05Z") == "4m05s"
    assert operate.duration("2026-01-01T00:00:00Z", "2026-01-01T01:02:09Z") == "1h02m"
    assert operate.duration("", "") == "-"


@pytest.mark.parametrize("command,how", [("stop", "Stop"), ("terminate", "Terminate")])
def test_stop_and_terminate_merge_patch_the_shutdown(
        api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str,
        how: str) -> None:
    wf = recorded("cache-hit", 0, name="run-1", phase="Running")
    api.routes[("GET", f"{BASE}/ml/workflows/run-1")] = (200, wf)
    api.routes[("PATCH", f"{BASE}/ml/workflows/run-1")] = (200, wf)
    code, out, err = run(capsys, command, "run-1", "-n", "ml",
                         "--kubeconfig", str(api.kubeconfig(tmp_path)))
    assert code == 0, err
    assert out.startswith(f"run-1: {how.lower()} requested")
    patches = [(body, ct) for (method, _, body), ct in zip(api.requests, api.content_types)
               if method == "PATCH"]
    assert patches == [({"spec": {"shutdown": how}}, "application/merge-patch+json")]


def test_stopping_a_finished_run_changes_nothing(
        api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api.routes[("GET", f"{BASE}/ml/workflows/run-1")] = (200, recorded("cache-hit", 0, "run-1"))
    code, _, err = run(capsys, "stop", "run-1", "-n", "ml",
                       "--kubeconfig", str(api.kubeconfig(tmp_path)))
    assert code == 1 and err == "durapipe: run run-1 already ended (Failed); nothing to stop\n"
    assert not [r for r in api.requests if r[0] == "PATCH"]


@pytest.mark.parametrize("command", ["stop", "terminate", "delete", "resubmit", "logs"])
def test_no_such_run_is_one_line_with_a_hint(
        api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    code, out, err = run(capsys, command, "nope", "-n", "ml",
                         "--kubeconfig", str(api.kubeconfig(tmp_path)))
    assert (code, out) == (1, "")
    assert err == ("durapipe: no run nope in namespace ml; `durapipe list PIPELINE -n ml` "
                   "lists a pipeline's runs\n")


def test_forbidden_and_unreachable_are_one_line(
        api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api.routes[("GET", f"{BASE}/ml/workflows/run-1")] = (403, status_object(
        403, "Forbidden", 'workflows.argoproj.io "run-1" is forbidden: User "u" cannot get '
        'resource "workflows"'))
    code, _, err = run(capsys, "delete", "run-1", "-n", "ml",
                       "--kubeconfig", str(api.kubeconfig(tmp_path)))
    assert code == 1 and err.startswith("durapipe: not allowed to get Workflow run-1 (RBAC): ")
    assert err.count("\n") == 1 and "ask for a Role" in err
    kubeconfig = api.kubeconfig(tmp_path)
    kubeconfig.write_text(kubeconfig.read_text().replace(api.url, "http://127.0.0.1:9"))
    code, _, err = run(capsys, "list", "churn-model", "-n", "ml", "--kubeconfig",
                       str(kubeconfig))
    assert code == 1 and err.startswith("durapipe: cannot reach the Kubernetes API server at "
                                        "http://127.0.0.1:9 while trying to list Workflows")
    assert "Traceback" not in err and err.count("\n") == 1


def test_delete_deletes_the_workflow(api: FakeApi, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    api.routes[("GET", f"{BASE}/ml/workflows/run-1")] = (200, recorded("cache-hit", 0, "run-1"))
    api.routes[("DELETE", f"{BASE}/ml/workflows/run-1")] = (200, status_object(200, "", ""))
    code, out, err = run(capsys, "delete", "run-1", "-n", "ml",
                         "--kubeconfig", str(api.kubeconfig(tmp_path)))
    assert (code, out) == (0, "run-1: deleted\n"), err
    assert [m for m, _, _ in api.requests] == ["GET", "DELETE"]


def test_resubmit_creates_a_run_from_the_same_spec_and_arguments(
        api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = recorded("cache-hit", 0, "churn-model-abcde")
    old["metadata"]["generateName"] = "churn-model-"
    old["spec"]["shutdown"] = "Stop"
    api.routes[("GET", f"{BASE}/ml/workflows/churn-model-abcde")] = (200, old)

    def created(body: dict[str, Any] | None) -> dict[str, Any]:
        assert body is not None
        return {**body, "metadata": {**body["metadata"], "name": "churn-model-fghij"}}

    api.routes[("POST", f"{BASE}/ml/workflows")] = (201, created)
    code, out, err = run(capsys, "resubmit", "churn-model-abcde", "-n", "ml",
                         "--kubeconfig", str(api.kubeconfig(tmp_path)))
    assert (code, out) == (0, "churn-model-fghij\n"), err
    body = next(b for m, _, b in api.requests if m == "POST")
    assert body["metadata"]["generateName"] == "churn-model-"
    assert body["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "durapipe", "durapipe.dev/pipeline": "churn-model",
        "durapipe.dev/resubmitted-from": "churn-model-abcde"}
    expected = {k: v for k, v in old["spec"].items() if k != "shutdown"}
    assert body["spec"] == expected and "status" not in body
    # The memoization keys travel with the templates, so succeeded stages are cache hits.
    assert any("memoize" in t for t in body["spec"]["templates"])


# -- logs -------------------------------------------------------------------------------------


def test_a_verdict_line_reads_as_a_sentence() -> None:
    line = verdict_line(contract.VERDICT_APP_FAILURE,
                        {"reason": "exit code 3", "exit_code": 3, "stderr_tail": "boom"})
    assert operate.render_log_line(line) == \
        "durapipe: attempt ended: app_failure (exit code 3) exit 3"
    assert operate.render_log_line("step 10 loss=0.3") == "step 10 loss=0.3"
    assert operate.render_log_line("\x1b[2Jhi") == "\\x1b[2Jhi"
    # Text that looks like a verdict line but is none is shown as it is.
    assert operate.render_log_line(f"{contract.VERDICT_TAG}bogus {{") == \
        f"{contract.VERDICT_TAG}bogus {{"


def _pods_for(wf: dict[str, Any]) -> dict[str, Any]:
    """Pods as Argo names them (``<run>-<template>-<hash>``), the node on the annotation."""
    items = []
    for node in wf["status"]["nodes"].values():
        if node["type"] == "Pod":
            items.append({"metadata": {
                "name": f"{wf['metadata']['name']}-{node['templateName']}-{node['id'][-6:]}",
                "annotations": {run_status.ANNOTATION_NODE_ID: node["id"]}}})
    return {"kind": "PodList", "apiVersion": "v1", "items": items}


def _pod_name(wf: dict[str, Any], node: dict[str, Any]) -> str:
    return f"{wf['metadata']['name']}-{node['templateName']}-{node['id'][-6:]}"


def test_logs_of_each_attempt_by_stage_name(
        api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wf = recorded("oom-ladder", 0, name="run-1")
    api.routes[("GET", f"{BASE}/ml/workflows/run-1")] = (200, wf)
    api.routes[("GET", PODS)] = (200, _pods_for(wf))
    stages = run_status.stage_pods(wf)
    stage = next(s for s, nodes in stages.items() if len(nodes) > 1)
    for number, node in enumerate(stages[stage], 1):
        log = f"attempt {number} here\n" + verdict_line(contract.VERDICT_HOST_OOM, {
            "reason": "oom_kill counter grew by 1", "exit_code": contract.EXIT_HOST_OOM})
        api.routes[("GET", f"{PODS}/{_pod_name(wf, node)}/log")] = (200, {"text": log})
    # The fake answers JSON; the log API sends text: answer with its bytes.
    from tests.cluster.fake_api import Raw

    for node in stages[stage]:
        key = ("GET", f"{PODS}/{_pod_name(wf, node)}/log")
        api.routes[key] = (200, Raw(api.routes[key][1]["text"].encode(), "text/plain"))
    kubeconfig = str(api.kubeconfig(tmp_path))
    code, out, err = run(capsys, "logs", "run-1", stage, "--attempt", "1", "-n", "ml",
                         "--kubeconfig", kubeconfig)
    assert code == 0, err
    assert out == ("attempt 1 here\ndurapipe: attempt ended: host_oom (oom_kill counter grew "
                   f"by 1) exit {contract.EXIT_HOST_OOM}\n")
    code, out, err = run(capsys, "logs", "run-1", stage, "-n", "ml", "--kubeconfig", kubeconfig)
    assert code == 0 and out.startswith(f"attempt {len(stages[stage])} here\n"), err
    logs_asked = [p for m, p, _ in api.requests if p.split("?")[0].endswith("/log")]
    assert all("container=main" in p for p in logs_asked)


def test_logs_follow_streams_the_log_through_the_installed_client(
        api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``-f`` asks for ``follow=true`` with no read timeout; the client durapipe runs under
    (pydantic-validated from v36 on) must accept that request, and each line is printed as it
    arrives, a partial last line too."""
    from tests.cluster.fake_api import Raw

    wf = recorded("oom-ladder", 0, name="run-1")
    api.routes[("GET", f"{BASE}/ml/workflows/run-1")] = (200, wf)
    api.routes[("GET", PODS)] = (200, _pods_for(wf))
    stage, nodes = next(iter(run_status.stage_pods(wf).items()))
    log = "step 1\n" + "x" * 10_000 + "\nlast, unterminated"
    api.routes[("GET", f"{PODS}/{_pod_name(wf, nodes[-1])}/log")] = (
        200, Raw(log.encode(), "text/plain"))
    code, out, err = run(capsys, "logs", "run-1", stage, "-f", "-n", "ml",
                         "--kubeconfig", str(api.kubeconfig(tmp_path)))
    assert code == 0, err
    assert out == log + "\n"
    asked = [p for m, p, _ in api.requests if p.split("?")[0].endswith("/log")]
    assert len(asked) == 1 and "follow=true" in asked[0] and "container=main" in asked[0]


def test_logs_refuses_what_it_cannot_find_in_one_line(
        api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wf = recorded("oom-ladder", 0, name="run-1")
    api.routes[("GET", f"{BASE}/ml/workflows/run-1")] = (200, wf)
    api.routes[("GET", PODS)] = (200, {"items": []})
    stages = list(run_status.stage_pods(wf))
    kubeconfig = str(api.kubeconfig(tmp_path))
    if len(stages) > 1:
        code, _, err = run(capsys, "logs", "run-1", "-n", "ml", "--kubeconfig", kubeconfig)
        assert code == 1 and "name one: durapipe logs run-1 STAGE" in err
    code, _, err = run(capsys, "logs", "run-1", stages[0] + "x", "-n", "ml",
                       "--kubeconfig", kubeconfig)
    assert code == 1 and f"has no stage '{stages[0]}x'" in err and stages[0] in err
    code, _, err = run(capsys, "logs", "run-1", stages[0], "--attempt", "99", "-n", "ml",
                       "--kubeconfig", kubeconfig)
    assert code == 1 and "--attempt takes 1 to" in err
    code, _, err = run(capsys, "logs", "run-1", stages[0], "-n", "ml", "--kubeconfig", kubeconfig)
    assert code == 1 and "is gone (Argo's pod GC deleted it" in err
    assert all(e.count("\n") <= 1 for e in (err,))


# -- submit --dry-run -------------------------------------------------------------------------


@pytest.mark.parametrize("output", ["yaml", "json"])
def test_submit_dry_run_prints_what_would_be_created_and_creates_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], output: str) -> None:
    # No cluster at all: a file's dry run needs none.
    code, out, err = run(capsys, "submit", "examples/prep_train_eval.pipe", "--dry-run",
                         "-o", output, "-p", "snapshot=2026-12-01",
                         "--kubeconfig", str(tmp_path / "none"))
    assert code == 0, err
    docs = json.loads(out) if output == "json" else list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Workflow"]
    assert all(d["metadata"]["namespace"] == "ml-training" for d in docs)
    params = {p["name"]: p.get("value") for p in docs[1]["spec"]["arguments"]["parameters"]}
    assert params["snapshot"] == "2026-12-01"


def test_submit_dry_run_checks_parameters_too(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "submit", "examples/prep_train_eval.pipe", "--dry-run",
                         "-p", "snapshott=1", "--kubeconfig", str(tmp_path / "none"))
    assert (code, out) == (1, "") and "unknown parameter 'snapshott'" in err


def test_submit_watch_and_dry_run_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "submit", "x.pipe", "--dry-run", "--watch")
    assert code == 2 and "--watch" in err


# -- doctor -----------------------------------------------------------------------------------


def test_doctor_lines_carry_their_fix_only_on_failure() -> None:
    from durapipe.cluster.doctor import Check

    assert Check("Argo CRDs", True, "all four installed", "install").line() == \
        "ok    Argo CRDs: all four installed"
    assert Check("JobSet CRD", False, "missing\x1b[2J", "install JobSet").line() == \
        "FAIL  JobSet CRD: missing\\x1b[2J\n      fix: install JobSet"


def test_doctor_on_an_unreachable_cluster_is_one_line(
        api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = api.kubeconfig(tmp_path)
    kubeconfig.write_text(kubeconfig.read_text().replace(api.url, "http://127.0.0.1:9"))
    code, out, err = run(capsys, "doctor", "--kubeconfig", str(kubeconfig))
    assert (code, out) == (1, "")
    assert err.startswith("durapipe: cannot reach the Kubernetes API server at "
                          "http://127.0.0.1:9 while trying to get CRD workflows.argoproj.io")
    assert err.count("\n") == 1
