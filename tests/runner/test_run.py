"""`durapipe run` end to end: real processes through the runtime wrapper."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from durapipe.dsl import load_path
from durapipe.runner.cgroups import CgroupFactory
from durapipe.runner.engine import Fault, RunError, Runner, RunOptions
from durapipe.runner.records import RunRecord

PY = sys.executable


def _run(tmp_path: Path, text: str, **options: object) -> RunRecord:
    path = tmp_path / "p.pipe"
    path.write_text(textwrap.dedent(text))
    result = load_path(path)
    assert result.pipeline is not None, result.diagnostics
    opts = RunOptions(home=tmp_path / ".durapipe", grace_seconds=2.0, backoff_scale=0.0,
                      **options)  # type: ignore[arg-type]
    return Runner(result.pipeline, str(path), opts).run()


def _verdicts(record: RunRecord, stage: str) -> list[str]:
    return [a.verdict for a in record.stages[stage].attempts]


def test_application_failures_spend_attempts_then_fail(tmp_path: Path) -> None:
    record = _run(tmp_path, f"""
        pipeline "p" {{}}
        stage "a" {{
          image = "x"
          command = ["{PY}", "-c", "raise SystemExit(3)"]
          retry {{ attempts = 2 }}
        }}
    """)
    assert record.status == "failed"
    assert _verdicts(record, "a") == ["app_failure"] * 3
    assert record.stages["a"].reason.startswith("failed; the failure budget (2) is spent")
    assert record.stages["a"].attempts[0].exit_code == 3


def test_preemptions_use_their_own_budget(tmp_path: Path) -> None:
    marker = tmp_path / "failed-once"
    record = _run(tmp_path, f"""
        pipeline "p" {{}}
        stage "a" {{
          image = "x"
          command = ["{PY}", "-c", "import os,sys,time,pathlib; print('go', flush=True); p=pathlib.Path(sys.argv[1]); time.sleep(0.6); fail = not p.exists(); p.touch(); sys.exit(1 if fail else 0)", "{marker}"]
          retry {{ attempts = 1  preemptions = 2 }}
        }}
    """, faults=[Fault("preempt", "a", 0.2), Fault("preempt", "a", 0.2)])
    assert _verdicts(record, "a") == ["preempted", "preempted", "app_failure", "success"]
    assert record.status == "succeeded"


def test_kill_drill_is_a_pod_deletion_and_a_timeout_spends_the_preemption_budget(
        tmp_path: Path) -> None:
    # On the cluster a deleted pod is "pod deleted", which the retry expression treats as a
    # preemption (argo_retry.PREEMPTION_MARKERS): `--kill` must spend the same budget locally.
    record = _run(tmp_path, f"""
        pipeline "p" {{}}
        stage "a" {{
          image = "x"
          command = ["{PY}", "-c", "import time; print('go', flush=True); time.sleep(30)"]
          timeout = 1s
          retry {{ attempts = 1  preemptions = 1 }}
        }}
    """, faults=[Fault("kill", "a", 0.3)])
    attempts = record.stages["a"].attempts
    # A timeout is Argo's activeDeadlineSeconds: SIGTERM, exit 143, retried from the
    # preemption budget (plan/machine.py), which the kill spent: the stage fails, and
    # `retry.attempts` is never drawn on.
    assert [a.verdict for a in attempts] == ["preempted", "timeout"]
    assert attempts[0].fault == "kill@0.3s"
    assert attempts[0].message == "the pod was deleted (--kill)"
    assert record.status == "failed"
    assert record.stages["a"].reason == "timed out after 1s; the preemption budget (1) is spent"


def test_cache_reuses_stage_until_a_param_or_upstream_output_changes(tmp_path: Path) -> None:
    text = f"""
        pipeline "p" {{ storage = "s3://bucket/p" }}
        params {{ n: int = 3  salt: str = "a" }}
        stage "prep" {{
          image = "x"
          command = ["{PY}", "-c", "import sys; open(sys.argv[1],'w').write(sys.argv[2])", "/out/d", params.salt]
          outputs {{ d = "/out/d" }}
          cache = true
        }}
        stage "train" {{
          image = "x"
          command = ["{PY}", "-c", "import sys; open(sys.argv[2],'w').write(open(sys.argv[1]).read()*int(sys.argv[3]))", prep.outputs.d, "/out/m", params.n]
          outputs {{ m = "/out/m" }}
          cache = true
        }}
    """
    first = _run(tmp_path, text)
    assert [s.status for s in first.stages.values()] == ["succeeded", "succeeded"]
    assert Path(first.stages["train"].outputs["m"]).read_text() == "aaa"
    again = _run(tmp_path, text)
    assert [s.status for s in again.stages.values()] == ["cached", "cached"]
    assert Path(again.stages["train"].outputs["m"]).read_text() == "aaa"
    assert [s.cache_miss for s in first.stages.values()] == [
        "no earlier cache entry for this stage"] * 2
    new_n = _run(tmp_path, text, params={"n": "2"})
    assert [s.status for s in new_n.stages.values()] == ["cached", "succeeded"]
    # Why it missed, as `durapipe status` says it on a cluster: the component that changed
    # against the newest entry of the stage.
    assert new_n.stages["train"].cache_miss == "param n: '3' -> '2'"
    new_upstream = _run(tmp_path, text, params={"salt": "b"})
    assert [s.status for s in new_upstream.stages.values()] == ["succeeded", "succeeded"]
    assert new_upstream.stages["train"].cache_key != first.stages["train"].cache_key
    assert new_upstream.stages["prep"].cache_miss == "param salt: 'a' -> 'b'"
    assert new_upstream.stages["train"].cache_miss.startswith(
        "param n: '2' -> '3'; upstream prep.d: '")
    # A changed image misses with its old and new names (against the newest entry: salt b).
    retagged = _run(tmp_path, text.replace('image = "x"', 'image = "y"', 1),
                    params={"salt": "b"})
    assert retagged.stages["prep"].cache_miss == "image: 'x' -> 'y'"


def test_resume_reuses_succeeded_stages(tmp_path: Path) -> None:
    flag = tmp_path / "eval-fixed"
    text = f"""
        pipeline "p" {{}}
        stage "train" {{
          image = "x"
          command = ["{PY}", "-c", "import sys; open(sys.argv[1],'w').write('w')", "/out/m"]
          outputs {{ m = "/out/m" }}
        }}
        stage "eval" {{
          image = "x"
          command = ["{PY}", "-c", "import os,sys; sys.exit(0 if os.path.exists(sys.argv[2]) else 1)", train.outputs.m, "{flag}"]
        }}
    """
    first = _run(tmp_path, text)
    assert (first.stages["train"].status, first.stages["eval"].status) == ("succeeded", "failed")
    flag.touch()
    second = _run(tmp_path, text, resume=first.run_id)
    assert (second.stages["train"].status, second.stages["eval"].status) == \
        ("reused", "succeeded")
    assert second.stages["train"].attempts == []


def test_downstream_of_a_failure_is_skipped(tmp_path: Path) -> None:
    record = _run(tmp_path, f"""
        pipeline "p" {{}}
        stage "a" {{ image = "x"  command = ["{PY}", "-c", "raise SystemExit(1)"] }}
        stage "b" {{ image = "x"  command = ["true"]  needs = [a] }}
    """)
    assert record.stages["b"].status == "skipped"
    assert record.stages["b"].reason == "upstream failed: a"


def test_bad_params_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="param n expects int"):
        _run(tmp_path, 'pipeline "p" {}\nparams { n: int = 1 }\n'
                       'stage "a" { image = "x" command = ["true", params.n] }\n',
             params={"n": "many"})


def test_real_kernel_oom_climbs_the_ladder(tmp_path: Path) -> None:
    if not CgroupFactory().available:
        pytest.skip("no writable memory cgroup (v1 or v2) on this machine")
    record = _run(tmp_path, f"""
        pipeline "p" {{}}
        stage "hog" {{
          image = "x"
          command = ["{PY}", "-c", "b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096])"]
          retry {{ on_oom {{ memory = [128Mi, 256Mi, 512Mi] }} }}
        }}
    """)
    attempts = record.stages["hog"].attempts
    assert [(a.verdict, a.memory) for a in attempts] == [
        ("host_oom", "128Mi"), ("host_oom", "256Mi"), ("success", "512Mi")]
    assert record.status == "succeeded"


def test_plain_view_and_summary_report_attempts(tmp_path: Path) -> None:
    import io

    from durapipe.runner.view import View, summary

    stream = io.StringIO()
    view = View(stream=stream, live=False)
    path = tmp_path / "p.pipe"
    path.write_text(f'pipeline "p" {{}}\nstage "a" {{ image = "x" '
                    f'command = ["{PY}", "-c", "raise SystemExit(1)"] retry {{ attempts = 1 }} }}\n')
    result = load_path(path)
    assert result.pipeline is not None
    runner = Runner(result.pipeline, str(path),
                    RunOptions(home=tmp_path / ".durapipe", backoff_scale=0.0), view)
    view.attach(runner.record)
    record = runner.run()
    view.close()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "a: started"
    first, second = (a.number for a in record.stages["a"].attempts)
    assert lines[1].startswith(f"a: attempt #{first} app_failure -> failed; retry 1/1")
    assert lines[-1].startswith("a: failed (failed; the failure budget (1) is spent")
    text = summary(record)
    assert f"run {record.run_id}: failed" in text
    assert f"    #{first} rung 0: app_failure after" in text
    assert f"    #{second} rung 0: app_failure" in text


def test_the_cache_key_of_a_param_default_is_the_compiled_workflows(tmp_path: Path) -> None:
    """The compiled Workflow holds a default as kubelet-escaped text (`pre$$(X)`, so that the
    pod gets `pre$(X)`) and its memoization key hashes that; the local key must be the same
    for the same command, or docs/local.md's "the compiled workflow's key" is not true."""
    from durapipe.compiler import CompileOptions, compile_pipeline, memo
    from durapipe.compiler.plan import cache_static

    record = _run(tmp_path, f"""
        pipeline "p" {{ storage = "s3://bucket/p" }}
        params {{ x: str = "pre$(X)" }}
        stage "a" {{
          image = "x"
          command = ["{PY}", "-c", "import sys; assert sys.argv[1] == 'pre$(X)'", params.x]
          cache = true
        }}
    """)
    assert record.status == "succeeded"
    pipeline = load_path(tmp_path / "p.pipe").pipeline
    assert pipeline is not None
    (doc,) = compile_pipeline(pipeline, CompileOptions()).documents
    (held,) = doc["spec"]["arguments"]["parameters"]
    assert held == {"name": "x", "value": "pre$$(X)"}
    static = cache_static(pipeline.stages[0])
    assert record.stages["a"].cache_key == memo.runtime_key(static, {"x": held["value"]}, {})


