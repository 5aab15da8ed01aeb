"""The wrapper ``python -m durapipe.runtime exec``: verdicts, exit codes, termination log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from durapipe.runtime import contract
from durapipe.runtime.cgroup import MemoryCgroup
from durapipe.runtime.hashing import hash_path
from durapipe.runtime.verdict import classify, parse_verdict_line, verdict_line
from durapipe.runtime.wrapper import Supervisor, run_attempt
from tests.runtime.runtime_helpers import EXAMPLES, child_env, runtime_cmd


def run_exec(
    code: str, termination_log: Path, *extra: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], str, dict[str, object]]:
    completed = subprocess.run(
        runtime_cmd(
            "exec",
            "--termination-log",
            str(termination_log),
            *extra,
            "--",
            sys.executable,
            "-c",
            code,
        ),
        env=env or child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = termination_log.read_text().splitlines()
    assert len(lines) == 1, lines
    verdict, details = parse_verdict_line(lines[0])
    return completed, verdict, details


def test_success_exits_zero_and_writes_one_verdict_line(termination_log: Path) -> None:
    completed, verdict, details = run_exec("print('hello')", termination_log)
    assert completed.returncode == contract.EXIT_SUCCESS
    assert completed.stdout == "hello\n"
    assert verdict == contract.VERDICT_SUCCESS
    assert details["returncode"] == 0
    assert termination_log.read_text().startswith(contract.verdict_marker("success") + " {")


def test_application_failure_keeps_the_users_exit_code(termination_log: Path) -> None:
    completed, verdict, details = run_exec(
        "import sys; sys.stderr.write('boom\\n'); sys.exit(3)", termination_log
    )
    assert completed.returncode == 3
    assert verdict == contract.VERDICT_APP_FAILURE
    assert "boom" in str(details["stderr_tail"])
    # stderr still reaches the pod log.
    assert "boom" in completed.stderr


@pytest.mark.parametrize("reserved", sorted(contract.RESERVED_EXIT_CODES))
def test_user_exit_codes_that_collide_with_reserved_ones_become_app_failure(
    termination_log: Path, reserved: int
) -> None:
    completed, verdict, _ = run_exec(f"import sys; sys.exit({reserved})", termination_log)
    assert verdict == contract.VERDICT_APP_FAILURE
    assert completed.returncode == contract.EXIT_APP_FAILURE


def test_simulated_cuda_oom_message_is_gpu_oom(termination_log: Path) -> None:
    code = (
        "import sys\n"
        "sys.stderr.write('Traceback (most recent call last):\\n'\n"
        "  'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; '\n"
        "  '79.15 GiB total capacity; 77.01 GiB already allocated)\\n')\n"
        "sys.exit(1)\n"
    )
    env = child_env(**{contract.ENV_GPU_OOM_POLICY: "retry"})
    completed, verdict, details = run_exec(code, termination_log, env=env)
    assert verdict == contract.VERDICT_GPU_OOM
    assert completed.returncode == contract.EXIT_GPU_OOM
    assert details["gpu_oom_policy"] == "retry"


def test_gpu_oom_exception_class_is_recognised_through_the_failure_record(
    termination_log: Path,
) -> None:
    # The message says nothing about memory: only the exception's class identifies it, and
    # the SDK's exception hook reports that to the wrapper.
    code = (
        "import durapipe.runtime as rt\n"
        "rt.context()\n"
        "OutOfMemoryError = type('OutOfMemoryError', (RuntimeError,), {'__module__': 'torch.cuda'})\n"
        "raise OutOfMemoryError('allocator gave up')\n"
    )
    completed, verdict, details = run_exec(code, termination_log)
    assert verdict == contract.VERDICT_GPU_OOM
    assert completed.returncode == contract.EXIT_GPU_OOM
    assert details["reported"]["exception"] == "torch.cuda.OutOfMemoryError"  # type: ignore[index]


def test_python_memory_error_is_host_oom(termination_log: Path) -> None:
    completed, verdict, _ = run_exec("raise MemoryError()", termination_log)
    assert verdict == contract.VERDICT_HOST_OOM
    assert completed.returncode == contract.EXIT_HOST_OOM


def test_missing_command_is_a_usage_error(termination_log: Path) -> None:
    completed = subprocess.run(
        runtime_cmd("exec", "--"), env=child_env(), capture_output=True, check=False
    )
    assert completed.returncode == contract.EXIT_USAGE
    completed = subprocess.run(
        runtime_cmd("bogus"), env=child_env(), capture_output=True, check=False
    )
    assert completed.returncode == contract.EXIT_USAGE


def test_a_command_that_cannot_start_is_an_app_failure_with_a_verdict(
    tmp_path: Path, termination_log: Path
) -> None:
    completed = subprocess.run(
        runtime_cmd(
            "exec",
            "--termination-log",
            str(termination_log),
            "--",
            str(tmp_path / "no-such-program"),
        ),
        env=child_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 127
    verdict, details = parse_verdict_line(termination_log.read_text().strip())
    assert verdict == contract.VERDICT_APP_FAILURE
    assert "no-such-program" in str(details["reason"])


def test_outputs_are_hashed_after_success(tmp_path: Path, termination_log: Path) -> None:
    model = tmp_path / "model"
    report = tmp_path / "report.txt"
    code = (
        "import pathlib\n"
        f"d = pathlib.Path({str(model)!r}); d.mkdir(); (d / 'w.bin').write_bytes(b'w' * 1000)\n"
        f"pathlib.Path({str(report)!r}).write_text('ok')\n"
    )
    hash_dir = tmp_path / "hashes"
    env = child_env(
        **{
            contract.ENV_OUTPUTS: json.dumps({"model": str(model), "report": str(report)}),
            contract.ENV_OUTPUT_HASH_DIR: str(hash_dir),
        }
    )
    completed, verdict, _ = run_exec(code, termination_log, env=env)
    assert (completed.returncode, verdict) == (0, contract.VERDICT_SUCCESS)
    assert (hash_dir / "model.hash").read_text() == hash_path(model)
    assert (hash_dir / "report.hash").read_text() == hash_path(report)
    assert hash_path(model) != hash_path(report)


def test_missing_declared_output_fails_the_attempt(tmp_path: Path, termination_log: Path) -> None:
    env = child_env(**{contract.ENV_OUTPUTS: json.dumps({"model": str(tmp_path / "absent")})})
    completed, verdict, details = run_exec("pass", termination_log, env=env)
    assert verdict == contract.VERDICT_APP_FAILURE
    assert completed.returncode == contract.EXIT_APP_FAILURE
    assert "absent" in str(details["reason"])


def test_sigterm_mid_training_saves_a_final_checkpoint_and_reports_preempted(
    tmp_path: Path, termination_log: Path
) -> None:
    store = tmp_path / "store"
    env = child_env(
        **{
            contract.ENV_CHECKPOINT_URI: store.as_uri(),
            contract.ENV_CHECKPOINT_PATH: str(tmp_path / "local"),
            contract.ENV_GRACE_SECONDS: "30",
        }
    )
    wrapper = subprocess.Popen(
        runtime_cmd(
            "exec",
            "--termination-log",
            str(termination_log),
            "--",
            sys.executable,
            str(EXAMPLES / "counter_training.py"),
            "--steps",
            "100000000",
            "--every",
            "1000000",
        ),
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert wrapper.stdout is not None
    assert wrapper.stdout.readline().startswith("resumed at 0")
    # "ready" follows the first commit, which happens at the first stop or every 1e6 steps;
    # stop right away instead: the loop must still save the state it stopped at.
    wrapper.send_signal(signal.SIGTERM)
    output = wrapper.stdout.read()
    assert wrapper.wait(timeout=60) == contract.EXIT_PREEMPTED
    stopped_at = int(output.split("stopped at ")[1].split()[0])
    verdict, details = parse_verdict_line(termination_log.read_text().strip())
    assert verdict == contract.VERDICT_PREEMPTED
    assert details["killed_after_grace"] is False

    from durapipe.runtime.checkpoint import Checkpoint

    restored = Checkpoint(store.as_uri(), path=tmp_path / "check").load_sync()
    assert restored is not None
    assert json.loads(restored.read_text())["step"] == stopped_at


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace_period(
    termination_log: Path,
) -> None:
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    wrapper = subprocess.Popen(
        runtime_cmd(
            "exec",
            "--grace-seconds",
            "0.5",
            "--termination-log",
            str(termination_log),
            "--",
            sys.executable,
            "-c",
            code,
        ),
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert wrapper.stdout is not None and wrapper.stdout.readline() == "ready\n"
    wrapper.send_signal(signal.SIGTERM)
    assert wrapper.wait(timeout=60) == contract.EXIT_PREEMPTED
    verdict, details = parse_verdict_line(termination_log.read_text().strip())
    assert verdict == contract.VERDICT_PREEMPTED
    assert details["killed_after_grace"] is True
    assert details["returncode"] == -signal.SIGKILL


def _exited_unreaped(pid: int, timeout: float = 60.0) -> bool:
    """Whether ``pid`` ends within ``timeout``, leaving it for its parent to reap."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize(("code", "verdict", "exit_code"), [
    ("pass", contract.VERDICT_SUCCESS, 0),
    ("import sys; sys.exit(3)", contract.VERDICT_APP_FAILURE, 3),
])
def test_a_stop_after_the_command_ended_leaves_its_verdict_alone(
    tmp_path: Path, code: str, verdict: str, exit_code: int
) -> None:
    # A SIGTERM that reaches the wrapper while it reports a finished command (a node drain a
    # moment too late): turning a success into a preemption would run the stage again.
    attempt = Supervisor([sys.executable, "-c", code], env=child_env(),
                      termination_log=tmp_path / "log", memory_cgroup=False)
    attempt.start()
    assert attempt.pid is not None and _exited_unreaped(attempt.pid)
    attempt.request_stop()
    assert not attempt.stop_requested
    result = attempt.wait()
    assert (result.verdict, result.exit_code) == (verdict, exit_code)
    assert parse_verdict_line((tmp_path / "log").read_text().strip())[0] == verdict


