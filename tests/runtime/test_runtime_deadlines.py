"""The grace period and the deadlines derived from it (docs/runtime.md, "Deadlines").

A grace period that is not a positive finite number is refused by every reader (wrapper, SDK,
agent) as a usage error, exit 64.  Every wait of a checkpoint operation (a restore, a save's
``wait()``, ``flush()``, the exit hook) ends by that operation's one deadline, measured here on
the real clock against a real silent store: a TCP server on 127.0.0.1 that accepts and never
answers, as the S3 endpoint of obstore and of the stdlib client.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durapipe.runtime import checkpoint as cp
from durapipe.runtime import contract
from durapipe.runtime.deadline import GRACE_MARGIN, RUNNING_BOUND_FACTOR
from durapipe.runtime.verdict import parse_verdict_line
from durapipe.runtime.wrapper import run_attempt
from tests.runtime.conftest import S3_CREDENTIALS
from tests.runtime.faults import SilentServer
from tests.runtime.runtime_helpers import child_env, runtime_cmd, start_with_setting

#: Zero or less (the wrapper would SIGKILL at once), not a number, infinite, or so large that
#: the kill timer and the bounded waits overflow.
BAD_GRACE = ["-5", "0", "nan", "inf", "-inf", "1e300"]


# -- refusing a grace period that is not a positive finite number -------------------------------


@pytest.mark.parametrize("value", BAD_GRACE)
@pytest.mark.parametrize("given_as", ["option", "environment", "in-process"])
def test_the_wrapper_refuses_a_grace_period_that_is_not_positive_and_finite(
    value: str, given_as: str, tmp_path: Path, termination_log: Path
) -> None:
    ran = tmp_path / "ran"
    command = [sys.executable, "-c", f"open({str(ran)!r}, 'w').close()"]
    if given_as == "in-process":
        result = run_attempt(command, grace_seconds=float(value), env=child_env(),
                             termination_log=termination_log, stderr_sink=None,
                             memory_cgroup=False)
        exit_code, stderr = result.exit_code, ""
    else:
        option = ["--grace-seconds", value] if given_as == "option" else []
        env = {contract.ENV_GRACE_SECONDS: value} if given_as == "environment" else {}
        completed = subprocess.run(
            runtime_cmd("exec", "--termination-log", str(termination_log), *option, "--",
                        *command),
            env=child_env(**env), capture_output=True, text=True, timeout=60, check=False,
        )
        exit_code, stderr = completed.returncode, completed.stderr
    assert exit_code == contract.EXIT_USAGE
    assert not ran.exists(), "the command ran with a grace period that kills it at once"
    (line,) = termination_log.read_text().splitlines()
    verdict, details = parse_verdict_line(line)
    assert verdict == contract.VERDICT_APP_FAILURE and "grace" in details["reason"]
    assert "Traceback" not in stderr


@pytest.mark.parametrize("value", ["-5", "0", "nan", "inf"])
@pytest.mark.parametrize("reader", ["sdk", "agent"])
def test_the_sdk_and_the_agent_refuse_a_grace_period_that_is_not_positive_and_finite(
    value: str, reader: str, tmp_path: Path
) -> None:
    # Before: the SDK took 30 s instead, and the agent ran (it would have waited for work).
    completed = start_with_setting(reader, contract.ENV_GRACE_SECONDS, value, tmp_path)
    assert completed.returncode == contract.EXIT_USAGE
    assert "ran" not in completed.stdout
    errors = [line for line in completed.stderr.splitlines() if contract.ENV_GRACE_SECONDS in line]
    assert len(errors) == 1 and "grace period" in errors[0]
    assert "Traceback" not in completed.stderr


def test_a_checkpoint_refuses_a_grace_period_that_is_not_positive_and_finite(
    tmp_path: Path,
) -> None:
    for value in (-5.0, 0.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="grace period"):
            cp.Checkpoint((tmp_path / "store").as_uri(), path=tmp_path / "w",
                          grace_seconds=value)


# -- every wait ends by its operation's deadline ------------------------------------------------

#: 60 grace periods: a 6 s bound on a wait before any stop request.
SHORT_GRACE = 0.1
BOUND = RUNNING_BOUND_FACTOR * SHORT_GRACE
#: After a stop request: the grace period less GRACE_MARGIN (3 s here).
STOP_GRACE = 5.0
#: What a wait may overrun its deadline by on a loaded 2-core machine (polling, thread start).
SLACK = 2.0


@pytest.fixture(params=["obstore", "stdlib"])
def silent_s3_uri(request: pytest.FixtureRequest,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An S3 URI whose endpoint accepts connections and never answers, for each client."""
    if request.param == "obstore":
        pytest.importorskip("obstore", reason="obstore is the S3 client; it is in the test extra")
    with SilentServer() as server:
        for name, value in dict(S3_CREDENTIALS, AWS_ENDPOINT_URL=server.endpoint).items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv(contract.ENV_STORE_CLIENT, request.param)
        yield "s3://silent-bucket/runs/r1/stages/train"
        assert server.accepted, "the client never reached the silent store"


