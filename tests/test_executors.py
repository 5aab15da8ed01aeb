"""One plan, two executors: each rule the compiled workflow and `durapipe run` both apply,
checked by running the same plan both ways.

The Argo side reads the compiled objects (and, for attempt numbering, runs them on Argo's
controller); the local side steps the retry machine with the verdicts, as its engine does
after each attempt, or runs the stage for real.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from durapipe.compiler import CompileOptions, argo_retry, compile_pipeline, memo, naming
from durapipe.compiler.plan import StagePlan, cache_static, plan_pipeline
from durapipe.dsl import load_path, units
from durapipe.dsl.model import Cache, Distributed, OnOom, Pipeline, Retry
from durapipe.plan import machine
from durapipe.runner.engine import Runner, RunOptions
from durapipe.runtime import contract
from tests.compiler.models import GI, Ref, pipeline, stage

Json = dict[str, Any]
LADDER = Retry(attempts=1, preemptions=5, on_oom=OnOom(memory=(GI, 2 * GI, 4 * GI)))


def templates(p: Pipeline) -> dict[str, Json]:
    result = compile_pipeline(p, CompileOptions())
    assert result.ok, [d.message for d in result.diagnostics]
    (doc,) = result.documents
    return {t["name"]: t for t in doc["spec"]["templates"]}


def run_by(ts: dict[str, Json], task: str) -> tuple[Json, dict[str, str]]:
    """The template a task of the ``train`` stage DAG runs, and the parameters it passes."""
    (call,) = [t for t in ts["train"]["dag"]["tasks"] if t["name"] == task]
    params = {p["name"]: p["value"] for p in call.get("arguments", {}).get("parameters", [])}
    return ts[call["template"]], params


def resolve(text: str, params: dict[str, str]) -> str:
    """``{{inputs.parameters.X}}`` tags replaced with what the task passes, as Argo does."""
    for name, value in params.items():
        text = text.replace("{{inputs.parameters." + name + "}}", value)
    return text


def the_plan(p: Pipeline) -> StagePlan:
    (plan,) = plan_pipeline(p, checkpoint_grace_seconds=300).stages
    return plan


def local_replay(plan: StagePlan, verdicts: list[str]) -> list[tuple[int, int | None, float]]:
    """(DURAPIPE_ATTEMPT, memory, wait before it) of each attempt `durapipe run` makes."""
    run, state = machine.begin(plan.rules)
    out: list[tuple[int, int | None, float]] = []
    for verdict in verdicts:
        out.append((run.attempt, Runner._variant(plan, run).memory, run.backoff))
        action, state = machine.step(state, verdict)
        if not isinstance(action, machine.Run):
            break
        run = action
    return out


def test_backoff_is_capped_by_default_and_spaces_application_retries_both_ways() -> None:
    p = pipeline(stage(retry=Retry(attempts=12, backoff=30)))
    ts = templates(p)
    # Argo: a wait task before each application retry, none inside a task (a leaf's backoff
    # would also delay every failure that leaves the task).
    assert "backoff" not in run_by(ts, "train-app-0")[0].get("retryStrategy", {})
    assert ts["durapipe-wait"]["suspend"] == {"duration": "{{inputs.parameters.duration}}"}
    dag = {t["name"]: t for t in ts["train"]["dag"]["tasks"]}
    assert {dag[f"train-app-{k}-backoff"]["template"] for k in range(12)} == {"durapipe-wait"}
    argo = [units.parse_seconds(dag[f"train-app-{k}-backoff"]["arguments"]["parameters"][0][
        "value"]) for k in range(12)]
    assert [dag[f"train-app-{k}"]["depends"] for k in (1, 12)] == [
        "train-app-0-backoff.Succeeded", "train-app-11-backoff.Succeeded"]
    local = [wait for _, _, wait in local_replay(
        the_plan(p), [contract.VERDICT_APP_FAILURE] * 12 + [contract.VERDICT_SUCCESS])]
    assert local[1:] == argo == [min(30.0 * 2 ** n, 600.0) for n in range(12)]
    # A preemption retry and an OOM climb wait nothing, in `durapipe run` too.
    spot = the_plan(pipeline(stage(interruptible=True, retry=Retry(preemptions=3, backoff=30))))
    assert [w for _, _, w in local_replay(spot, [contract.VERDICT_PREEMPTED] * 3 + [
        contract.VERDICT_SUCCESS])] == [0.0] * 4


def test_gpu_oom_fails_by_default_both_ways_and_in_the_runtime() -> None:
    p = pipeline(stage(retry=Retry(attempts=2)))
    plan = the_plan(p)
    assert Retry().gpu_oom == contract.DEFAULT_GPU_OOM_POLICY == "fail"
    leaf, _ = run_by(templates(p), "train-app-0")
    env = {e["name"]: e.get("value") for e in leaf["container"]["env"]}
    assert env[contract.ENV_GPU_OOM_POLICY] == "fail"
    # Argo: exit 86 does not start the next application attempt.
    assert f"'{contract.EXIT_GPU_OOM}'" in argo_retry.app_failure_condition(
        "t", plan.budgets.gpu_oom, has_ladder=False)
    _, first = machine.begin(plan.rules)
    assert isinstance(machine.step(first, contract.VERDICT_GPU_OOM)[0], machine.Fail)


def test_memory_rungs_and_attempt_numbers_agree_on_paper() -> None:
    p = pipeline(stage(retry=LADDER))
    ts = templates(p)
    verdicts = [contract.VERDICT_PREEMPTED, contract.VERDICT_HOST_OOM,
                contract.VERDICT_APP_FAILURE, contract.VERDICT_HOST_OOM, contract.VERDICT_SUCCESS]
    local = local_replay(the_plan(p), verdicts)
    # The tasks Argo runs for that history, what their pods get, and the preemptions spent
    # before each task (the one in the first task, passed on from task to task).
    path = [("train-mem-1gi-app-0", 0, 0), ("train-mem-1gi-app-0", 1, 0),
            ("train-mem-2gi-app-0", 0, 1), ("train-mem-2gi-app-1", 0, 1),
            ("train-mem-4gi-app-1", 0, 1)]
    for (task, retries, before), (number, memory, _) in zip(path, local):
        template, params = run_by(ts, task)
        container = template["container"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env[contract.ENV_ATTEMPT] == (
            "{{=asInt(inputs.parameters.attempt) + asInt(inputs.parameters['preempted-before'])"
            " + asInt(retries)}}")
        assert int(params["attempt"]) + before + retries == number, task
        # One pod template for every rung: its podSpecPatch sets the task's memory.
        (patched,) = json.loads(resolve(template["podSpecPatch"], params))["containers"]
        assert patched["resources"]["limits"]["memory"] == units.format_bytes(memory or 0)
        assert resolve(env[contract.ENV_MEMORY_LIMIT], params) == str(memory)
    numbers = [n for n, _, _ in local]
    assert numbers == list(range(len(verdicts))), "contiguous across the stage's tasks"


@pytest.mark.slow
@pytest.mark.harness
def test_attempt_numbers_are_the_same_on_argos_controller_and_locally() -> None:
    from tests.compiler.test_argo_controller import run

    p = pipeline(stage(retry=LADDER))
    report = run(p, {
        "train-mem-1gi-app-0": [{"outcome": "deleted", "minutes": 5},
                                {"outcome": "oomkilled", "minutes": 5}],
        "train-mem-2gi-app-0": [{"outcome": "failed", "exitCode": 2, "minutes": 5}],
        "train-mem-2gi-app-1": [{"outcome": "oomkilled", "minutes": 5}],
        "train-mem-4gi-app-1": [{"outcome": "succeeded", "minutes": 5}],
    })
    assert report["phase"] == "Succeeded"
    argo = [int(a["pod"]["env"]["DURAPIPE_ATTEMPT"]) for a in report["attempts"]]
    local = local_replay(the_plan(p), [
        contract.VERDICT_PREEMPTED, contract.VERDICT_HOST_OOM, contract.VERDICT_APP_FAILURE,
        contract.VERDICT_HOST_OOM, contract.VERDICT_SUCCESS])
    assert argo == [n for n, _, _ in local]
    assert argo == [0, 1, 2, 3, 4]


def test_the_contract_environment_is_the_same_both_ways(tmp_path: Path) -> None:
    dump = ("import json, os, sys; json.dump({k: v for k, v in os.environ.items() "
            "if k.startswith('DURAPIPE_')}, open(sys.argv[1], 'w'))")
    p = pipeline(
        stage("prep", command=(sys.executable, "-c", "import sys; open(sys.argv[1], 'w')",
                               "/out/d"), outputs={"d": "/out/d"}),
        stage(command=(sys.executable, "-c", dump, "/out/env"), outputs={"env": "/out/env"},
              inputs={"data": Ref(path=("prep", "outputs", "d"))},
              retry=Retry(gpu_oom="retry", on_oom=OnOom(memory=(GI, 2 * GI)))),
        storage="s3://bucket/demo",
    )
    record = Runner(p, str(tmp_path / "p.pipe"), RunOptions(home=tmp_path / ".durapipe")).run()
    assert record.status == "succeeded", record.stages["train"].reason
    local = json.loads(Path(record.stages["train"].outputs["env"]).read_text())
    leaf, params = run_by(templates(p), "train-mem-1gi")
    pod = {e["name"]: resolve(e["value"], params) for e in leaf["container"]["env"]
           if e["name"].startswith("DURAPIPE_")}
    # Only where each executor keeps its files and its run id differ; the sidecar is the pod's.
    # DURAPIPE_ATTEMPT is `{{retries}}` in the pod (the attempt tests above run it).
    site = {contract.ENV_RUN_ID, contract.ENV_ATTEMPT, contract.ENV_OUTPUTS, contract.ENV_OUTPUT_HASH_DIR,
            contract.ENV_TERMINATION_LOG, contract.ENV_STORE_URI, "DURAPIPE_INPUTS"}
    # The runner's own process adds what the wrapper exports to the command.
    assert set(pod) <= set(local)
    for name in sorted(set(pod) - site):
        assert local[name] == pod[name], name
    assert json.loads(local["DURAPIPE_INPUTS"])["data"] == record.stages["prep"].outputs["d"]


EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.pipe"))
_PARAM_READ = re.compile(r"'([^']+)': workflow\.parameters\['([^']+)'\]")
_UPSTREAM_READ = re.compile(r"'([^']+)': inputs\.parameters\['[^']+'\]")
_STATIC = re.compile(r"'static': '([0-9a-f]{64})'")


def cached_everywhere(p: Pipeline) -> Pipeline:
    """The pipeline with a cache on every stage, so every stage has a key on both sides."""
    return dataclasses.replace(p, stages=tuple(
        dataclasses.replace(s, cache=s.cache or Cache()) for s in p.stages))


def argo_keys(p: Pipeline, fake_hash: dict[str, str]) -> dict[str, str]:
    """Each stage's memoization key as Argo's controller would evaluate it: the compiled
    expression's own reads, given the workflow's parameter values and upstream hashes."""
    result = compile_pipeline(p, CompileOptions())
    assert result.ok, [d.message for d in result.diagnostics]
    from durapipe.compiler.checkpoint_gc import is_collector

    keys: dict[str, set[str]] = {}
    for doc in (d for d in result.documents if not is_collector(d)):
        held = {a["name"]: a["value"] for a in doc["spec"].get("arguments", {}).get(
            "parameters", [])}
        for t in doc["spec"]["templates"]:
            if "memoize" not in t:
                continue
            expression = t["memoize"]["key"]
            (static,) = _STATIC.findall(expression)
            params = {name: held[ref] for name, ref in _PARAM_READ.findall(expression)}
            upstream = {name: fake_hash[name] for name in _UPSTREAM_READ.findall(expression)}
            stage_name = t.get("metadata", {}).get("labels", {}).get(
                "durapipe.dev/stage") or next(
                s.name for s in p.stages if naming.task_name(s.name) == t["name"])
            keys.setdefault(stage_name, set()).add(memo.runtime_key(static, params, upstream))
    assert all(len(k) == 1 for k in keys.values()), keys
    return {name: k.pop() for name, k in keys.items()}


def runner_keys(p: Pipeline, tmp_path: Path, fake_hash: dict[str, str]) -> dict[str, str]:
    runner = Runner(p, str(tmp_path / "p.pipe"), RunOptions(home=tmp_path / ".durapipe"))
    for name, digest in fake_hash.items():
        stage_name, _, output = name.partition(".")
        runner.record.stages[stage_name].output_hashes[output] = digest
    return {s.name: runner._cache_key(runner.plans[s.name]) for s in p.stages}


def fake_hashes(p: Pipeline) -> dict[str, str]:
    return {f"{s.name}.{o}": f"sha256-of-{s.name}-{o}" for s in p.stages for o in s.outputs}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_cache_keys_are_the_same_both_ways_for_every_example(path: Path, tmp_path: Path) -> None:
    loaded = load_path(path)
    assert loaded.pipeline is not None
    p = cached_everywhere(loaded.pipeline)
    hashes = fake_hashes(p)
    argo = argo_keys(p, hashes)
    assert set(argo) == {s.name for s in p.stages}
    assert runner_keys(p, tmp_path, hashes) == argo


def test_the_runners_key_reads_what_the_plan_reads_on_a_multi_node_stage(tmp_path: Path) -> None:
    """A multi-node stage's `inputs` are not among the plan's reads (its pods are JobSet's,
    which Argo's artifacts do not reach, so the lowering's key has no upstream); the runner's
    key, which walked `Stage.references()`, counted them."""
    p = pipeline(
        stage("prep", outputs={"d": "/out/d"}),
        stage(inputs={"data": Ref(path=("prep", "outputs", "d"))},
              distributed=Distributed(replicas=2), cache=Cache()),
        storage="s3://bucket/demo",
    )
    (plan,) = [sp for sp in plan_pipeline(p, checkpoint_grace_seconds=0).stages
               if sp.stage.name == "train"]
    assert plan.upstream == () and plan.params == frozenset()
    hashes = fake_hashes(p)
    expected = memo.runtime_key(cache_static(plan.stage), {}, {})
    assert runner_keys(p, tmp_path, hashes)["train"] == expected
