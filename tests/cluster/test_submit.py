"""`durapipe submit`, `status` and `watch` on the client side: what they send and how each
failure reads (against tests/cluster/fake_api.py; tests/e2e runs them on the control plane)."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from durapipe.cli import main
from tests.cluster.fake_api import run_cli as run
from tests.cluster.fake_api import (
    FakeApi,
    Raw,
    Reply,
    drips,
    fake_api,
    never_answers,
    raw_server,
    status_object,
)
from tests.cluster.hostile import CONTROL, HOSTILE, mutated_workflows
from tests.cluster.record_workflows import load_recorded

pytest.importorskip("kubernetes", reason="the `cluster` extra (kubernetes client) is missing")

BASE = "/apis/argoproj.io/v1alpha1/namespaces"
TEMPLATE = {"apiVersion": "argoproj.io/v1alpha1", "kind": "WorkflowTemplate",
            "metadata": {"name": "churn-model", "namespace": "ml", "resourceVersion": "7"},
            "spec": {"arguments": {"parameters": [{"name": "snapshot", "value": "2026-11-01"},
                                                  {"name": "max_depth", "value": "8"}]}}}




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


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_parameter_file_gives_parameters_and_p_wins_over_it(
        suffix: str, api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    api.routes[("GET", f"{BASE}/ml/workflowtemplates/churn-model")] = (200, TEMPLATE)
    api.routes[("POST", f"{BASE}/ml/workflows")] = (201, created)
    values = {"max_depth": 12, "snapshot": "2026-12-01"}
    params = tmp_path / f"params{suffix}"
    params.write_text(json.dumps(values) if suffix == ".json" else
                      "max_depth: 12\nsnapshot: '2026-12-01'\n")
    code, out, err = run(capsys, "submit", "--template", "churn-model", "-f", str(params),
                         "-p", "snapshot=2026-12-02",
                         "--kubeconfig", str(api.kubeconfig(tmp_path, "ml")))
    assert (code, err) == (0, ""), err
    (_, _, body), = [r for r in api.requests if r[0] == "POST"]
    assert body["spec"]["arguments"]["parameters"] == [
        {"name": "max_depth", "value": "12"}, {"name": "snapshot", "value": "2026-12-02"}]


@pytest.mark.parametrize(("text", "said"), [
    ("[1, 2]", "expected a mapping of parameter names to values, got a list"),
    ("lr: {a: 1}", "`lr` is a dict; parameters are strings, numbers or booleans"),
    ("lr: [", "is not valid YAML"),
])
def test_a_bad_parameter_file_is_a_usage_error_before_any_request(
        text: str, said: str, api: FakeApi, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    params = tmp_path / "params.yaml"
    params.write_text(text)
    code, _, err = run(capsys, "submit", "--template", "churn-model", "-f", str(params),
                       "--kubeconfig", str(api.kubeconfig(tmp_path, "ml")))
    assert code == 2 and said in err and not api.requests
    code, _, err = run(capsys, "submit", "--template", "churn-model", "-f",
                       str(tmp_path / "missing.yaml"))
    assert code == 2 and "No such file or directory" in err


def test_resume_from_passes_the_earlier_runs_lines_by_stage(
        api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The line Argo named from the earlier run's inputs, into the new run's
    `durapipe-resume-from` parameter (the runtime restores from it, commits to its own)."""
    earlier = load_recorded("spot-preemptions")
    template = copy.deepcopy(TEMPLATE)
    template["spec"]["arguments"]["parameters"].append(
        {"name": "durapipe-resume-from", "value": ""})
    api.routes[("GET", f"{BASE}/ml/workflows/spot-preemptions")] = (200, earlier)
    api.routes[("GET", f"{BASE}/ml/workflowtemplates/churn-model")] = (200, template)
    api.routes[("POST", f"{BASE}/ml/workflows")] = (201, created)
    kubeconfig = str(api.kubeconfig(tmp_path, "ml"))
    code, out, err = run(capsys, "submit", "--template", "churn-model", "--resume-from",
                         "spot-preemptions", "--kubeconfig", kubeconfig)
    assert code == 0, err
    line = ("s3://acme-ml/durapipe/spot-training/inputs/train/"
            "7153e1713ba6b7fa5f5d27e98902100e0208a392e535310137896914580cc1a6/checkpoints")
    assert err == f"durapipe submit: train restores from spot-preemptions's line {line}\n"
    (_, _, body), = [r for r in api.requests if r[0] == "POST"]
    assert body["spec"]["arguments"]["parameters"] == [
        {"name": "durapipe-resume-from", "value": json.dumps({"train": line})
         .replace(" ", "")}]
    # A run with nothing to resume from, and the parameter given twice, are refused.
    api.routes[("GET", f"{BASE}/ml/workflows/cache-hit")] = (200, load_recorded("cache-hit"))
    code, _, err = run(capsys, "submit", "--template", "churn-model", "--resume-from",
                       "cache-hit", "--kubeconfig", kubeconfig)
    assert code == 1 and "run cache-hit has no checkpoint line to resume from" in err
    code, _, err = run(capsys, "submit", "--template", "churn-model", "--resume-from",
                       "spot-preemptions", "-p", "durapipe-resume-from={}",
                       "--kubeconfig", kubeconfig)
    assert code == 1 and "do not give it as well" in err
    assert len([r for r in api.requests if r[0] == "POST"]) == 1


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
    assert "(it declares: snapshot, max_depth, durapipe-resume-from)" in err


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