def test_a_stop_while_the_command_runs_is_a_preemption(tmp_path: Path) -> None:
    attempt = Supervisor([sys.executable, "-c", "import time; time.sleep(60)"], env=child_env(),
                      termination_log=tmp_path / "log", memory_cgroup=False)
    attempt.start()
    attempt.request_stop()
    assert attempt.stop_requested
    result = attempt.wait()
    assert (result.verdict, result.returncode) == (contract.VERDICT_PREEMPTED, -signal.SIGTERM)


class _NearlyFullCgroup(MemoryCgroup):
    """A cgroup whose working set always reads 95% of a 1 GiB limit."""

    def oom_kills(self) -> int | None:
        return 0

    def usage_bytes(self) -> int | None:
        return int(0.95 * (1 << 30))

    def limit_bytes(self) -> int | None:
        return 1 << 30


def test_memory_near_the_limit_is_announced_to_the_stage(tmp_path: Path) -> None:
    # The child waits (bounded) until the SDK reports memory pressure, then exits with what
    # it saw: the wrapper's warning reached it through the control directory.
    code = (
        "import json, sys, time\n"
        "from durapipe.runtime.sdk import memory_pressure\n"
        "for _ in range(3000):\n"
        "    seen = memory_pressure()\n"
        "    if seen: print(json.dumps(seen)); sys.exit(0)\n"
        "    time.sleep(0.01)\n"
        "sys.exit(5)\n"
    )
    output = tmp_path / "out"
    with open(output, "wb") as sink:
        attempt = Supervisor(
            [sys.executable, "-c", code],
            env=child_env(),
            termination_log=tmp_path / "log",
            memory_cgroup=_NearlyFullCgroup(tmp_path, 2),
            memory_poll_seconds=0.05,
            stderr_sink=sink,
        )
        attempt.start()
        result = attempt.wait()
    assert result.verdict == contract.VERDICT_SUCCESS
    assert result.details["memory_warnings"] == 1
    assert b"checkpoint now" in output.read_bytes()


