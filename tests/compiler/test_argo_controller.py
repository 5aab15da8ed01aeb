"""Compiled output run through Argo's real workflow controller (tools/argo-sim, Go).

The harness belongs to issue 4 (tests/argo/); these tests feed it *compiled* pipelines rather
than hand-written YAML, so the retry expression, the rung and fallback conditions and the join
are proven on Argo's own code.  The harness builds Argo v4.1.2 from ../shared and runs the
compiled YAML exactly as written, ``pendingTimeout`` included: a pod that stays Pending past its
wait is failed and deleted by the controller itself.  Skips without Go or ../shared (mandatory in
CI).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from durapipe.compiler import CompileOptions, compile_pipeline
from tests.compiler.models import (
    GI,
    Cluster,
    Gpu,
    GpuChoice,
    OnOom,
    Resources,
    Retry,
    fallback_gpu,
    pipeline,
    stage,
)

pytestmark = [pytest.mark.slow, pytest.mark.harness]


def run(p: Any, attempts: dict[str, list[dict[str, Any]]],
        edit: Callable[[str], str] | None = None, informer_lag: str = "") -> dict[str, Any]:
    """Compile ``p`` and run it in Argo's controller; ``edit`` may break the compiled YAML
    (as JSON text) first, to show that a test notices; ``informer_lag`` delays the
    controller's pod events (see ``run_scenario``)."""
    from tests.argo.argo_tools import run_scenario

    result = compile_pipeline(p, CompileOptions())
    assert result.ok
    (doc,) = result.documents
    doc["metadata"] = {"name": "sim"}
    if edit is not None:
        doc = json.loads(edit(json.dumps(doc)))
    report = run_scenario({"name": "compiled", "workflow": doc,
                           "runs": [{"attempts": attempts}], "expect": {}},
                          informer_lag=informer_lag)
    assert not report.get("error"), report.get("error")
    run_report: dict[str, Any] = report["runs"][0]
    return run_report


