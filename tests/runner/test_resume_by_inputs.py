"""Checkpoint lines found by what a stage is (``checkpoint { scope = "inputs" }``, the
default): a run that failed for good is submitted again and its stage resumes from the
previous run's newest commit; a changed param starts fresh; ``--resume`` reuses the named
run's line even where the inputs changed."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from durapipe.dsl import load_path
from durapipe.runner.engine import Fault, Runner, RunOptions
from durapipe.runner.records import RunRecord
from durapipe.runtime.manifest import decode_manifest, manifest_key
from durapipe.runtime.restore import list_commits
from durapipe.runtime.store import open_store

COUNTER = Path(__file__).resolve().parents[2] / "examples" / "runtime" / "counter_training.py"


def _run(tmp_path: Path, scope: str | None, **options: object) -> RunRecord:
    checkpoint = "checkpoint = true" if scope is None else f'checkpoint {{ scope = "{scope}" }}'
    source = tmp_path / "p.pipe"
    source.write_text(textwrap.dedent(f"""
        pipeline "resume-by-inputs" {{ storage = "s3://acme-ml/durapipe" }}
        params {{
          steps: int = 400
          every: int = 1000
        }}
        stage "count" {{
          image   = "python:3.12-slim"
          command = ["python3", "{COUNTER}", "--steps", params.steps, "--every", params.every,
                     "--step-seconds", "0.01"]
          interruptible = true
          retry {{ preemptions = 0 }}
          {checkpoint}
        }}
    """))
    loaded = load_path(source)
    assert loaded.pipeline is not None, loaded.diagnostics
    opts = RunOptions(home=tmp_path / ".durapipe", grace_seconds=5.0, backoff_scale=0.0,
                      **options)  # type: ignore[arg-type]
    return Runner(loaded.pipeline, str(source), opts).run()


def _log(record: RunRecord) -> str:
    return Path(record.stages["count"].attempts[-1].log).read_text()


def _preempted_for_good(tmp_path: Path, scope: str | None = None, **options: object) -> int:
    """Run 1: preempted with no preemption budget left, after its final save."""
    return _first_run(tmp_path, scope, **options)[0]


def _first_run(tmp_path: Path, scope: str | None = None,
               **options: object) -> tuple[int, RunRecord]:
    record = _run(tmp_path, scope, faults=[Fault("preempt", "count", 1.0)], **options)
    assert record.stages["count"].status == "failed"
    assert [a.verdict for a in record.stages["count"].attempts] == ["preempted"]
    stopped = int(re.findall(r"stopped at (\d+)", _log(record))[-1])
    assert stopped > 0
    return stopped, record


def test_a_resubmitted_run_resumes_from_the_failed_runs_newest_commit(tmp_path: Path) -> None:
    stopped = _preempted_for_good(tmp_path)
    again = _run(tmp_path, None)
    count = again.stages["count"]
    assert count.status == "succeeded"
    assert re.findall(r"resumed at (\d+)", _log(again)) == [str(stopped)]
    assert count.attempts[0].resumed_from.endswith(f"(step {stopped})")
    assert "/inputs/count/" in count.checkpoint_line
    assert "finished 80200" in _log(again)  # sum(1..400): no step lost or doubled


def test_a_changed_param_starts_fresh_and_resume_reuses_the_named_runs_line(
    tmp_path: Path,
) -> None:
    stopped, first = _first_run(tmp_path)
    changed = _run(tmp_path, None, params={"every": "999"})
    assert re.findall(r"resumed at (\d+)", _log(changed)) == ["0"]
    assert changed.stages["count"].attempts[0].resumed_from == ""
    # The named run's line, though a param changed: a fixed bug downstream must not retrain.
    # It is read, not written: the new inputs' commits go to their own line.
    forced = _run(tmp_path, None, params={"every": "998"}, resume=first.run_id)
    assert re.findall(r"resumed at (\d+)", _log(forced)) == [str(stopped)]
    assert forced.stages["count"].attempts[0].resumed_from.endswith(f"(step {stopped})")
    old_line = first.stages["count"].checkpoint_line
    assert forced.stages["count"].checkpoint_line != old_line
    assert [int(m["step"]) for m in _commit_steps(old_line)] == [stopped]


def _commit_steps(line: str) -> list[dict[str, object]]:
    store = open_store(line)
    return [decode_manifest(store.get_bytes(manifest_key(seq)))["metadata"]
            for seq in list_commits(store)]


def test_scope_run_keeps_each_run_on_its_own_line(tmp_path: Path) -> None:
    _preempted_for_good(tmp_path, "run")
    again = _run(tmp_path, "run")
    assert re.findall(r"resumed at (\d+)", _log(again)) == ["0"]
    assert "/runs/" in again.stages["count"].checkpoint_line
