"""The Lightning and Hugging Face callbacks: a run stopped by SIGTERM resumes where it stopped."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from durapipe.runtime import contract
from tests.runtime.runtime_helpers import EXAMPLES, child_env, preempt_after_line


def env_for(tmp_path: Path) -> dict[str, str]:
    return child_env(
        **{
            contract.ENV_CHECKPOINT_URI: (tmp_path / "store").as_uri(),
            contract.ENV_CHECKPOINT_PATH: str(tmp_path / "local"),
            contract.ENV_GRACE_SECONDS: "120",
        }
    )


def stop_then_resume(tmp_path: Path, script: Path, stop_step: int) -> tuple[int, str]:
    """SIGTERM the wrapped run after ``stop_step``; return where it stopped and the rerun's output."""
    stderr_path = tmp_path / "first-attempt.stderr"
    with stderr_path.open("w") as stderr:
        rest = preempt_after_line(
            # Held at the step until the stop arrives: without the hold, a test process slower
            # to act than the remaining steps (seen in CI under load) let the run finish first.
            [sys.executable, str(script), "--hold-at", str(stop_step)], env=env_for(tmp_path),
            termination_log=tmp_path / "log", line=f"step {stop_step}", timeout=180,
            stderr=stderr.fileno())
    assert "stopped at " in rest, (
        f"stdout after the stop:\n{rest[-2000:]}\nstderr:\n{stderr_path.read_text()[-4000:]}")
    stopped_at = int(rest.split("stopped at ")[1].split()[0])
    # The stop lands during the held step; a framework acts on it at that step's end or the next.
    assert stop_step <= stopped_at <= stop_step + 1
    second = subprocess.run(
        [sys.executable, str(script)],
        env=env_for(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    return stopped_at, second.stdout


@pytest.mark.training
def test_lightning_run_resumes_from_the_mirrored_last_ckpt(tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="lightning is in the ml extra (pulled in by test)")
    total = 5 * 8  # epochs x batches
    stopped_at, output = stop_then_resume(
        tmp_path, EXAMPLES / "lightning_training.py", random.Random().randint(2, total - 4)
    )
    started = int(output.split("start ")[1].split()[0])
    assert started == stopped_at
    assert f"finished {total}" in output


@pytest.mark.training
def test_hf_trainer_run_resumes_from_the_mirrored_checkpoint_dir(tmp_path: Path) -> None:
    pytest.importorskip(
        "transformers", reason="transformers is in the ml extra (pulled in by test)"
    )
    stopped_at, output = stop_then_resume(
        tmp_path, EXAMPLES / "hf_training.py", random.Random().randint(1, 9)
    )
    resumed_from = output.split("resumed from ")[1].split()[0]
    assert resumed_from.endswith(f"checkpoint-{stopped_at}")
    assert "step 1\n" not in output
    assert "finished 12" in output
