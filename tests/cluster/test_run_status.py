"""`durapipe status`'s reading of a Workflow: on objects recorded from Argo v4.1.2's controller
(tests/cluster/record_workflows.py), never hand-written."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from durapipe.cluster import run_status
from durapipe.cluster.run_status import BudgetUse, MalformedWorkflow, interpret, verdict_of
from durapipe.compiler import memo
from durapipe.compiler.plan import cache_static
from durapipe.dsl import load_path
from durapipe.runtime import contract
from tests.cluster.hostile import CONTROL, HOSTILE, RECORDED_OBJECTS, mutated_workflows
from tests.cluster.record_workflows import cases, load_recorded, run_case

REPO = Path(__file__).resolve().parents[2]


def stage(report: run_status.RunReport, name: str) -> run_status.StageReport:
    (found,) = [s for s in report.stages if s.stage == name]
    return found


def test_the_oom_ladder_climbs_then_an_application_failure_retries_on_the_top_rung() -> None:
    report = interpret(load_recorded("oom-ladder"))
    assert report.phase == "Succeeded"
    s = stage(report, "build-features")
    assert [(a.memory, a.rung, a.attempt, a.verdict) for a in s.attempts] == [
        ("256Gi", 0, 0, "host_oom"), ("512Gi", 1, 1, "host_oom"),
        ("1Ti", 2, 2, "app_failure"), ("1Ti", 2, 3, "success")]
    assert s.oom == BudgetUse(2, 2) and s.rungs == 3
    assert s.failures == BudgetUse(1, 3)
    assert s.preemptions == BudgetUse(0, 3)
    assert (s.phase, s.rung, s.memory, s.cache_hit) == ("Succeeded", 2, "1Ti", False)
    # The runtime's verdict line, as Argo copied it from the termination message.
    assert s.attempts[2].reason == "exit code 1" and s.attempts[2].exit_code == "1"


def test_spot_reclaims_spend_the_preemption_budget_not_attempts() -> None:
    s = stage(interpret(load_recorded("spot-preemptions")), "train")
    assert [a.verdict for a in s.attempts] == ["preempted", "preempted", "app_failure",
                                               "success"]
    assert s.preemptions == BudgetUse(2, 10) and s.failures == BudgetUse(1, 3)
    # One count for the stage: the attempt after the application failure is the fourth.
    assert [a.attempt for a in s.attempts] == [0, 1, 2, 3]
    assert s.gpu_type == "A10G" and s.memory == "64Gi"
    assert s.attempts[1].reason == "SIGTERM"  # from the verdict line's JSON


def test_status_says_which_commit_of_which_line_the_stage_resumed_from() -> None:
    """The runtime's report of each restore reaches `status` through the pod's `resumed-from`
    output; the line it names is the one Argo computed from the run's inputs."""
    wf = load_recorded("spot-preemptions")
    s = stage(interpret(wf), "train")
    assert [a.resumed_from for a in s.attempts] == ["", "#3 (step 3)", "#5 (step 5)",
                                                    "#6 (step 6)"]
    line = s.checkpoint_line
    assert s.resumed_from == "#3 (step 3)"
    # What Argo made of the key expression the grid passes its pods is the runner's key.
    loaded = load_path(str(REPO / "examples" / "spot_training.pipe")).pipeline
    assert loaded is not None
    (train,) = loaded.stages
    params = {p["name"]: p["value"] for p in wf["spec"]["arguments"]["parameters"]
              if p["name"] in {"dataset", "epoch_seconds", "epochs", "lr"}}  # what train reads
    key = memo.runtime_key(cache_static(train), params, {})
    assert line == f"s3://acme-ml/durapipe/spot-training/inputs/train/{key}/checkpoints"
    assert {p["value"] for n in wf["status"]["nodes"].values()
            for p in (n.get("inputs") or {}).get("parameters") or ()
            if p["name"] == "checkpoint-key"} == {key}
    assert f"Resumed from checkpoints:\n  train: #3 (step 3) of {line}\n" in \
        run_status.render(interpret(wf))
    # A run whose stages restored nothing says nothing of it.
    assert "Resumed" not in run_status.render(interpret(load_recorded("gpu-fallback")))


def test_gpu_fallback_gives_way_after_each_pending_timeout() -> None:
    s = stage(interpret(load_recorded("gpu-fallback")), "finetune")
    assert [(a.gpu_type, a.verdict) for a in s.attempts] == [
        ("H100", "pending_timeout"), ("A100-80GB", "pending_timeout"), ("A100", "success")]
    assert s.attempts[0].reason == "no capacity within 30m"
    assert (s.phase, s.gpu_type) == ("Succeeded", "A100")


