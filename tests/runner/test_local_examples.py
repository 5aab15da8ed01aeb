"""The seed scenarios of examples/local/ run end to end with real work and injected failures."""

from __future__ import annotations

import importlib.util
import pickle
import re
from pathlib import Path

import pytest

from durapipe.dsl import load_path
from durapipe.runner.cgroups import CgroupFactory
from durapipe.runner.engine import Fault, Runner, RunOptions
from durapipe.runner.records import RunRecord

LOCAL = Path(__file__).resolve().parents[2] / "examples" / "local"


def _run(tmp_path: Path, name: str, **options: object) -> RunRecord:
    result = load_path(LOCAL / name)
    assert result.pipeline is not None, result.diagnostics
    opts = RunOptions(home=tmp_path / ".durapipe", grace_seconds=5.0, backoff_scale=0.0,
                      **options)  # type: ignore[arg-type]
    return Runner(result.pipeline, str(LOCAL / name), opts).run()


def _log(record: RunRecord, stage: str, attempt: int) -> str:
    return Path(record.stages[stage].attempts[attempt].log).read_text()


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[ml]')")


def test_fixed_eval_reruns_only_eval(tmp_path: Path) -> None:
    first = _run(tmp_path, "cached_eval.pipe")
    assert [s.status for s in first.stages.values()] == ["succeeded", "succeeded", "failed"]
    fixed = _run(tmp_path, "cached_eval.pipe", params={"min_accuracy": "0.5"})
    assert [s.status for s in fixed.stages.values()] == ["cached", "cached", "succeeded"]
    assert "accuracy" in _log(fixed, "eval", 0)


def test_preempted_stage_resumes_from_its_final_checkpoint(tmp_path: Path) -> None:
    record = _run(tmp_path, "preempt_resume.pipe", faults=[Fault("preempt", "count", 1.5)])
    assert [a.verdict for a in record.stages["count"].attempts] == ["preempted", "success"]
    stopped = int(re.findall(r"stopped at (\d+)", _log(record, "count", 0))[-1])
    resumed = int(re.findall(r"resumed at (\d+)", _log(record, "count", 1))[-1])
    assert stopped - resumed <= 1
    assert resumed > 0
    assert record.stages["count"].attempts[1].resumed_from.endswith(f"(step {stopped})")
    assert "finished 45150" in _log(record, "count", 1)  # sum(1..300): no step lost or doubled


def test_oom_stage_is_killed_by_the_kernel_and_succeeds_on_the_next_rung(tmp_path: Path) -> None:
    if not CgroupFactory().available:
        pytest.skip("no writable memory cgroup (v1 or v2) on this machine")
    record = _run(tmp_path, "oom_ladder.pipe")
    attempts = record.stages["features"].attempts
    assert [(a.verdict, a.memory) for a in attempts] == [("host_oom", "256Mi"),
                                                          ("success", "512Mi")]


def _three_failures(stage: str, seconds: float) -> list[Fault]:
    # Late enough that the framework import is over and checkpoints exist, even on a busy
    # machine; the examples' step time keeps each run longer than this.
    return [Fault("preempt", stage, seconds), Fault("kill", stage, seconds),
            Fault("preempt", stage, seconds)]


@pytest.mark.training
def test_torch_training_resumed_three_times_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    _require("torch")
    import torch

    clean = _run(tmp_path / "clean", "torch_resume.pipe")
    broken = _run(tmp_path / "broken", "torch_resume.pipe", faults=_three_failures("train", 5.0))
    assert clean.status == broken.status == "succeeded"
    assert [a.verdict for a in broken.stages["train"].attempts] == \
        ["preempted", "preempted", "preempted", "success"]
    assert all(a.resumed_from for a in broken.stages["train"].attempts[1:])
    a = torch.load(clean.stages["train"].outputs["weights"], weights_only=True)
    b = torch.load(broken.stages["train"].outputs["weights"], weights_only=True)
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            continue
        assert torch.equal(a[key], b[key]), key


@pytest.mark.training
def test_sklearn_partial_fit_resumed_three_times_matches(tmp_path: Path) -> None:
    _require("sklearn")
    clean = _run(tmp_path / "clean", "sklearn_resume.pipe")
    broken = _run(tmp_path / "broken", "sklearn_resume.pipe", faults=_three_failures("fit", 3.0))
    assert [a.verdict for a in broken.stages["fit"].attempts] == \
        ["preempted", "preempted", "preempted", "success"]
    with open(clean.stages["fit"].outputs["model"], "rb") as f1, \
            open(broken.stages["fit"].outputs["model"], "rb") as f2:
        first, second = pickle.load(f1), pickle.load(f2)
    assert (first.coef_ == second.coef_).all() and (first.intercept_ == second.intercept_).all()


def test_interrupt_stops_cleanly_and_the_stage_saves_a_final_checkpoint(tmp_path: Path) -> None:
    import threading
    import time

    result = load_path(LOCAL / "preempt_resume.pipe")
    assert result.pipeline is not None
    runner = Runner(result.pipeline, str(LOCAL / "preempt_resume.pipe"),
                    RunOptions(home=tmp_path / ".durapipe", grace_seconds=5.0))
    done: list[RunRecord] = []
    thread = threading.Thread(target=lambda: done.append(runner.run()))
    thread.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until the loop runs (Ctrl-C mid-training)
        logs = sorted((runner.run_dir / "count").glob("attempt-*/log"))
        if logs and "resumed at" in logs[0].read_text():
            break
        time.sleep(0.05)
    time.sleep(0.5)
    runner.interrupt()
    thread.join(timeout=60)
    record = done[0]
    assert record.status == "interrupted"
    attempts = record.stages["count"].attempts
    assert [a.verdict for a in attempts] == ["preempted"]
    stopped = re.findall(r"stopped at (\d+)", _log(record, "count", 0))
    assert stopped, "the stage did not save its final checkpoint"
    manifests = list((tmp_path / ".durapipe" / "store").rglob("manifests/*.json"))
    assert manifests, "no committed checkpoint in the store"