def test_drills_apply_in_command_line_order(tmp_path: Path) -> None:
    """#27: `--kill a@0.2 --preempt a@0.2` kills the first attempt and preempts the second
    (they were applied preempts first, then kills, whatever the command line said)."""
    import argparse

    from durapipe.runner import cli as runner_cli

    parser = argparse.ArgumentParser()
    runner_cli.add_run_arguments(parser)
    args = parser.parse_args(["p.pipe", "--kill", "a@0.2", "--preempt", "a@0.2",
                              "--kill", "a@0.4"])
    options = runner_cli._options(args, {"a"})
    assert not isinstance(options, str)
    assert [(f.kind, f.seconds) for f in options.faults] == [
        ("kill", 0.2), ("preempt", 0.2), ("kill", 0.4)]
    assert parser.parse_args(["p.pipe"]).drills == []  # the default is never shared
    record = _run(tmp_path, f"""
        pipeline "p" {{}}
        stage "a" {{
          image = "x"
          command = ["{PY}", "-c", "import time; print('go', flush=True); time.sleep(1.5)"]
          retry {{ preemptions = 3 }}
        }}
    """, faults=options.faults)
    assert [a.fault for a in record.stages["a"].attempts] == [
        "kill@0.2s", "preempt@0.2s", "kill@0.4s", ""]
    assert record.status == "succeeded"