def test_a_resubmission_hits_the_cache_of_the_stages_that_succeeded() -> None:
    first = interpret(load_recorded("cache-hit", 0))
    assert first.phase == "Failed"
    assert [(s.stage, s.phase, s.cache_hit) for s in first.stages] == [
        ("prep", "Succeeded", False), ("train", "Succeeded", False), ("eval", "Failed", False)]
    assert stage(first, "eval").failures == BudgetUse(2, 2)
    second = interpret(load_recorded("cache-hit", 1))
    assert [(s.stage, s.phase, s.cache_hit, len(s.attempts)) for s in second.stages] == [
        ("prep", "Succeeded", True, 0), ("train", "Succeeded", True, 0),
        ("eval", "Succeeded", False, 1)]


def test_a_run_of_a_workflow_template_reads_its_stored_templates() -> None:
    """Submitted by workflowTemplateRef, the Workflow's spec holds no templates: they come from
    status.storedTemplates / storedWorkflowTemplateSpec, as the controller stores them."""
    wf = load_recorded("oom-ladder")
    templates = wf["spec"].pop("templates")
    wf["spec"]["workflowTemplateRef"] = {"name": "feature-build"}
    wf["status"]["storedTemplates"] = {f"namespaced/feature-build/{t['name']}": t
                                       for t in templates}
    for node in wf["status"]["nodes"].values():
        node["templateScope"] = "namespaced/feature-build"
    assert interpret(wf) == interpret(load_recorded("oom-ladder"))


def test_a_running_workflow_reads_as_far_as_it_got() -> None:
    wf = load_recorded("cache-hit", 0)
    nodes = wf["status"]["nodes"]
    for key in [k for k, n in nodes.items() if n["displayName"].startswith(("train", "eval"))]:
        del nodes[key]
    wf["status"]["phase"] = "Running"
    report = interpret(wf)
    assert not report.done
    assert [(s.stage, s.phase) for s in report.stages] == [
        ("prep", "Succeeded"), ("train", "Pending"), ("eval", "Pending")]


def test_rendering_names_every_failed_attempt() -> None:
    text = run_status.render(interpret(load_recorded("spot-preemptions")))
    assert text.splitlines()[0] == "default/spot-preemptions-run0: Succeeded (3/6)"
    assert "train-app-0(2) [attempt 2, 64Gi, A10G]: app_failure (exit 3): exit code 3" in text
    json.dumps(interpret(load_recorded("spot-preemptions")).to_json())


@pytest.mark.parametrize(("phase", "message", "code", "verdict"), [
    ("Failed", "main: OOMKilled (exit code 137)", "137", "host_oom"),
    ("Failed", "pod deleted", "", "preempted"),
    ("Failed", "main: Error (exit code 86)", "86", "gpu_oom"),
    ("Failed", "main: Error (exit code 2)", "2", "app_failure"),
    ("Error", "failed to create pod", "", "error"),
    ("Failed", 'x durapipe-verdict:gpu_oom {"reason":"CUDA out of memory"}', "86", "gpu_oom"),
    ("Running", "", "", "running"),
])
def test_verdicts_without_and_with_the_runtime_line(phase: str, message: str, code: str,
                                                    verdict: str) -> None:
    assert verdict_of(phase, message, code)[0] == verdict


@pytest.mark.slow
@pytest.mark.harness
@pytest.mark.parametrize("case", [c["name"] for c in cases()])
def test_the_recordings_are_what_the_controller_does_today(case: str) -> None:
    """Re-run each case in Argo's controller: the fresh objects read exactly as the recorded
    ones (times aside), so the recordings cannot drift from the lowering unnoticed."""
    from tests.argo.argo_tools import go_or_skip

    go_or_skip()
    (spec,) = [c for c in cases() if c["name"] == case]

    def timeless(report: run_status.RunReport) -> Any:
        out = report.to_json()
        out["started_at"] = out["finished_at"] = ""
        for s in out["stages"]:
            for a in s["attempts"]:
                a["started_at"] = a["finished_at"] = ""
        return out

    for i, fresh in enumerate(run_case(spec)):
        assert timeless(interpret(fresh)) == timeless(interpret(load_recorded(case, i)))


def test_an_exhausted_ladder_says_why_the_stage_ended() -> None:
    report = interpret(load_recorded("oom-exhausted"))
    s = stage(report, "build-features")
    # The exhausted marker's pod is no attempt; its message is the stage's.
    assert [a.verdict for a in s.attempts] == ["host_oom"] * 3
    assert (s.phase, s.oom, s.memory) == ("Failed", BudgetUse(3, 2), "1Ti")
    assert "ran out of memory at every size of its OOM ladder" in s.message
    assert "build-features: main: Error (exit code 1): durapipe: stage build-features ran out" \
        in run_status.render(report)