def timed(action: Any, timeout: float) -> tuple[float, Any]:
    """Run ``action`` on a daemon thread: (seconds it took, its result or exception); fails
    when it is still running after ``timeout``."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = action()
        except BaseException as error:  # noqa: BLE001 (handed to the test)
            box["value"] = error

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"still waiting after {timeout} s"
    return time.monotonic() - started, box.get("value")


def request_stop_in(control: Path, seconds: float) -> None:
    """Touch the wrapper's stop file ``seconds`` from now, as the wrapper does on SIGTERM."""
    timer = threading.Timer(seconds, (control / contract.CONTROL_STOP_FILE).touch)
    timer.daemon = True
    timer.start()


def test_a_restore_against_a_store_that_never_answers_ends_by_its_bound(
    silent_s3_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: 201 s (obstore) / 301 s (stdlib client) whatever the bound.
    monkeypatch.setenv(contract.ENV_GRACE_SECONDS, str(SHORT_GRACE))
    checkpoint = cp.Checkpoint(silent_s3_uri, path=tmp_path / "w")
    elapsed, outcome = timed(checkpoint.load, BOUND + 30)
    assert isinstance(outcome, cp.CheckpointDeadlineExceeded), outcome
    assert BOUND - 0.5 <= elapsed < BOUND + SLACK
    assert "restore" in str(outcome) and not (tmp_path / "w" / "restored").exists()


def test_a_stop_during_a_restore_ends_it_by_the_stop_deadline(
    silent_s3_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control = tmp_path / "control"
    control.mkdir()
    monkeypatch.setenv(contract.ENV_CONTROL_DIR, str(control))
    monkeypatch.setenv(contract.ENV_GRACE_SECONDS, str(STOP_GRACE))  # 300 s before a stop
    checkpoint = cp.Checkpoint(silent_s3_uri, path=tmp_path / "w")
    request_stop_in(control, 1.0)
    elapsed, outcome = timed(checkpoint.load, 30)
    assert isinstance(outcome, cp.CheckpointDeadlineExceeded), outcome
    stop_deadline = 1.0 + STOP_GRACE - GRACE_MARGIN
    assert stop_deadline - 0.5 <= elapsed < stop_deadline + SLACK


def test_a_stop_during_a_wait_ends_it_by_the_stop_deadline(
    silent_s3_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control = tmp_path / "control"
    control.mkdir()
    monkeypatch.setenv(contract.ENV_CONTROL_DIR, str(control))
    monkeypatch.setenv(contract.ENV_GRACE_SECONDS, str(STOP_GRACE))
    checkpoint = cp.Checkpoint(silent_s3_uri, path=tmp_path / "w")
    handle = checkpoint.save(b"final state")
    request_stop_in(control, 1.0)
    # Before: the wait kept the 300 s bound it computed when it began.
    elapsed, outcome = timed(handle.wait, 30)
    with contextlib.suppress(cp.CheckpointError):
        checkpoint.close()  # the upload thread stops retrying
    assert isinstance(outcome, cp.CheckpointDeadlineExceeded), outcome
    stop_deadline = 1.0 + STOP_GRACE - GRACE_MARGIN
    assert stop_deadline - 0.5 <= elapsed < stop_deadline + SLACK


EXITING_TRAINER = """\
import sys, time
from durapipe.runtime import checkpoint as cp
checkpoint = cp.Checkpoint(sys.argv[1], path=sys.argv[2])
handle = checkpoint.save(b"state")
print("handed-over", time.monotonic(), flush=True)
try:
    handle.wait()
except cp.CheckpointDeadlineExceeded:
    print("wait-ended", time.monotonic(), flush=True)
# The script ends without close(): the exit hook flushes what is not committed.
"""


def test_the_exit_hook_waits_only_for_what_is_left_of_the_bound(
    silent_s3_uri: str, tmp_path: Path
) -> None:
    env = child_env(**{contract.ENV_GRACE_SECONDS: str(SHORT_GRACE),
                       contract.ENV_STORE_CLIENT: os.environ[contract.ENV_STORE_CLIENT]})
    trainer = subprocess.Popen(
        [sys.executable, "-c", EXITING_TRAINER, silent_s3_uri, str(tmp_path / "w")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        out, err = trainer.communicate(timeout=2 * BOUND + 30)
    finally:
        trainer.kill()
    exited = time.monotonic()  # CLOCK_MONOTONIC is the machine's, shared with the child
    times = dict(line.split() for line in out.splitlines())
    handed_over, wait_ended = float(times["handed-over"]), float(times["wait-ended"])
    assert BOUND - 0.5 <= wait_ended - handed_over < BOUND + SLACK
    # Before: the exit hook began a second full bound (exit at twice the bound).
    assert exited - handed_over < BOUND + SLACK + 1.0, err
    assert "not committed within" in err

