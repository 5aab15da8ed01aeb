"""Resume equivalence with PyTorch on CPU: interrupted + resumed == uninterrupted, bit for bit."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from durapipe.runtime import contract
from tests.runtime.runtime_helpers import EXAMPLES, child_env, runtime_cmd

torch = pytest.importorskip("torch", reason="torch is in the ml extra (pulled in by test)")

SCRIPT = EXAMPLES / "torch_training.py"
TOTAL_STEPS = 4 * 16  # 4 epochs of 256 samples in batches of 16


def training_env(store: Path, local: Path) -> dict[str, str]:
    return child_env(
        **{
            contract.ENV_CHECKPOINT_URI: store.as_uri(),
            contract.ENV_CHECKPOINT_PATH: str(local),
            contract.ENV_GRACE_SECONDS: "60",
        }
    )


def run_to_end(store: Path, local: Path, out: Path) -> str:
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)],
        env=training_env(store, local),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout


def interrupt_at(step: int, how: str, store: Path, local: Path, out: Path) -> None:
    # Held at the step until the stop (or the kill) arrives, however slow the machine.
    command = [sys.executable, str(SCRIPT), "--out", str(out), "--hold-at", str(step)]
    if how == "sigterm":
        command = runtime_cmd("exec", "--termination-log", str(local / "log"), "--", *command)
    process = subprocess.Popen(
        command, env=training_env(store, local), stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    for line in process.stdout:
        if line.strip() == f"step {step}":
            break
    else:
        raise AssertionError(f"the run ended before step {step}")
    if how == "sigkill":
        # Kill only once something is committed, so the resume really starts mid-run.
        for _ in range(6000):
            if (store / "manifests").is_dir() and any((store / "manifests").iterdir()):
                break
            time.sleep(0.005)
    process.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
    rest = process.stdout.read()
    code = process.wait(timeout=120)
    if how == "sigterm":
        assert code == contract.EXIT_PREEMPTED
        assert f"stopped at {step}\n" in rest
    else:
        assert code == -signal.SIGKILL
    assert not out.exists()


def assert_bit_identical(first: Path, second: Path) -> None:
    a = torch.load(first, weights_only=False)
    b = torch.load(second, weights_only=False)
    assert a["model"].keys() == b["model"].keys()
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    for key, state in a["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(value, b["optimizer"]["state"][key][name]), (key, name)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The final state of an uninterrupted run."""
    root = tmp_path_factory.mktemp("reference")
    out = root / "reference.pt"
    assert f"finished at {TOTAL_STEPS}" in run_to_end(root / "store", root / "local", out)
    return out


def test_the_comparison_detects_a_single_bit(reference: Path, tmp_path: Path) -> None:
    state = torch.load(reference, weights_only=False)
    weights = state["model"]["0.weight"]
    weights.view(torch.int32)[0, 0] ^= 1
    flipped = tmp_path / "flipped.pt"
    torch.save(state, flipped)
    with pytest.raises(AssertionError):
        assert_bit_identical(reference, flipped)


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_interrupted_and_resumed_run_matches_an_uninterrupted_one(
    reference: Path, tmp_path: Path, how: str
) -> None:
    step = random.Random().randint(6, TOTAL_STEPS - 3)
    resumed = tmp_path / "resumed.pt"
    interrupt_at(step, how, tmp_path / "store", tmp_path / "local-1", resumed)
    output = run_to_end(tmp_path / "store", tmp_path / "local-2", resumed)
    resumed_from = int(output.split("resumed at ")[1].split()[0])
    assert 0 < resumed_from <= TOTAL_STEPS and f"finished at {TOTAL_STEPS}" in output
    if how == "sigterm":
        assert resumed_from == step  # the final save on SIGTERM was committed
    assert_bit_identical(reference, resumed)