# -- text from the cluster, on a terminal -----------------------------------------------------


def test_printable_writes_each_control_character_as_its_escape() -> None:
    assert run_status.printable("a\x1b[2J\x07\n\r\t\x00\x7f\x9b\u202e b") == \
        "a\\x1b[2J\\x07\\n\\r\\t\\x00\\x7f\\x9b\\u202e b"
    # Ordinary text, other scripts and backslashes stay as they are.
    assert run_status.printable("é 東京 C:\\tmp 64Gi") == "é 東京 C:\\tmp 64Gi"


def _with_hostile_text(wf: dict[str, Any]) -> dict[str, Any]:
    """``wf`` with the workload's and the server's free text (termination messages, the run's
    name, message and progress, the GPU type) carrying ``HOSTILE``."""
    wf = copy.deepcopy(wf)
    wf["metadata"]["name"] += HOSTILE
    wf["metadata"]["namespace"] += HOSTILE
    wf["status"]["message"] = HOSTILE
    wf["status"]["progress"] += HOSTILE
    for node in wf["status"]["nodes"].values():
        node["message"] = node.get("message", "") + HOSTILE
        for param in (node.get("inputs") or {}).get("parameters") or ():
            if param["name"] == "gpu-type":
                param["value"] += HOSTILE
    for tmpl in wf["spec"]["templates"]:
        for env in (tmpl.get("container") or {}).get("env") or ():
            if env["name"] == contract.ENV_GPU_TYPE:
                env["value"] += HOSTILE
    return wf


def test_text_from_the_cluster_is_rendered_with_its_control_characters_escaped() -> None:
    clean = interpret(load_recorded("spot-preemptions"))
    report = interpret(_with_hostile_text(load_recorded("spot-preemptions")))
    text = run_status.render(report)
    assert not CONTROL.findall(text)
    # One line per line of the clean report: no row was added, none overwritten.
    assert len(text.splitlines()) == len(run_status.render(clean).splitlines())
    escaped = run_status.printable(HOSTILE)
    assert text.splitlines()[0].startswith(f"default{escaped}/spot-preemptions-run0{escaped}")
    assert f"A10G{escaped}" in text and text.count(escaped) > 5
    assert not CONTROL.findall("\n".join(run_status.table(report)))
    # JSON keeps the text exactly (json.dumps escapes it its own way).
    assert json.loads(json.dumps(report.to_json()))["message"] == HOSTILE


def test_every_text_of_the_object_is_escaped_wherever_it_shows() -> None:
    """Every string of the recorded object carries the sequence: whatever the rendering picks
    up of it, a name, a phase, a node, a reason, is printed escaped."""

    def spiked(value: Any) -> Any:
        if isinstance(value, str):
            return value + HOSTILE
        if isinstance(value, list):
            return [spiked(v) for v in value]
        if isinstance(value, dict):
            return {k: spiked(v) for k, v in value.items()}
        return value

    for wf in RECORDED_OBJECTS:
        report = interpret(spiked(wf))
        assert not CONTROL.findall(run_status.render(report)), wf["metadata"]["name"]


# -- hostile or unexpected objects ------------------------------------------------------------


@settings(max_examples=600, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutated_workflows())
def test_a_mutated_workflow_reads_or_is_refused_in_one_line(wf: Any) -> None:
    """``interpret`` raises nothing but ``MalformedWorkflow``; what it accepts renders."""
    try:
        report = interpret(wf)
    except MalformedWorkflow as exc:
        assert "\n" not in str(exc)
        return
    run_status.render(report)
    json.dumps(report.to_json())


@pytest.mark.parametrize(("where", "value", "message"), [
    (("status", "nodes"), [], "status.nodes: expected an object, got a list"),
    (("status",), "Running", "status: expected an object, got a string"),
    (("spec", "templates", 2, "container", "env"), {"a": 1},
     "spec.templates[2].container.env: expected a list, got an object"),
    (("spec", "templates", 1), None, "spec.templates[1]: expected an object, got null"),
    (("metadata", "name"), ["x"], "metadata.name: expected a plain value, got a list"),
])
def test_a_malformed_part_is_named(where: tuple[Any, ...], value: Any, message: str) -> None:
    wf = load_recorded("oom-ladder")
    parent = wf
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = value
    with pytest.raises(MalformedWorkflow) as raised:
        interpret(wf)
    assert str(raised.value) == message


@pytest.mark.parametrize("answer", [[], "<html>", 3, None])
def test_an_answer_that_is_no_object_is_refused(answer: object) -> None:
    with pytest.raises(MalformedWorkflow, match="^the Workflow: expected an object, got "):
        interpret(answer)