# -- text from the cluster, on a terminal -----------------------------------------------------


def test_watch_escapes_what_the_cluster_sent_on_a_terminal_and_off_it() -> None:
    from durapipe.cluster import run_status
    from durapipe.cluster.submit import Display

    wf = load_recorded("spot-preemptions")
    wf["metadata"]["name"] += HOSTILE
    wf["status"]["progress"] += HOSTILE
    for tmpl in wf["spec"]["templates"]:
        for env in (tmpl.get("container") or {}).get("env") or ():
            if env["name"] == "DURAPIPE_GPU_TYPE":
                env["value"] += HOSTILE
    report = run_status.interpret(wf)
    for tty in (True, False):
        out = io.StringIO()
        display = Display(out, tty=tty)
        display.show(report)
        display.show(report)
        # The display's own redraw (up N lines, clear) is the one control sequence left.
        shown = re.sub(r"\x1b\[\d+F\x1b\[J", "", out.getvalue())
        assert not CONTROL.findall(shown), tty
        assert run_status.printable(HOSTILE) in shown


def test_status_prints_the_workloads_messages_escaped(api: FakeApi, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    wf = load_recorded("oom-ladder")
    for node in wf["status"]["nodes"].values():
        node["message"] = node.get("message", "") + HOSTILE
    api.routes[("GET", f"{BASE}/ml/workflows/oom-ladder")] = (200, wf)
    kubeconfig = str(api.kubeconfig(tmp_path, "ml"))
    code, out, _ = run(capsys, "status", "oom-ladder", "--kubeconfig", kubeconfig)
    assert code == 0 and not CONTROL.findall(out)
    assert "\\x1b]0;pwned\\x07" in out
    code, out, _ = run(capsys, "status", "oom-ladder", "--json", "--kubeconfig", kubeconfig)
    assert code == 0 and HOSTILE in json.loads(out)["stages"][0]["attempts"][0]["message"]


def test_the_servers_own_message_is_printed_escaped(api: FakeApi, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    api.routes[("GET", f"{BASE}/ml/workflows/x")] = (403, status_object(
        403, "Forbidden", f"denied{HOSTILE}"))
    code, out, err = run(capsys, "status", "x", "--kubeconfig", str(api.kubeconfig(tmp_path, "ml")))
    assert (code, out) == (1, "")
    assert err.endswith("\n") and not CONTROL.findall(err[:-1])
    assert "denied\\x1b]0;pwned" in err


# -- hostile or unexpected answers ------------------------------------------------------------


def one_line_error(code: int, out: str, err: str) -> str:
    """The error line of a command that failed as a cluster problem must: exit 1, nothing on
    stdout, one line on stderr, no traceback."""
    assert (code, out) == (1, ""), err
    assert err.startswith("durapipe: ") and err.count("\n") == 1, err
    assert "internal error" not in err and "Traceback" not in err
    return err


@pytest.mark.parametrize(("answer", "expected"), [
    ((200, Raw(b"<html>proxy login</html>")), "sent an answer durapipe cannot read"),
    ((200, Raw(b"\x00\x01", "application/octet-stream")),
     "no usable answer from the Kubernetes API server at URL while trying to get Workflow x: "
     "Unsupported content type: application/octet-stream"),
    ((200, Raw(b"<html>proxy login</html>", "text/html")),
     "answered `get Workflow x` with something that is not a Kubernetes object: <html>proxy "
     "login</html>"),
    ((200, Raw(b"[1, 2]")), "not a Kubernetes object: [1, 2]"),
    ((200, Raw(b"[" * 100_000 + b"]" * 100_000)), "cannot read while trying to get Workflow x "
                                                  "(RecursionError"),
    ((200, Raw(b"{}", "application/json; charset=klingon")), "(LookupError: unknown encoding"),
    ((200, Raw(b'{"a": "\xff\xfe"}')), "(UnicodeDecodeError"),
    ((500, [1]), "cannot get Workflow x: Internal Server Error (HTTP 500)"),
    ((200, {"status": {"nodes": []}}), "returned a Workflow x that durapipe cannot read: "
                                       "status.nodes: expected an object, got a list"),
])
def test_status_on_a_hostile_answer_is_one_line(answer: tuple[int, Any], expected: str,
                                                api: FakeApi, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    api.routes[("GET", f"{BASE}/ml/workflows/x")] = answer
    err = one_line_error(*run(capsys, "status", "x",
                              "--kubeconfig", str(api.kubeconfig(tmp_path, "ml"))))
    assert expected.replace("URL", api.url) in err


@pytest.mark.parametrize(("line", "expected"), [
    (b"this is not JSON", "sent a line that is not a JSON event"),
    (json.dumps({"object": {}}).encode(), "(KeyError: 'type')"),
    (json.dumps({"type": "MODIFIED"}).encode(), "(KeyError: 'object')"),
    (json.dumps({"type": "ERROR", "object": [410]}).encode(), "(TypeError: list indices"),
    (json.dumps({"type": "ERROR", "object": {"code": 500}}).encode(), "(KeyError: 'reason')"),
    (json.dumps({"type": "MODIFIED", "object": "a string"}).encode(),
     "sent a watch event that is not one"),
    (json.dumps({"type": "SURPRISE", "object": {}}).encode(), "type SURPRISE, object {}"),
    (json.dumps([1, 2]).encode(), "(TypeError: list indices"),
    (json.dumps({"type": "MODIFIED", "object": {"status": []}}).encode(),
     "returned a Workflow spot-preemptions that durapipe cannot read: status: expected an "
     "object, got a list"),
])
def test_watch_on_a_hostile_event_is_one_line(line: bytes, expected: str, api: FakeApi,
                                              tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    final = load_recorded("spot-preemptions")
    running = copy.deepcopy(final)
    running["status"]["phase"] = "Running"
    # After the hostile line, the run's end: a client that took the line for nothing ends too.
    watches = iter([[line]])
    api.routes[("GET", f"{BASE}/ml/workflows/spot-preemptions")] = (200, running)
    api.routes[("GET", f"{BASE}/ml/workflows?watch")] = (200, lambda _body: next(
        watches, [{"type": "MODIFIED", "object": final}]))
    code, out, err = run(capsys, "watch", "spot-preemptions",
                         "--kubeconfig", str(api.kubeconfig(tmp_path, "ml")))
    assert code == 1 and out.startswith("spot-preemptions-run0: Running")
    one_line_error(code, "", err)
    assert expected in err


@pytest.fixture(scope="module")
def shared_api() -> Iterator[tuple[FakeApi, str]]:
    with fake_api() as server, tempfile.TemporaryDirectory() as directory:
        yield server, str(server.kubeconfig(Path(directory), "ml"))


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(wf=mutated_workflows())
def test_status_of_a_mutated_workflow_is_a_report_or_one_line(
        shared_api: tuple[FakeApi, str], wf: Any) -> None:
    api, kubeconfig = shared_api
    api.routes[("GET", f"{BASE}/ml/workflows/x")] = (200, wf)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["status", "x", "--kubeconfig", kubeconfig])
    if code == 0:
        assert out.getvalue() and not err.getvalue()
    else:
        one_line_error(code, out.getvalue(), err.getvalue())


# -- bounded waits ----------------------------------------------------------------------------

#: Runs the command line with the client's bounds set from the arguments' first three (the
#: real ones are tens of seconds), and prints how long the command itself took.
BOUNDED_CLI = """
import sys, time
from durapipe.cluster import api as cluster
connect_s, read_s, deadline_s, *argv = sys.argv[1:]
cluster.CONNECT_TIMEOUT_S, cluster.READ_TIMEOUT_S = float(connect_s), float(read_s)
cluster.REQUEST_DEADLINE_S = float(deadline_s)
from durapipe.cli import main
started = time.monotonic()
code = main(argv)
print(f"{time.monotonic() - started:.2f}")
sys.exit(code)
"""


def bounded_status(url: str, tmp_path: Path, bounds: tuple[float, float, float]) -> tuple[
        float, str]:
    """(seconds ``durapipe status`` took, its stderr) against the server at ``url``."""
    kubeconfig = FakeApi(url=url).kubeconfig(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", BOUNDED_CLI, *map(str, bounds), "status", "x",
         "--kubeconfig", str(kubeconfig)],
        capture_output=True, text=True, timeout=120, env=os.environ)
    one_line_error(done.returncode, "", done.stderr)
    return float(done.stdout), done.stderr


def test_a_server_that_never_answers_is_given_up_after_the_read_timeout(tmp_path: Path) -> None:
    with raw_server(never_answers) as url:
        took, err = bounded_status(url, tmp_path, (5, 3, 60))
    assert err == (f"durapipe: the Kubernetes API server at {url} did not answer within 3 s "
                   "while trying to get Workflow x\n")
    # One try: the client's default would try three more times (12 s).
    assert 3 <= took < 9


ANSWER = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
          + b" " * 100)


@pytest.mark.parametrize("at_once", [0, ANSWER.index(b"\r\n\r\n") + 4],
                         ids=["dripping-headers", "dripping-body"])
def test_a_server_that_drips_is_given_up_at_the_deadline(tmp_path: Path, at_once: int) -> None:
    """A byte every 0.5 s never trips the 3 s read timeout; the 4 s deadline ends it."""
    with raw_server(drips(ANSWER, at_once)) as url:
        took, err = bounded_status(url, tmp_path, (5, 3, 4))
    assert err == (f"durapipe: no complete answer from the Kubernetes API server at {url} within "
                   "4 s while trying to get Workflow x (it answers too slowly, or only in part)\n")
    assert 4 <= took < 10


def test_a_server_that_accepts_no_connection_is_given_up_after_the_connect_timeout(
        tmp_path: Path) -> None:
    """A listener whose backlog is full drops new connections' SYNs: connect() hangs."""
    with socket.create_server(("127.0.0.1", 0), backlog=0) as listener:
        port = listener.getsockname()[1]
        fillers = []
        for _ in range(8):  # fill the accept queue (Linux takes backlog + 1, and then some)
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        time.sleep(0.5)
        try:
            took, err = bounded_status(f"http://127.0.0.1:{port}", tmp_path, (2, 30, 60))
        finally:
            for filler in fillers:
                filler.close()
    assert err == (f"durapipe: cannot reach the Kubernetes API server at http://127.0.0.1:{port} "
                   "while trying to get Workflow x: no connection within 2 s\n")
    assert 2 <= took < 8


@pytest.fixture
def quick_reconnects(monkeypatch: pytest.MonkeyPatch) -> None:
    from durapipe.cluster import api as cluster
    from durapipe.cluster import submit

    monkeypatch.setattr(submit, "RECONNECT_FIRST_S", 0.1)
    monkeypatch.setattr(submit, "WATCH_TIMEOUT_S", 1)
    monkeypatch.setattr(cluster, "WATCH_SILENCE_S", 1.0)


def test_watch_reconnects_after_a_lost_connection_and_says_so(
        api: FakeApi, tmp_path: Path, quick_reconnects: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A 503, then a watch that stays silent past its bound (2 s here), then the end."""
    final = load_recorded("spot-preemptions")
    running = copy.deepcopy(final)
    running["status"]["phase"] = "Running"
    released = threading.Event()

    def silent(_body: Any) -> list[Any]:
        released.wait(20)  # the old client waited for this; the test is bounded either way
        return []

    watches = iter([Reply(503, status_object(503, "ServiceUnavailable", "etcd is restarting")),
                    silent, [{"type": "MODIFIED", "object": final}]])

    def next_watch(body: Any) -> Any:
        answer = next(watches)
        return answer(body) if callable(answer) else answer

    api.routes[("GET", f"{BASE}/ml/workflows/spot-preemptions")] = (200, running)
    api.routes[("GET", f"{BASE}/ml/workflows?watch")] = (200, next_watch)
    started = time.monotonic()
    try:
        code, out, err = run(capsys, "watch", "spot-preemptions",
                             "--kubeconfig", str(api.kubeconfig(tmp_path, "ml")))
    finally:
        released.set()
    took = time.monotonic() - started
    assert code == 0, err
    assert "spot-preemptions-run0: Succeeded (3/6)" in out.splitlines()
    lost, silence, again = err.splitlines()
    assert lost == ("durapipe: lost the watch of Workflow spot-preemptions: cannot watch Workflow "
                    "spot-preemptions: etcd is restarting (HTTP 503); reconnecting in 0.1 s")
    assert silence == (f"durapipe: lost the watch of Workflow spot-preemptions: the Kubernetes API "
                       f"server at {api.url} did not answer within 2 s while trying to watch "
                       "Workflow spot-preemptions; reconnecting in 0.2 s")
    assert again == "durapipe: watching Workflow spot-preemptions again"
    assert 2.3 <= took < 12


def test_watch_gives_up_when_the_server_stays_away(api: FakeApi, tmp_path: Path,
                                                   quick_reconnects: None,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from durapipe.cluster import submit

    monkeypatch.setattr(submit, "RECONNECT_GIVE_UP_S", 1.5)
    running = load_recorded("spot-preemptions")
    running["status"]["phase"] = "Running"
    api.routes[("GET", f"{BASE}/ml/workflows/spot-preemptions")] = (200, running)
    api.routes[("GET", f"{BASE}/ml/workflows?watch")] = (503, status_object(
        503, "ServiceUnavailable", "down"))
    started = time.monotonic()
    code, _, err = run(capsys, "watch", "spot-preemptions",
                       "--kubeconfig", str(api.kubeconfig(tmp_path, "ml")))
    assert code == 1 and time.monotonic() - started < 5
    *tries, last = err.splitlines()
    assert [t.rsplit(" in ", 1)[1] for t in tries] == ["0.1 s", "0.2 s", "0.4 s"]
    assert re.fullmatch(r"durapipe: cannot watch Workflow spot-preemptions: down \(HTTP 503\) "
                        r"\(gave up reconnecting after \d s\)", last)


def test_read_caches_reads_a_missing_shard_as_empty_and_leaves_out_a_forbidden_one() -> None:
    from durapipe.cluster.api import ClusterError
    from durapipe.cluster.submit import read_caches

    class Caches:
        namespace = "ml"

        def config_map_data(self, name: str, namespace: str) -> dict[str, str]:
            if name.endswith("-0") and namespace == "argo":
                return {"k": "v"}
            if name.endswith("-1"):
                raise ClusterError("not allowed", status=403)
            raise ClusterError("not found", status=404)

    names = ["durapipe-cache-p-0", "durapipe-cache-p-1", "durapipe-cache-p-2"]
    assert read_caches(Caches(), names, "argo") == {  # type: ignore[arg-type]
        "durapipe-cache-p-0": {"k": "v"}, "durapipe-cache-p-2": {}}
