"""The grace period and the deadlines derived from it (docs/runtime.md, "Deadlines").

A grace period that is not a positive finite number is refused by every reader (wrapper, SDK,
agent) as a usage error, exit 64.  Every wait of a checkpoint operation (a restore, a save's
``wait()``, ``flush()``, the exit hook) ends by that operation's one deadline, measured here on
the real clock against a real silent store: a TCP server on 127.0.0.1 that accepts and never
answers, as the S3 endpoint of obstore and of the stdlib client.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from durapipe.runtime import checkpoint as cp
from durapipe.runtime import contract
from durapipe.runtime.wrapper import parse_verdict_line, run_attempt
from tests.runtime.runtime_helpers import child_env, runtime_cmd

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
    store = (tmp_path / "store").as_uri()
    if reader == "sdk":
        command = [sys.executable, "-c",
                   "from durapipe import runtime\nruntime.context()\nprint('ran')"]
    else:
        command = runtime_cmd("agent", "--spool", str(tmp_path / "spool"), "--uri", store)
    env = child_env(**{contract.ENV_GRACE_SECONDS: value, contract.ENV_CHECKPOINT_URI: store})
    # Before: the SDK took 30 s instead, and the agent ran (it would have waited for work).
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30,
                               check=False)
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