def test_a_node_key_is_named_escaped_and_shortened() -> None:
    wf = load_recorded("oom-ladder")
    wf["status"]["nodes"]["\x1b[2J" + "n" * 200] = "x"
    with pytest.raises(MalformedWorkflow) as raised:
        interpret(wf)
    assert str(raised.value).startswith("status.nodes['\\x1b[2Jnnn")
    assert "..." in str(raised.value) and len(str(raised.value)) < 160


def test_numbers_past_int_limits_read_as_text() -> None:
    """A retry index, an application budget or a resolved sum of 5,000 digits is no count:
    ``int()`` refuses such text and ``str()`` such a number, so neither may reach them."""
    wf = load_recorded("spot-preemptions")
    pods = [n for n in wf["status"]["nodes"].values() if n["type"] == "Pod"]
    pods[0]["displayName"] = "train-app-0(" + "9" * 5000 + ")"
    for param in pods[1]["inputs"]["parameters"]:
        param["value"] = "9" * 4299
    for tmpl in wf["spec"]["templates"]:
        for task in (tmpl.get("dag") or {}).get("tasks") or ():
            task["name"] += "-app-" + "9" * 5000
    report = interpret(wf)
    assert pods[0]["displayName"] in [a.node for a in report.stages[0].attempts]
    run_status.render(report)


def test_a_verdict_line_nested_past_the_parser_depth_is_text() -> None:
    message = f"{contract.VERDICT_TAG}app_failure " + "[" * 5000
    assert verdict_of("Failed", message, "1") == ("app_failure", "[" * 5000)


NEVER_PULL = ('ErrImageNeverPull: Container image "registry.example/acme/finetune:missing" is '
              'not present with pull policy of Never')


def _fallback_stuck_on_the_first_type() -> dict[str, Any]:
    """The gpu-fallback recording as it stood while its first type's pod sat on a node whose
    runtime cannot start it: Argo's node is Pending with the container's waiting reason."""
    wf = load_recorded("gpu-fallback")
    nodes = wf["status"]["nodes"]
    for key in [k for k, n in nodes.items() if n["type"] != "DAG"
                and not n["displayName"] == "finetune-h100"]:
        del nodes[key]
    (probe,) = [n for n in nodes.values() if n["displayName"] == "finetune-h100"]
    probe.update(phase="Pending", message=NEVER_PULL, hostNodeName="gpu-node-7")
    probe.pop("finishedAt", None)
    for node in nodes.values():
        if node["type"] == "DAG":
            node["phase"] = "Running"
    wf["status"]["phase"] = "Running"
    return wf


def test_a_pod_that_cannot_start_its_image_says_so_and_what_to_do() -> None:
    report = interpret(_fallback_stuck_on_the_first_type())
    (attempt,) = stage(report, "finetune").attempts
    assert (attempt.verdict, attempt.gpu_type, attempt.host_node) == (
        run_status.STUCK, "H100", "gpu-node-7")
    assert attempt.reason == run_status.STUCK_REASONS["ErrImageNeverPull"]
    text = run_status.render(report)
    assert ("  finetune finetune-h100 [attempt 0, H100, node gpu-node-7]: the image is not on "
            "the node, and its pull policy Never forbids a pull") in text
    assert f"    {NEVER_PULL}\n" in text
    assert "never fails it" in text and "Failed attempts" not in text


@pytest.mark.parametrize(("message", "cause"), [
    (NEVER_PULL, "ErrImageNeverPull"),
    ('ImagePullBackOff: Back-off pulling image "acme/x:1"', "ImagePullBackOff"),
    ("InvalidImageName: Failed to apply default image tag \"Acme/X\"", "InvalidImageName"),
    ('CreateContainerConfigError: secret "s3-creds" not found', "CreateContainerConfigError"),
    (f"Pod failed before main container starts due to {NEVER_PULL}", "ErrImageNeverPull"),
])
def test_waiting_reasons_that_waiting_does_not_mend(message: str, cause: str) -> None:
    assert run_status.stuck_reason(message) == run_status.STUCK_REASONS[cause]