def test_the_live_table_shows_the_running_attempt_and_no_verdict_line(tmp_path: Path) -> None:
    """On a terminal the table is redrawn every 0.5 s. While attempt #2 runs, it must say #2
    and show #2's output, not #1's number and #1's last log line (the wrapper's raw verdict
    line), as it did when it read only the attempts that had ended."""
    import io
    import re

    from durapipe.runner.view import View

    marker = tmp_path / "failed-once"
    stream = io.StringIO()
    view = View(stream=stream, live=True)
    path = tmp_path / "p.pipe"
    program = ("import pathlib, sys, time\n"
               "p = pathlib.Path(sys.argv[1])\n"
               "if not p.exists():\n"
               "    p.touch(); print('first attempt fails', flush=True); sys.exit(3)\n"
               "print('second attempt at work', flush=True); time.sleep(2.5)\n")
    script = tmp_path / "step.py"
    script.write_text(program)
    path.write_text(f'pipeline "p" {{}}\nstage "a" {{ image = "x" '
                    f'command = ["{PY}", "{script}", "{marker}"] retry {{ attempts = 1 }} }}\n')
    result = load_path(path)
    assert result.pipeline is not None, result.diagnostics
    runner = Runner(result.pipeline, str(path),
                    RunOptions(home=tmp_path / ".durapipe", backoff_scale=0.0), view)
    view.attach(runner.record)
    record = runner.run()
    view.close()
    assert _verdicts(record, "a") == ["app_failure", "success"]
    first, second = (a.number for a in record.stages["a"].attempts)
    frames = re.split(r"\x1b\[\d+F\x1b\[J", stream.getvalue())
    running = [f for f in frames if " running " in f]
    assert any(f"attempt #{second}" in f and "second attempt at work" in f for f in running), \
        running
    # No frame of the second attempt names the first, and no frame shows a raw verdict line.
    assert not [f for f in running if "second attempt at work" in f
                and f"attempt #{first} " in f], running
    assert "durapipe-verdict:" not in stream.getvalue()
    assert record.stages["a"].current is None
    assert "current" not in record.to_json()["stages"]["a"]