def pods(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(task, phase, memory limit) of every pod attempt, in the order the harness ran them."""
    return [(a["key"], a["phase"], a.get("pod", {}).get("memoryLimit", ""))
            for a in report["attempts"]]


def node(report: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [n for n in report["nodes"] if n["displayName"] == name]
    return found


LADDER = Retry(attempts=1, preemptions=1, on_oom=OnOom(memory=(GI, 2 * GI, 4 * GI)))


def test_oom_ladder_climbs_and_resumes_on_the_last_rung() -> None:
    report = run(pipeline(stage(retry=LADDER)), {
        "train-mem-1gi-app-0": [{"outcome": "oomkilled", "minutes": 5}],
        "train-mem-2gi-app-0": [{"outcome": "oomkilled", "minutes": 5}],
        "train-mem-4gi-app-0": [{"outcome": "succeeded", "minutes": 5}],
    })
    assert report["phase"] == "Succeeded"
    assert node(report, "train-mem-1gi-app-0(0)")["pod"]["memoryLimit"] == "1Gi"
    assert node(report, "train-mem-2gi-app-0(0)")["pod"]["memoryLimit"] == "2Gi"
    assert node(report, "train-mem-4gi-app-0(0)")["pod"]["env"]["DURAPIPE_RUNG"] == "2"
    assert node(report, "train-done")["phase"] == "Succeeded"


def test_a_non_oom_failure_does_not_climb_and_spends_exactly_the_application_budget() -> None:
    report = run(pipeline(stage(retry=LADDER)), {
        "train-mem-1gi-app-0": [{"outcome": "failed", "exitCode": 2, "minutes": 5}],
        "train-mem-1gi-app-1": [{"outcome": "failed", "exitCode": 2, "minutes": 5}],
    })
    assert report["phase"] == "Failed"
    # attempts = 1: one retry after the first application failure, at the same rung.
    assert [p[0] for p in pods(report)] == ["train-mem-1gi-app-0", "train-mem-1gi-app-1"]
    assert {p[2] for p in pods(report)} == {"1Gi"}
    assert node(report, "train-mem-2gi-app-0")["phase"] in ("Skipped", "Omitted")


def test_the_application_budget_carries_across_rungs() -> None:
    report = run(pipeline(stage(retry=LADDER)), {
        "train-mem-1gi-app-0": [{"outcome": "failed", "exitCode": 2, "minutes": 5}],
        "train-mem-1gi-app-1": [{"outcome": "oomkilled", "minutes": 5}],
        "train-mem-2gi-app-1": [{"outcome": "failed", "exitCode": 2, "minutes": 5}],
    })
    assert report["phase"] == "Failed"
    assert [p[0] for p in pods(report)] == [
        "train-mem-1gi-app-0", "train-mem-1gi-app-1", "train-mem-2gi-app-1"]
    assert node(report, "train-mem-2gi-app-1")["phase"] == "Failed"


def test_oom_at_every_rung_fails_with_the_exhausted_message() -> None:
    report = run(pipeline(stage(retry=LADDER)), {
        "train-mem-1gi-app-0": [{"outcome": "oomkilled", "minutes": 5}],
        "train-mem-2gi-app-0": [{"outcome": "oomkilled", "minutes": 5}],
        "train-mem-4gi-app-0": [{"outcome": "oomkilled", "minutes": 5}],
        # The harness cannot run the image; it plays the exhausted task's own exit.
        "train-oom-exhausted": [{"outcome": "failed", "exitCode": 1, "minutes": 1,
                                 "message": "durapipe: stage train ran out of memory"}],
    })
    assert report["phase"] == "Failed"
    assert node(report, "train-oom-exhausted")["phase"] == "Failed"
    assert node(report, "train-done")["phase"] == "Omitted"


#: Node labels and taints typical of each platform's spot and on-demand nodes (see the sources
#: in durapipe/dsl/catalog.py): GKE and AKS label only spot (and preemptible) nodes; EKS managed
#: node groups and Karpenter label both kinds; "generic" is a cluster labelled by hand.
NODES: dict[str, dict[str, tuple[dict[str, str], tuple[tuple[str, str, str], ...]]]] = {
    "gke": {
        "spot": ({"cloud.google.com/gke-spot": "true", "cloud.google.com/gke-nodepool": "spot"},
                 (("cloud.google.com/gke-spot", "true", "NoSchedule"),)),
        "preemptible": ({"cloud.google.com/gke-preemptible": "true"},
                        (("cloud.google.com/gke-preemptible", "true", "NoSchedule"),)),
        "on-demand": ({"cloud.google.com/gke-nodepool": "default-pool"}, ()),
    },
    "eks": {
        "spot": ({"eks.amazonaws.com/capacityType": "SPOT"}, ()),
        "on-demand": ({"eks.amazonaws.com/capacityType": "ON_DEMAND"}, ()),
    },
    "karpenter": {
        "spot": ({"karpenter.sh/capacity-type": "spot"}, ()),
        "on-demand": ({"karpenter.sh/capacity-type": "on-demand"}, ()),
        "reserved": ({"karpenter.sh/capacity-type": "reserved"}, ()),
    },
    "aks": {
        "spot": ({"kubernetes.azure.com/scalesetpriority": "spot"},
                 (("kubernetes.azure.com/scalesetpriority", "spot", "NoSchedule"),)),
        "on-demand": ({"kubernetes.azure.com/agentpool": "nodepool1"}, ()),
    },
    "generic": {
        "spot": ({"node.kubernetes.io/capacity-type": "spot"},
                 (("node.kubernetes.io/capacity-type", "spot", "NoSchedule"),)),
        "on-demand": ({}, ()),
    },
}


@pytest.mark.parametrize("profile", sorted(NODES))
@pytest.mark.parametrize("preemptions", [0, 2])
def test_last_attempt_lands_on_the_platforms_on_demand_nodes(profile: str,
                                                             preemptions: int) -> None:
    """The pods Argo really creates, placed by the scheduler's rules on typical nodes: spot
    attempts only on spot nodes, the last attempt only on on-demand ones (with no spot taint
    tolerated).  ``preemptions = 0`` is the last attempt as a task of its own."""
    from tests.compiler.node_match import schedulable

    s = stage(interruptible=True, last_attempt_on_demand=True,
              retry=Retry(attempts=1 if preemptions == 0 else 0, preemptions=preemptions))
    outcomes = [{"outcome": "deleted", "minutes": 5}] * preemptions
    task = "train-app-1" if preemptions == 0 else "train"
    attempts = ({"train-app-0": [{"outcome": "failed", "exitCode": 1, "minutes": 5,
                                  "message": "durapipe-verdict:app_failure"}],
                 task: [{"outcome": "succeeded", "minutes": 5}]} if preemptions == 0 else
                {task: [*outcomes, {"outcome": "succeeded", "minutes": 5}]})
    report = run(pipeline(s, cluster=Cluster(profile=profile)), attempts)
    assert report["phase"] == "Succeeded"
    placed = [[kind for kind, (labels, taints) in NODES[profile].items()
               if schedulable(a["pod"], labels, taints)] for a in report["attempts"]]
    *spot, last = placed
    assert all(kinds == ["spot"] for kinds in spot), placed
    assert "spot" not in last and "preemptible" not in last and "on-demand" in last, placed
    assert len(placed) == 2 if preemptions == 0 else preemptions + 1


def test_an_application_failure_without_budget_is_not_retried() -> None:
    report = run(pipeline(stage(retry=Retry(attempts=0, preemptions=3))), {
        "train": [{"outcome": "failed", "exitCode": 1, "minutes": 5,
                   "message": "durapipe-verdict:app_failure"}],
    })
    assert report["phase"] == "Failed"
    assert [p[0] for p in pods(report)] == ["train"] or len(pods(report)) == 1


H200_H100_A100 = Gpu(count=8, types=(GpuChoice(type="H200", count=8), GpuChoice(type="H100", count=8),
                                     GpuChoice(type="A100", count=16)), fallback_after=1800)
NEVER_SCHEDULED = {"outcome": "pending"}


def started(report: dict[str, Any], name: str) -> float:
    minute: float = node(report, name)["startedMinute"]
    return minute


def test_types_pending_past_their_wait_fall_back_to_the_next_with_its_own_count() -> None:
    p = pipeline(stage(resources=Resources(gpu=H200_H100_A100), retry=Retry(preemptions=0)))
    report = run(p, {"train-h200": [NEVER_SCHEDULED], "train-h100": [NEVER_SCHEDULED],
                     "train-a100": [{"outcome": "succeeded", "minutes": 5}]})
    assert report["phase"] == "Succeeded"
    for waited in ("train-h200", "train-h100"):
        assert node(report, waited)["phase"] == "Failed"
        # The controller itself deleted the pod that never left Pending (pendingTimeout).
        assert node(report, waited)["pod"]["deletedByController"] is True
        assert node(report, waited)["pod"]["finalPhase"] == "Pending"
    a100 = node(report, "train-a100")
    assert a100["pod"]["limits"]["nvidia.com/gpu"] == "16"
    assert a100["pod"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}
    # Each wait really passed: 30 minutes on H200, then 30 on H100, then A100 ran.
    assert 30 <= started(report, "train-h100") < 31
    assert 60 <= started(report, "train-a100") < 61
    assert 65 <= report["simMinutes"] < 67


def test_a_fallback_condition_on_the_wrong_node_phase_is_caught() -> None:
    # The scenarios can fail: make the fallback wait for an Errored probe, while an expired
    # pendingTimeout leaves it Failed, and the stage never reaches A100.
    p = pipeline(stage(resources=Resources(gpu=H200_H100_A100), retry=Retry(preemptions=0)))
    broken = "status == 'Failed' && (get(tasks['train-h200'], 'exitCode') ?? '') in ['', '-1']"
    assert broken in json.dumps(compile_pipeline(p, CompileOptions()).documents[0])

    def edit(text: str) -> str:
        return text.replace(broken, broken.replace("== 'Failed'", "== 'Error'"))

    report = run(p, {"train-h200": [NEVER_SCHEDULED],
                     "train-a100": [{"outcome": "succeeded", "minutes": 5}]}, edit)
    assert report["phase"] == "Failed"
    assert [a["key"] for a in report["attempts"]] == ["train-h200"]


def test_a_type_scheduled_inside_its_wait_does_not_fall_back() -> None:
    p = pipeline(stage(resources=Resources(gpu=H200_H100_A100), retry=Retry(preemptions=0)))
    report = run(p, {"train-h200": [{"outcome": "pending", "minutes": 20,
                                     "then": {"outcome": "succeeded", "minutes": 5}}]})
    assert report["phase"] == "Succeeded"
    assert node(report, "train-h200")["phase"] == "Succeeded"
    assert node(report, "train-h200")["pod"]["deleted"] is False
    assert [a["key"] for a in report["attempts"]] == ["train-h200"]
    assert node(report, "train-h100")["phase"] in ("Skipped", "Omitted")
    assert node(report, "train-a100")["phase"] in ("Skipped", "Omitted")


def test_a_failure_after_the_type_ran_does_not_fall_back() -> None:
    p = pipeline(stage(resources=Resources(gpu=fallback_gpu()), retry=Retry(preemptions=0)))
    report = run(p, {"train-h100": [{"outcome": "failed", "exitCode": 2, "minutes": 30}]})
    assert report["phase"] == "Failed"
    assert node(report, "train-a100-80gb")["phase"] == "Skipped"


def test_ladder_and_fallback_grid_moves_type_on_a_wait_and_rung_on_an_oom() -> None:
    gpu = Gpu(count=8, types=(GpuChoice(type="H100", count=8), GpuChoice(type="A100", count=8)),
              fallback_after=1800)
    p = pipeline(stage(resources=Resources(gpu=gpu),
                       retry=Retry(preemptions=1, on_oom=OnOom(memory=(GI, 2 * GI)))))
    report = run(p, {
        "train-h100-mem-1gi": [{"outcome": "oomkilled", "minutes": 5}],
        # The 2Gi rung on H100 never schedules: the grid moves to A100 at the same rung.
        "train-h100-mem-2gi": [NEVER_SCHEDULED],
        "train-a100-mem-2gi": [{"outcome": "succeeded", "minutes": 5}],
    })
    # The H100 rung-2 branch ended Failed; the join keeps it from failing the stage.
    assert report["phase"] == "Succeeded"
    assert node(report, "train-h100-mem-2gi")["pod"]["deletedByController"] is True
    assert node(report, "train-a100-mem-2gi(0)")["pod"]["memoryLimit"] == "2Gi"
    assert node(report, "train-a100-mem-1gi")["phase"] in ("Skipped", "Omitted")
    # OOM after 5 minutes, then a 30-minute wait for H100 at 2Gi, then A100.
    assert 35 <= started(report, "train-a100-mem-2gi") < 36


def test_a_waiting_type_preempted_after_it_ran_retries_on_the_same_type() -> None:
    p = pipeline(stage(resources=Resources(gpu=fallback_gpu()), retry=Retry(preemptions=2)))
    report = run(p, {
        "train-h100": [{"outcome": "disrupted", "message": "durapipe-verdict:preempted",
                        "minutes": 20}],
        "train-h100-retry": [{"outcome": "succeeded", "minutes": 5}],
    })
    assert report["phase"] == "Succeeded"
    assert node(report, "train-h100")["phase"] == "Failed"
    assert node(report, "train-a100-80gb")["phase"] == "Skipped"
    retried = node(report, "train-h100-retry(0)")
    assert retried["pod"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert retried["pod"]["env"]["DURAPIPE_ATTEMPT"] == "1"


def test_a_param_default_reaches_the_pod_as_written() -> None:
    """Argo's controller puts a default into the pod's args and env as it stands in
    ``arguments.parameters``; the kubelet then expands ``$(NAME)`` there.  The compiled default
    is escaped, so what the container sees, expanded, is the default as written (the old
    lowering wrote it as is: the program got ``pred``)."""
    from durapipe.dsl.model import Interp, Param, Ref
    from tests.test_special_text import kubelet_expand

    x = Ref(path=("params", "x"))
    p = pipeline(stage(args=(x, Interp(parts=("--x=", x))), env={"DEF_ENV": "d", "SHOWN": x}),
                 params=(Param(name="x", type="str", default="pre$(DEF_ENV)"),))
    report = run(p, {})
    assert report["phase"] == "Succeeded"
    pod = node(report, "train(0)")["pod"]
    (doc,) = compile_pipeline(p, CompileOptions()).documents
    (main,) = [t for t in doc["spec"]["templates"] if "container" in t]
    env: dict[str, str] = {}
    for item in main["container"]["env"]:  # the kubelet's order: each value sees those before
        if "value" in item:
            env[item["name"]] = kubelet_expand(pod["env"][item["name"]], env)
    assert [kubelet_expand(a, env) for a in pod["args"]] == ["pre$(DEF_ENV)", "--x=pre$(DEF_ENV)"]
    assert env["SHOWN"] == "pre$(DEF_ENV)"


def strip_artifacts(doc: dict[str, Any]) -> None:
    """The harness cannot complete pods that declare artifacts; hashes travel as parameters."""
    for t in doc["spec"]["templates"]:
        for io in ("inputs", "outputs"):
            if io in t:
                t[io].pop("artifacts", None)
        for task in t.get("dag", {}).get("tasks", []):
            if "arguments" in task:
                task["arguments"].pop("artifacts", None)


def test_memoized_stage_is_reused_unless_a_param_or_upstream_hash_changes() -> None:
    from durapipe.dsl.model import Cache, Param, Ref
    from tests.argo.argo_tools import run_scenario

    p = pipeline(
        stage("prep", outputs={"data": "/out/data"}),
        stage("train", command=("python", "train.py", "--lr", Ref(path=("params", "lr")),
                                Ref(path=("prep", "outputs", "data"))),
              outputs={"model": "/out/model"}, cache=Cache(max_age=86400)),
        params=(Param(name="lr", type="float", default=0.1),),
    )
    (doc,) = compile_pipeline(p, CompileOptions()).documents
    doc["metadata"] = {"name": "memo"}
    strip_artifacts(doc)

    def attempts(prep_hash: str, model: str) -> dict[str, Any]:
        return {"prep": [{"outcome": "succeeded", "outputs": {"data-hash": prep_hash}}],
                "train-pod": [{"outcome": "succeeded", "outputs": {"model-hash": model}}]}

    report = run_scenario({"name": "memo", "workflow": doc, "expect": {}, "runs": [
        {"attempts": attempts("aaaa", "m1")},
        {"attempts": attempts("aaaa", "SHOULD-NOT-RUN")},
        {"attempts": attempts("bbbb", "m3")},
        {"attempts": attempts("bbbb", "m4"), "parameters": {"lr": "0.2"}},
    ]})
    assert not report.get("error"), report.get("error")
    trains = [node(run_report, "train") for run_report in report["runs"]]
    assert [r["phase"] for r in report["runs"]] == ["Succeeded"] * 4
    assert [t["memoization"]["hit"] for t in trains] == [False, True, False, False]
    assert [t["outputs"]["model-hash"] for t in trains] == ["m1", "m1", "m3", "m4"]
    # Each entry lands in the ConfigMap of its key's first hex digit, as Argo evaluated both.
    assert [t["memoization"]["cacheName"] for t in trains] == [
        f"durapipe-cache-demo-{t['memoization']['key'][0]}" for t in trains]
    assert len({t["memoization"]["key"] for t in trains}) == 3
    # Each key's components, as Argo evaluated them, reach the node's outputs, and so the
    # memoization entry: the hit reads back the entry's record.
    import json

    from durapipe.compiler import memo

    records = [json.loads(t["outputs"][memo.COMPONENTS_PARAM]) for t in trains]
    assert [(r["stage"], r["params"], r["upstream"]) for r in records] == [
        ("train", {"lr": "0.1"}, {"prep.data": "aaaa"}),
        ("train", {"lr": "0.1"}, {"prep.data": "aaaa"}),
        ("train", {"lr": "0.1"}, {"prep.data": "bbbb"}),
        ("train", {"lr": "0.2"}, {"prep.data": "bbbb"})]
    assert records[0]["static"] in json.dumps(doc)  # the key's own static half
    assert memo.explain_miss(records[2], [("1", records[0])]) == \
        "upstream prep.data: 'aaaa' -> 'bbbb'"
    assert memo.explain_miss(records[3], [("1", records[0]), ("2", records[2])]) == \
        "param lr: '0.1' -> '0.2'"


def test_preemptions_and_application_failures_keep_separate_budgets() -> None:
    s = stage(interruptible=True, retry=Retry(attempts=1, preemptions=2))
    report = run(pipeline(s), {
        "train-app-0": [{"outcome": "deleted", "minutes": 5},
                        {"outcome": "shutdown", "minutes": 5},
                        {"outcome": "failed", "exitCode": 3, "minutes": 5,
                         "message": "durapipe-verdict:app_failure"}],
        "train-app-1": [{"outcome": "succeeded", "minutes": 5}],
    })
    # Two preemptions did not spend the one application retry (they spent the stage's
    # preemption budget: tests/compiler/test_argo_preemption_budget.py).
    assert report["phase"] == "Succeeded"
    assert [p[0] for p in pods(report)] == ["train-app-0"] * 3 + ["train-app-1"]
    attempts = [a["pod"]["env"]["DURAPIPE_ATTEMPT"] for a in report["attempts"]]
    assert attempts == ["0", "1", "2", "3"]


def test_application_failures_stop_at_the_budget_even_with_preemptions_left() -> None:
    s = stage(retry=Retry(attempts=1, preemptions=5))
    report = run(pipeline(s), {
        "train-app-0": [{"outcome": "failed", "exitCode": 1, "minutes": 5}],
        "train-app-1": [{"outcome": "failed", "exitCode": 1, "minutes": 5}],
    })
    assert report["phase"] == "Failed"
    assert len(pods(report)) == 2


def test_a_cache_hit_in_the_middle_of_the_dag_with_the_default_retry_budget_completes() -> None:
    """A single-pod stage (attempts = 0) with the default preemption budget: a cache hit on
    the middle stage must not leave the workflow Running (Argo's assessDAGPhase skips the
    children of a cache-hit Retry node)."""
    from durapipe.dsl.model import Cache, Ref
    from tests.argo.argo_tools import run_scenario

    p = pipeline(
        stage("prep", outputs={"data": "/out/data"}, cache=Cache()),
        stage("train", command=("python", "train.py", Ref(path=("prep", "outputs", "data"))),
              outputs={"model": "/out/model"}, cache=Cache()),
        stage("eval", command=("python", "eval.py", Ref(path=("train", "outputs", "model")))),
    )
    (doc,) = compile_pipeline(p, CompileOptions()).documents
    doc["metadata"] = {"name": "hit"}
    strip_artifacts(doc)
    first = {"prep-pod": [{"outcome": "succeeded", "outputs": {"data-hash": "d1"}}],
             "train-pod": [{"outcome": "succeeded", "outputs": {"model-hash": "m1"}}]}
    report = run_scenario({"name": "hit", "workflow": doc, "expect": {}, "runs": [
        {"attempts": first}, {"attempts": first}]})
    assert not report.get("error"), report.get("error")
    assert [r["phase"] for r in report["runs"]] == ["Succeeded", "Succeeded"]
    second = report["runs"][1]
    assert [node(second, n)["memoization"]["hit"] for n in ("prep", "train")] == [True, True]
    assert node(second, "train")["outputs"]["model-hash"] == "m1"
    assert node(second, "eval")["phase"] == "Succeeded"
    # Only eval ran again; the memoized stages' pods did not.
    assert [a["key"] for a in second["attempts"] if "pod" in a] == ["eval"]


BACKOFF_LADDER = Retry(attempts=1, preemptions=1, backoff=300,
                       on_oom=OnOom(memory=(GI, 2 * GI, 4 * GI)))


def test_an_oom_climb_starts_the_next_rung_at_once_and_an_application_retry_waits_once() -> None:
    """Argo applies a retryStrategy's backoff before it evaluates the retry expression, so a
    pod template with a backoff waits it before *every* failure that leaves the task too: an
    OOM climb, the last failure.  Only the application retry may wait, and exactly once."""
    report = run(pipeline(stage(retry=BACKOFF_LADDER)), {
        "train-mem-1gi-app-0": [{"outcome": "oomkilled", "minutes": 5}],
        "train-mem-2gi-app-0": [{"outcome": "failed", "exitCode": 2, "minutes": 5}],
        "train-mem-2gi-app-1": [{"outcome": "oomkilled", "minutes": 5}],
        "train-mem-4gi-app-1": [{"outcome": "failed", "exitCode": 2, "minutes": 5}],
    })
    assert report["phase"] == "Failed"
    assert [p[0] for p in pods(report)] == [
        "train-mem-1gi-app-0", "train-mem-2gi-app-0", "train-mem-2gi-app-1",
        "train-mem-4gi-app-1"]
    # The OOM at minute 5 starts the next rung with no gap (the clock ticks 30 s at most).
    assert 5 <= started(report, "train-mem-2gi-app-0") < 5.6
    # The application failure at minute 10 waits its 5-minute backoff, once (not 10).
    assert 15 <= started(report, "train-mem-2gi-app-1") < 15.6
    # The second OOM climbs at once, and the final failure ends the workflow at once.
    assert 20 <= started(report, "train-mem-4gi-app-1") < 20.6
    assert report["simMinutes"] < 25.6


def test_a_preemption_retry_does_not_delay_a_later_oom_climb() -> None:
    s = stage(interruptible=True, retry=BACKOFF_LADDER)
    report = run(pipeline(s), {
        "train-mem-1gi-app-0": [{"outcome": "deleted", "minutes": 5},
                                {"outcome": "oomkilled", "minutes": 5}],
        "train-mem-2gi-app-0": [{"outcome": "succeeded", "minutes": 5}],
    })
    assert report["phase"] == "Succeeded"
    assert 10 <= started(report, "train-mem-2gi-app-0") < 10.6