@pytest.mark.parametrize("message", [
    "ContainerCreating", "PodInitializing", "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    "", "timeout", "Pod failed before main container starts due to ContainerCreating: x"])
def test_waits_that_end_by_themselves_are_not_called_stuck(message: str) -> None:
    assert run_status.stuck_reason(message) == ""


def test_a_pending_timeout_on_a_node_says_the_stage_stays_on_its_type() -> None:
    """A probe that reached a node and was still Pending at its wait (an image pulling, or one
    that never arrives) continues on its type: `status` must not call it a stockout."""
    wf = load_recorded("gpu-fallback")
    (probe,) = [n for n in wf["status"]["nodes"].values() if n["displayName"] == "finetune-h100"]
    probe["hostNodeName"] = "gpu-node-7"
    first = stage(interpret(wf), "finetune").attempts[0]
    assert first.verdict == run_status.PENDING_TIMEOUT
    assert first.reason == ("on node gpu-node-7 but not started within 30m; the stage stays on "
                            "this GPU type, one preemption spent")
    # As the compiled DAG counts it: the type's `-retry` task gets `preempted-before: "1"`.
    assert stage(interpret(wf), "finetune").preemptions.used == 1
    probe.pop("hostNodeName")
    assert stage(interpret(wf), "finetune").preemptions.used == 0  # a stockout spends none


def test_an_attempt_ended_before_its_image_started_keeps_the_cause() -> None:
    wf = _fallback_stuck_on_the_first_type()
    (probe,) = [n for n in wf["status"]["nodes"].values() if n["displayName"] == "finetune-h100"]
    probe.update(phase="Error", message=f"Pod failed before main container starts due to "
                 f"{NEVER_PULL}", finishedAt=probe["startedAt"])
    (attempt,) = stage(interpret(wf), "finetune").attempts
    assert attempt.verdict == run_status.ERROR
    assert attempt.reason.endswith(f"({run_status.STUCK_REASONS['ErrImageNeverPull']})")


def _multinode_run(jobset_status: dict[str, Any] | None,
                   phase: str = "Succeeded") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """examples/multinode_pretrain.pipe's compiled Workflow as the controller leaves it after
    its resource node ended, and the JobSet that node created (owned by the Workflow)."""
    from durapipe.compiler import compile_pipeline

    loaded = load_path(str(REPO / "examples" / "multinode_pretrain.pipe")).pipeline
    (wf,) = [d for d in compile_pipeline(loaded).documents if d["kind"] == "Workflow"]
    wf = copy.deepcopy(wf)
    wf["metadata"].update(name="pretrain-7b-x1", uid="wf-uid-1")
    js_name = "pretrain-7b-x1-pretrain-abcde"
    wf["status"] = {"phase": phase, "startedAt": "2026-12-03T10:00:00Z", "nodes": {
        "pretrain-7b-x1": {"id": "pretrain-7b-x1", "name": "pretrain-7b-x1", "type": "DAG",
                           "displayName": "pretrain-7b-x1", "templateName": "main",
                           "phase": phase, "startedAt": "2026-12-03T10:00:00Z"},
        "pretrain-7b-x1-1": {
            "id": "pretrain-7b-x1-1", "name": "pretrain-7b-x1.pretrain", "type": "Pod",
            "displayName": "pretrain", "templateName": "pretrain", "phase": phase,
            "startedAt": "2026-12-03T10:00:01Z",
            "outputs": {"parameters": [{"name": "jobset-name", "value": js_name}]}}}}
    jobsets = [{"metadata": {
        "name": js_name, "creationTimestamp": "2026-12-03T10:00:02Z",
        "labels": {"durapipe.dev/stage": "pretrain"},
        "ownerReferences": [{"kind": "Workflow", "name": "pretrain-7b-x1", "uid": "wf-uid-1"}]},
        "status": jobset_status}] if jobset_status is not None else []
    return wf, jobsets


def test_a_multinode_stage_counts_its_jobset_restarts_and_shows_its_pods_hardware() -> None:
    wf, jobsets = _multinode_run({"restarts": 3, "restartsCountTowardsMax": 1,
                                  "terminalState": "Completed"})
    # Another run's JobSet of the same stage is not this run's.
    jobsets.append({"metadata": {"name": "other", "labels": {"durapipe.dev/stage": "pretrain"},
                                 "ownerReferences": [{"uid": "wf-uid-2"}]},
                    "status": {"restarts": 9}})
    report = interpret(wf, jobsets)
    s = stage(report, "pretrain")
    assert (s.multinode, s.restarts, s.restarts_counted, s.max_restarts) == (True, 3, 1, 2)
    assert s.preemptions == BudgetUse(2, None) and s.failures == BudgetUse(1, 3)
    assert (s.memory, s.gpu_type) == ("1Ti", "H100")
    (row,) = [r.split() for r in run_status.table(report) if r.startswith("pretrain ")]
    assert row == ["pretrain", "Succeeded", "4", "2", "1/3", "0", "1Ti", "H100", "-"]
    assert ("  pretrain: pretrain-7b-x1-pretrain-abcde: 3 restart(s), 1 counted of maxRestarts "
            "2, 2 not counted") in run_status.render(report)


def test_a_failed_jobset_spends_its_last_try_and_an_unread_one_says_so() -> None:
    wf, jobsets = _multinode_run({"restarts": 2, "restartsCountTowardsMax": 2,
                                  "terminalState": "Failed"}, phase="Failed")
    assert stage(interpret(wf, jobsets), "pretrain").failures == BudgetUse(3, 3)
    unread = interpret(wf)  # no JobSet could be listed (RBAC, or its CRD is absent)
    s = stage(unread, "pretrain")
    assert (s.restarts, s.gpu_type, s.memory) == (0, "H100", "1Ti")
    assert "  pretrain: (not found): restarts not known" in run_status.render(unread)


@pytest.mark.parametrize("manifest", [
    "a: &x [1]\nb: [*x, *x]\nkind: JobSet\n",  # aliases: refused, not expanded
    "kind: JobSet\nspec: [1, 2]\n", "kind: [JobSet]\n", "{{{", "x" * 300_000, 7])
def test_a_hostile_jobset_manifest_reads_as_no_multinode_stage(manifest: object) -> None:
    wf, _ = _multinode_run(None)
    (tmpl,) = [t for t in wf["spec"]["templates"] if "resource" in t]
    tmpl["resource"]["manifest"] = manifest
    s = stage(interpret(wf), "pretrain")
    assert not s.multinode or s.max_restarts is None


@pytest.mark.parametrize("status", [
    {"restarts": "3"}, {"restarts": -1}, {"restarts": 10**30}, {"restarts": True}, [], "x"])
def test_hostile_jobset_counts_read_as_unknown(status: object) -> None:
    wf, jobsets = _multinode_run({"restarts": 0})
    jobsets[0]["status"] = status
    s = stage(interpret(wf, jobsets), "pretrain")
    assert s.restarts == 0 and s.restarts_counted == 0
    run_status.render(interpret(wf, jobsets))


#: The shards of the recorded pipeline's cache (naming.cache_configmap).
PREP_SHARDS = {f"durapipe-cache-churn-model-{d}" for d in "0123456789abcdef"}


def _missed_run(record: dict[str, Any]) -> dict[str, Any]:
    """The cache-hit recording's first run, its train node a miss that recorded ``record``."""
    wf = load_recorded("cache-hit", 0)
    (own,) = [n for n in wf["status"]["nodes"].values()
              if n["displayName"] == "train" and n["type"] != "Pod"]
    own["memoizationStatus"] = {"hit": False, "key": "k-now", "cacheName": "durapipe-cache-x"}
    own.setdefault("inputs", {}).setdefault("parameters", []).append(
        {"name": memo.COMPONENTS_PARAM, "value": json.dumps(record)})
    return wf


def _entry(record: dict[str, Any], created: str) -> str:
    return json.dumps({"nodeID": "old-run-123", "creationTimestamp": created, "outputs": {
        "parameters": [{"name": "model-hash", "value": "m"},
                       {"name": memo.COMPONENTS_PARAM, "value": json.dumps(record)}]}})


RECORD = {"stage": "train", "static": "s" * 64, "image": "acme/train:1", "command": "sha256:1",
          "env": "sha256:2", "version": "", "schema": "1", "params": {"max_depth": "9"},
          "upstream": {"prep.data": "a" * 64}}


def test_status_names_what_changed_against_the_newest_entry_of_the_stage() -> None:
    wf = _missed_run(RECORD)
    # train's cache, and every shard of prep's (prep missed too, on its first run).
    assert run_status.reads_for(wf).caches == {"durapipe-cache-x"} | PREP_SHARDS
    older = {**RECORD, "params": {"max_depth": "7"}, "image": "acme/train:0"}
    newer = {**RECORD, "params": {"max_depth": "8"}, "upstream": {"prep.data": "b" * 64}}
    caches = {"durapipe-cache-x": {
        "k1": _entry(older, "2026-12-01T10:00:00Z"), "k2": _entry(newer, "2026-12-02T10:00:00Z"),
        "k3": _entry({**RECORD, "stage": "prep"}, "2026-12-03T10:00:00Z"),  # another stage's
        "k-now": _entry(RECORD, "2026-12-03T11:00:00Z"),  # this run's own, once it succeeded
        "k4": "not json", "k5": json.dumps([1]), "k6": _entry({"stage": "train"}, "0")}}
    report = interpret(wf, caches=caches)
    assert stage(report, "train").cache_miss == (
        f"param max_depth: '8' -> '9'; upstream prep.data: {'b' * 12}… -> {'a' * 12}…")
    rendered = run_status.render(report)
    misses = rendered.split("Cache misses (what changed against the newest entry of the stage):\n")
    assert "  train: param max_depth: '8' -> '9'" in misses[1].split("\n\n")[0]
    # A stage whose cache was not read says so, one with no earlier entry says that, and
    # without the caches read at all nothing is said.
    assert stage(report, "prep").cache_miss == "its cache could not be read"
    assert stage(interpret(wf, caches={**caches, **{n: {} for n in PREP_SHARDS}}),
                 "prep").cache_miss == "no earlier cache entry for this stage"
    assert stage(interpret(wf, caches={}), "train").cache_miss == "its cache could not be read"
    assert stage(interpret(wf), "train").cache_miss == ""


def test_status_reads_every_shard_of_the_cache_for_the_stages_earlier_entries() -> None:
    # The miss's own key starts with "a"; the stage's earlier entry has another key, so it lies
    # in another of the pipeline's 16 ConfigMaps (naming.cache_configmap).
    wf = _missed_run(RECORD)
    (own,) = [n for n in wf["status"]["nodes"].values()
              if n["displayName"] == "train" and n["type"] != "Pod"]
    own["memoizationStatus"] = {"hit": False, "key": "a" * 64, "cacheName": "durapipe-cache-x-a"}
    shards = [f"durapipe-cache-x-{d}" for d in "0123456789abcdef"]
    assert run_status.reads_for(wf).caches == set(shards) | PREP_SHARDS
    earlier = {**RECORD, "params": {"max_depth": "8"}}
    caches: dict[str, object] = {name: {} for name in shards}
    caches["durapipe-cache-x-3"] = {"3" * 64: _entry(earlier, "2026-12-02T10:00:00Z")}
    assert stage(interpret(wf, caches=caches), "train").cache_miss == "param max_depth: '8' -> '9'"
    # One shard that could not be read (RBAC) leaves the answer unknown, not wrong.
    del caches["durapipe-cache-x-7"]
    assert stage(interpret(wf, caches=caches), "train").cache_miss == \
        "its cache could not be read"


def test_explain_miss_says_when_nothing_changed_or_nothing_came_before() -> None:
    assert memo.explain_miss(RECORD, []) == "no earlier cache entry for this stage"
    assert memo.explain_miss(RECORD, [("1", RECORD)]).startswith("an entry with these inputs")
    moved = {**RECORD, "image": "acme/train:2", "command": "sha256:9", "version": "3"}
    assert memo.explain_miss(moved, [("1", RECORD)]) == (
        "image: 'acme/train:1' -> 'acme/train:2'; command changed; cache version: '' -> '3'")
    assert memo.explain_miss({"stage": "train"}, [("1", RECORD)]) == ""  # not a record


PULL_BACKOFF = ('ImagePullBackOff: Back-off pulling image '
                '"registry.example/acme/finetune:missing"')


def _pod_waiting_in_init(node: dict[str, Any]) -> dict[str, Any]:
    """The pod of ``node`` as the kubelet reports it when the stage's image cannot be pulled:
    Argo's init container done, durapipe's preflight (in the stage's image) waiting, the main
    containers waiting behind it as PodInitializing (all that Argo's message reads)."""
    reason, _, message = PULL_BACKOFF.partition(": ")
    return {"metadata": {"name": f"{node['id']}-pod", "annotations": {
        run_status.ANNOTATION_NODE_ID: node["id"]}},
        "status": {"phase": "Pending",
                   "initContainerStatuses": [
                       {"name": "init", "state": {"terminated": {"exitCode": 0}}},
                       {"name": "durapipe-preflight",
                        "state": {"waiting": {"reason": reason, "message": message}}}],
                   "containerStatuses": [
                       {"name": name, "state": {"waiting": {"reason": "PodInitializing"}}}
                       for name in ("wait", "main")]}}


def test_an_image_missing_for_the_preflight_init_container_is_read_from_the_pod() -> None:
    """What the real node showed (tests/realnode/test_missing_image.py): Argo's node says
    only `PodInitializing`, since its pending message reads the main containers; the pod's
    init container has the kubelet's reason."""
    wf = _fallback_stuck_on_the_first_type()
    (probe,) = [n for n in wf["status"]["nodes"].values() if n["displayName"] == "finetune-h100"]
    probe["message"] = "PodInitializing"
    assert run_status.reads_for(wf).pods
    (alone,) = stage(interpret(wf), "finetune").attempts
    assert alone.verdict != run_status.STUCK  # Argo's word alone: a wait like any other
    pod = _pod_waiting_in_init(probe)
    other = copy.deepcopy(pod)  # another attempt's pod, which says nothing of this one
    other["metadata"] = {"name": "x", "annotations": {run_status.ANNOTATION_NODE_ID: "y"}}
    (attempt,) = stage(interpret(wf, pods=[other, pod]), "finetune").attempts
    assert (attempt.verdict, attempt.reason, attempt.message) == (
        run_status.STUCK, run_status.STUCK_REASONS["ImagePullBackOff"], PULL_BACKOFF)
    assert f"    {PULL_BACKOFF}\n" in run_status.render(interpret(wf, pods=[pod]))
    # Ended at its deadline without starting: the error keeps the cause.
    probe.update(phase="Failed", message="Pod was active on the node longer than the "
                 "specified deadline", finishedAt=probe["startedAt"])
    (ended,) = stage(interpret(wf, pods=[pod]), "finetune").attempts
    assert ended.reason.endswith(f"({run_status.STUCK_REASONS['ImagePullBackOff']})")


def test_pods_are_read_only_for_attempts_on_a_node_that_argo_does_not_explain() -> None:
    wf = _fallback_stuck_on_the_first_type()
    assert not run_status.reads_for(wf).pods  # the message names the cause already
    (probe,) = [n for n in wf["status"]["nodes"].values() if n["displayName"] == "finetune-h100"]
    probe.update(message="PodInitializing")
    del probe["hostNodeName"]  # unscheduled: the scheduler's message is the whole story
    assert not run_status.reads_for(wf).pods
    # Attempts that ran and failed (an exit code) or succeeded: Argo's message says it all.
    assert not any(run_status.reads_for(load_recorded(r)).pods for r in (
        "cache-hit", "spot-preemptions", "oom-ladder", "gpu-fallback"))


@pytest.mark.parametrize("pod", [
    None, 7, {"status": []}, {"status": {"initContainerStatuses": [{"state": {"waiting": 3}}]}},
    {"status": {"containerStatuses": [{"state": {"waiting": {"reason": ["ErrImagePull"]}}}]}},
    {"status": {"containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}]}}])
def test_a_pod_that_says_nothing_stuck_gives_no_waiting_message(pod: object) -> None:
    assert run_status.pod_waiting_message(pod) == ""


def test_a_long_kubelet_message_is_cut() -> None:
    pod = {"status": {"containerStatuses": [{"state": {"waiting": {
        "reason": "ErrImagePull", "message": "x" * 5000}}}]}}
    assert run_status.pod_waiting_message(pod).startswith("ErrImagePull: xxx")
    assert len(run_status.pod_waiting_message(pod)) == 1000


def test_the_jobset_selector_comes_from_the_manifest_not_the_workflows_labels() -> None:
    """A Workflow that `durapipe submit --template` made carries only Argo's
    workflow-template label (the real node's multi-node case read no JobSet because of it)."""
    wf, _ = _multinode_run(None)
    wf["metadata"]["labels"] = {"workflows.argoproj.io/workflow-template": "pretrain-7b"}
    assert run_status.reads_for(wf).jobset_selector == "durapipe.dev/pipeline=pretrain-7b"
    assert run_status.reads_for(load_recorded("cache-hit")).jobset_selector == ""


def test_pod_names_are_argos() -> None:
    """Argo v4's own test vectors (workflow/util/pod_name_v2_test.go), the hash computed once
    with Go's hash/fnv: FNV-1a of "nodename" is 1454367246."""
    assert run_status.pod_name("wfname", {"name": "nodename", "templateName": "templatename"}) \
        == "wfname-templatename-1454367246"
    assert run_status.pod_name("wfname", {"name": "nodename"}) == "wfname-1454367246"
    long_wf, long_tmpl = "w" * 150, "t" * 150
    name = run_status.pod_name(long_wf, {"name": "nodename", "templateName": long_tmpl})
    assert name == f"{(long_wf + '-' + long_tmpl)[:242]}-1454367246"


def test_an_attempt_kueue_stopped_says_preempted_by_kueue() -> None:
    """Kueue stops a preempted pod by deleting it (Argo says only "pod deleted") and records a
    `Stopped` Event on the pod: status reads that Event for each deleted attempt's pod."""
    wf = copy.deepcopy(load_recorded("spot-preemptions"))
    first = min((n for n in wf["status"]["nodes"].values() if n.get("type") == "Pod"),
                key=lambda n: n["startedAt"])
    first.update(phase="Error", message=run_status.POD_DELETED)
    pod = run_status.pod_name(wf["metadata"]["name"], first)
    assert run_status.reads_for(wf).deleted_pods == {pod}
    words = ("Preempted to accommodate a workload (UID: 1c3e) due to prioritization in the "
             "ClusterQueue")
    found = stage(interpret(wf, stopped={pod: words}), "train")
    assert found.attempts[0].verdict == "preempted"
    assert found.attempts[0].reason == f"preempted by Kueue: {words}"
    # Without Kueue's Event it is what Argo says.
    assert "Kueue" not in stage(interpret(wf), "train").attempts[0].reason
    assert run_status.reads_for(load_recorded("spot-preemptions")).deleted_pods == frozenset()
