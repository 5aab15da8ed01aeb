"""Resume equivalence of the scikit-learn ``partial_fit`` example."""

from __future__ import annotations

import pickle
import random
import subprocess
import sys
from pathlib import Path

import pytest

from durapipe.runtime import contract
from tests.runtime.runtime_helpers import EXAMPLES, child_env, preempt_after_line

np = pytest.importorskip("numpy", reason="numpy is in the ml extra (pulled in by test)")
pytest.importorskip("sklearn", reason="scikit-learn is in the ml extra (pulled in by test)")

SCRIPT = EXAMPLES / "sklearn_partial_fit.py"
EPOCHS = 12


def env_for(tmp_path: Path, name: str) -> dict[str, str]:
    return child_env(
        **{
            contract.ENV_CHECKPOINT_URI: (tmp_path / f"store-{name}").as_uri(),
            contract.ENV_CHECKPOINT_PATH: str(tmp_path / f"local-{name}"),
        }
    )


def test_sigterm_then_resume_gives_identical_coefficients(tmp_path: Path) -> None:
    reference = tmp_path / "reference.pkl"
    subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(reference)],
        env=env_for(tmp_path, "a"),
        check=True,
        capture_output=True,
    )
    stop_after = random.Random().randint(1, EPOCHS - 2)
    resumed = tmp_path / "resumed.pkl"
    command = [sys.executable, str(SCRIPT), "--out", str(resumed)]
    # Held at the epoch until the stop arrives, so the stop lands there however slow the machine.
    preempt_after_line([*command, "--hold-at", str(stop_after)], env=env_for(tmp_path, "b"),
                       termination_log=tmp_path / "log", line=f"epoch {stop_after}", timeout=60)
    assert not resumed.exists()
    second = subprocess.run(
        command, env=env_for(tmp_path, "b"), check=True, capture_output=True, text=True
    )
    resumed_at = int(second.stdout.split("resumed at ")[1].split()[0])
    assert resumed_at == stop_after
    a = pickle.loads(reference.read_bytes())
    b = pickle.loads(resumed.read_bytes())
    assert np.array_equal(a.coef_, b.coef_) and np.array_equal(a.intercept_, b.intercept_)
    assert a.t_ == b.t_
