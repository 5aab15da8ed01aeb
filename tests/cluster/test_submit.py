"""`durapipe submit`, `status` and `watch` on the client side: what they send and how each
failure reads (against tests/cluster/fake_api.py; tests/e2e runs them on the control plane)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from durapipe.cli import main
from tests.cluster.fake_api import FakeApi, fake_api, status_object
from tests.cluster.record_workflows import load_recorded

pytest.importorskip("kubernetes", reason="the `cluster` extra (kubernetes client) is missing")

BASE = "/apis/argoproj.io/v1alpha1/namespaces"
TEMPLATE = {"apiVersion": "argoproj.io/v1alpha1", "kind": "WorkflowTemplate",
            "metadata": {"name": "churn-model", "namespace": "ml", "resourceVersion": "7"},
            "spec": {"arguments": {"parameters": [{"name": "snapshot", "value": "2026-11-01"},
                                                  {"name": "max_depth", "value": "8"}]}}}


@pytest.fixture
def api() -> Any:
    with fake_api() as server:
        yield server


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def created(body: dict[str, Any] | None) -> dict[str, Any]:
    assert body is not None
    meta = dict(body["metadata"])
    meta["name"] = meta.pop("generateName", "") + "x7k2p"
    return {**body, "metadata": meta}


def test_submit_a_template_by_name_with_parameters(api: FakeApi, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    api.routes[("GET", f"{BASE}/ml/workflowtemplates/churn-model")] = (200, TEMPLATE)
    api.routes[("POST", f"{BASE}/ml/workflows")] = (201, created)
    code, out, err = run(capsys, "submit", "--template", "churn-model", "-p", "max_depth=12",
                         "--kubeconfig", str(api.kubeconfig(tmp_path, "ml")))
    assert (code, out, err) == (0, "churn-model-x7k2p\n", "")
    (_, _, body), = [r for r in api.requests if r[0] == "POST"]
    assert body["spec"] == {"workflowTemplateRef": {"name": "churn-model"},
                            "arguments": {"parameters": [{"name": "max_depth", "value": "12"}]}}
    assert body["metadata"]["generateName"] == "churn-model-"


def test_unknown_parameter_is_refused_before_anything_is_created(
        api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api.routes[("GET", f"{BASE}/ml/workflowtemplates/churn-model")] = (200, TEMPLATE)
    code, out, err = run(capsys, "submit", "--template", "churn-model", "-p", "max_dept=3",
                         "--kubeconfig", str(api.kubeconfig(tmp_path, "ml")))
    assert code == 1 and out == ""
    assert "unknown parameter 'max_dept' for WorkflowTemplate churn-model" in err
    assert "max_depth" in err and "Traceback" not in err
    assert not [r for r in api.requests if r[0] == "POST"]


def test_template_not_found(api: FakeApi, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    api.routes[("GET", f"{BASE}/ml/workflowtemplates/nope")] = (404, status_object(
        404, "NotFound", 'workflowtemplates.argoproj.io "nope" not found'))
    code, _, err = run(capsys, "submit", "--template", "nope",
                       "--kubeconfig", str(api.kubeconfig(tmp_path, "ml")))
    assert code == 1
    assert err == ('durapipe: cannot get WorkflowTemplate nope: not found in namespace ml '
                   '(workflowtemplates.argoproj.io "nope" not found); are Argo\'s CRDs '
                   'installed and the name right?\n')


def test_rbac_forbidden(api: FakeApi, tmp_path: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    message = ('workflows.argoproj.io is forbidden: User "ci" cannot create resource '
               '"workflows" in API group "argoproj.io" in the namespace "ml"')
    api.routes[("GET", f"{BASE}/ml/workflowtemplates/churn-model")] = (200, TEMPLATE)
    api.routes[("POST", f"{BASE}/ml/workflows")] = (403, status_object(403, "Forbidden", message))
    code, _, err = run(capsys, "submit", "--template", "churn-model",
                       "--kubeconfig", str(api.kubeconfig(tmp_path, "ml")))
    assert code == 1
    assert err.startswith("durapipe: not allowed to create Workflow churn-model-* (RBAC): ")
    assert message in err and "namespace ml" in err


def test_no_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code, _, err = run(capsys, "status", "some-run")
    assert code == 1
    assert err == (f"durapipe: no kubeconfig: {tmp_path / 'absent'} does not exist; pass "
                   "--kubeconfig FILE or set KUBECONFIG\n")


def test_api_unreachable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:  # a port nothing listens on once it is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    kubeconfig = FakeApi(url=f"http://127.0.0.1:{port}").kubeconfig(tmp_path)
    code, _, err = run(capsys, "status", "some-run", "--kubeconfig", str(kubeconfig))
    assert code == 1
    assert err.startswith(f"durapipe: cannot reach the Kubernetes API server at "
                          f"http://127.0.0.1:{port} while trying to get Workflow some-run: ")
    assert "Traceback" not in err


def test_submit_a_pipe_file_compiles_it_into_its_namespace(
        api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api.routes[("POST", f"{BASE}/ml-training/workflows")] = (201, created)
    api.routes[("POST", "/api/v1/namespaces/ml-training/configmaps")] = (201, lambda b: b)
    code, out, err = run(capsys, "submit", "examples/prep_train_eval.pipe", "-p", "max_depth=4",
                         "--kubeconfig", str(api.kubeconfig(tmp_path)))
    assert (code, out) == (0, "churn-model-x7k2p\n"), err
    # The runtime every pod mounts is created first, then the run.
    (_, cm_path, runtime), (_, _, body) = api.requests
    assert cm_path.startswith("/api/v1/namespaces/ml-training/configmaps")
    assert runtime["kind"] == "ConfigMap" and runtime["metadata"]["name"].startswith(
        "durapipe-runtime-")
    assert body["kind"] == "Workflow" and body["metadata"]["namespace"] == "ml-training"
    params = {p["name"]: p["value"] for p in body["spec"]["arguments"]["parameters"]}
    assert params["max_depth"] == "4" and params["snapshot"] == "2026-11-01"


def test_submit_a_pipe_file_checks_parameters_against_its_params(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "submit", "examples/prep_train_eval.pipe", "-p", "epochs=3")
    assert code == 1
    assert err.startswith("durapipe: unknown parameter 'epochs' for Workflow churn-model-")
    assert "(it declares: snapshot, max_depth)" in err


def test_submit_compiled_templates_applies_them_then_runs_the_entry(
        api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    compiled = tmp_path / "out.yaml"
    assert main(["compile", "--kind", "template", "examples/prep_train_eval.pipe",
                 "-o", str(compiled)]) == 0
    api.routes[("POST", f"{BASE}/ml-training/workflowtemplates")] = (201, lambda b: b)
    api.routes[("POST", f"{BASE}/ml-training/workflows")] = (201, created)
    api.routes[("POST", "/api/v1/namespaces/ml-training/configmaps")] = (201, lambda b: b)
    code, out, err = run(capsys, "submit", str(compiled), "-n", "ml-training",
                         "--kubeconfig", str(api.kubeconfig(tmp_path)))
    assert (code, out) == (0, "churn-model-x7k2p\n"), err
    methods = [(m, p.split("?")[0].split("/")[-1]) for m, p, _ in api.requests]
    assert methods == [("POST", "configmaps"), ("GET", "churn-model"),
                       ("POST", "workflowtemplates"), ("POST", "workflows")]
    assert api.requests[-1][2]["spec"] == {"workflowTemplateRef": {"name": "churn-model"}}


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "submit")[0] == 2
    code, _, err = run(capsys, "submit", "--template", "t", "-p", "novalue")
    assert code == 2 and "expected NAME=VALUE" in err


def test_status_prints_stages_and_json(api: FakeApi, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    wf = load_recorded("oom-ladder")
    api.routes[("GET", f"{BASE}/ml/workflows/oom-ladder")] = (200, wf)
    kubeconfig = str(api.kubeconfig(tmp_path, "ml"))
    code, out, _ = run(capsys, "status", "oom-ladder", "--kubeconfig", kubeconfig)
    assert code == 0
    assert "build-features" in out and "host_oom" in out and "1Ti" in out
    code, out, _ = run(capsys, "status", "oom-ladder", "--json", "--kubeconfig", kubeconfig)
    (stage,) = json.loads(out)["stages"]
    assert stage["stage"] == "build-features" and stage["memory"] == "1Ti"


def test_watch_follows_events_and_exits_with_the_end_phase(
        api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    final = load_recorded("spot-preemptions")
    running = json.loads(json.dumps(final))
    running["status"]["phase"] = "Running"
    running["metadata"]["resourceVersion"] = "10"
    expired = {"type": "ERROR", "object": status_object(410, "Expired", "too old resource version")}
    watches = iter([[expired], [{"type": "MODIFIED", "object": final}]])
    api.routes[("GET", f"{BASE}/ml/workflows/spot-preemptions")] = (200, running)
    api.routes[("GET", f"{BASE}/ml/workflows?watch")] = (200, lambda _b: next(watches))
    code, out, err = run(capsys, "watch", "spot-preemptions",
                         "--kubeconfig", str(api.kubeconfig(tmp_path, "ml")))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "spot-preemptions-run0: Running (3/6)"
    assert "spot-preemptions-run0: Succeeded (3/6)" in lines
    assert "train: Succeeded, attempt 4 success on 64Gi A10G" in lines
    # The 410 made it list again: two GETs of the object, two watches.
    gets = [p for m, p, _ in api.requests if m == "GET" and "watch" not in p]
    assert len(gets) == 2


def test_on_a_terminal_watch_redraws_its_table_in_place() -> None:
    import io

    from durapipe.cluster import run_status
    from durapipe.cluster.submit import Display

    out = io.StringIO()
    display = Display(out, tty=True)
    report = run_status.interpret(load_recorded("cache-hit", 1))
    display.show(report)
    display.show(report)
    first, second = out.getvalue().split("\x1b[5F\x1b[J")  # up over the 5 lines, clear
    assert first == second
    assert first.splitlines()[0] == "cache-hit-run1: Succeeded (2/2)"
    assert first.splitlines()[1].split() == ["STAGE", "PHASE", "ATTEMPTS", "PREEMPT", "FAILED",
                                             "OOM", "MEMORY", "GPU", "CACHE"]