def test_run_attempt_is_usable_in_process(tmp_path: Path) -> None:
    result = run_attempt(
        [sys.executable, "-c", "import sys; sys.exit(7)"],
        env=child_env(),
        termination_log=tmp_path / "log",
        memory_cgroup=False,
    )
    assert (result.verdict, result.exit_code, result.returncode) == (
        contract.VERDICT_APP_FAILURE,
        7,
        7,
    )


# -- classify: the decision table ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "verdict", "exit_code"),
    [
        ({"returncode": 0}, "success", 0),
        ({"returncode": 2}, "app_failure", 2),
        ({"returncode": -signal.SIGSEGV}, "app_failure", 128 + signal.SIGSEGV),
        ({"returncode": -signal.SIGKILL}, "app_failure", 1),
        ({"returncode": -signal.SIGKILL, "oom_kills_delta": 1}, "host_oom", 137),
        ({"returncode": 1, "oom_kills_delta": 2}, "host_oom", 137),
        ({"returncode": -signal.SIGKILL, "memory_limited": True}, "host_oom", 137),
        (
            {"returncode": -signal.SIGKILL, "memory_limited": True, "oom_kills_delta": 0},
            "app_failure",
            1,
        ),
        ({"returncode": 0, "stop_requested": True}, "preempted", 143),
        ({"returncode": -signal.SIGKILL, "stop_requested": True}, "preempted", 143),
        ({"returncode": 1, "stderr_tail": "RuntimeError: CUDA out of memory."}, "gpu_oom", 86),
        ({"returncode": 1, "reported_verdict": "gpu_oom"}, "gpu_oom", 86),
        ({"returncode": 0, "stderr_tail": "CUDA out of memory (recovered)"}, "success", 0),
        ({"returncode": 1, "stderr_tail": "MemoryError"}, "host_oom", 137),
    ],
)
def test_classify(kwargs: dict[str, object], verdict: str, exit_code: int) -> None:
    result = classify(**kwargs)  # type: ignore[arg-type]
    assert (result.verdict, result.exit_code) == (verdict, exit_code)
    assert result.verdict in contract.VERDICTS


def test_verdict_line_fits_the_termination_message_limit() -> None:
    line = verdict_line("app_failure", {"returncode": 1, "stderr_tail": "x" * 100_000})
    assert len(line.encode()) < contract.TERMINATION_MESSAGE_LIMIT
    verdict, details = parse_verdict_line(line)
    assert verdict == "app_failure"
    assert str(details["stderr_tail"]).endswith("xxx")
    assert "\n" not in line
