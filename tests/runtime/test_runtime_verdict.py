"""The verdict line: exactly one line, under 4 KiB in bytes whatever stderr held, at the start
of a line, and written however the wrapper ends."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from durapipe.runtime import contract
from durapipe.runtime.verdict import parse_verdict_line, verdict_line
from tests.runtime.runtime_helpers import child_env, runtime_cmd

LIMIT = contract.TERMINATION_MESSAGE_LIMIT


def _random_text(rng: random.Random, length: int) -> str:
    alphabets = ["abc xyz\n\t", "éüß€", "日本語の文字", "🙂🚀", "\x00\x1b\u2028\u2029\r", "\\\"'"]
    return "".join(rng.choice(rng.choice(alphabets)) for _ in range(length))


@pytest.mark.parametrize(
    "tail",
    [
        "é" * 5000,
        "日本" * 3000,
        "🙂" * 4000,
        "x" * 100_000,
        "\n" * 3000 + "the last line",
        "\\" * 5000,
    ],
    ids=["latin", "cjk", "emoji", "ascii", "newlines", "backslashes"],
)
def test_a_long_stderr_tail_of_any_text_is_shortened_in_bytes_not_emptied(tail: str) -> None:
    line = verdict_line("app_failure", {"returncode": 1, "stderr_tail": tail})
    assert len(line.encode()) < LIMIT
    assert "\n" not in line and "\r" not in line
    _, details = parse_verdict_line(line)
    kept = str(details["stderr_tail"])
    assert len(kept) > 200, "the tail was emptied instead of shortened"
    assert tail.endswith(kept)


def test_any_stderr_and_any_details_give_one_line_under_the_limit() -> None:
    rng = random.Random(15)
    for _ in range(300):
        details: dict[str, object] = {
            "returncode": rng.choice([0, 1, -9, None]),
            "reason": _random_text(rng, rng.choice([10, 3000, 9000])),
            "stderr_tail": _random_text(rng, rng.randint(0, 20_000)),
            "reported": {"message": _random_text(rng, rng.choice([5, 6000]))},
        }
        line = verdict_line("app_failure", details)
        assert len(line.encode()) < LIMIT
        assert len(line.splitlines()) == 1
        verdict, parsed = parse_verdict_line(line)
        assert verdict == "app_failure" and "returncode" in parsed


def test_the_verdict_starts_a_line_after_stderr_that_does_not_end_with_one(
    termination_log: Path,
) -> None:
    completed = subprocess.run(
        runtime_cmd("exec", "--termination-log", str(termination_log), "--", sys.executable,
                    "-c", "import sys; sys.stderr.write('abc'); sys.exit(3)"),
        env=child_env(), capture_output=True, text=True, timeout=60, check=False,
    )
    assert completed.returncode == 3
    lines = completed.stderr.splitlines()
    assert "abc" in lines
    assert [ln for ln in lines if ln.startswith(contract.VERDICT_TAG)]
    assert not [ln for ln in lines if contract.VERDICT_TAG in ln and not ln.startswith("durapipe")]


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--", sys.executable, "-c", "pass"], {contract.ENV_OUTPUTS: "{not json"}),
        (["--", sys.executable, "-c", "pass"], {contract.ENV_OUTPUTS: '["a list"]'}),
        (["--"], {}),
        (["--grace-seconds", "soon", "--", "true"], {}),
        (["--", sys.executable, "-c", "pass"], {contract.ENV_GRACE_SECONDS: "soon"}),
    ],
    ids=["outputs-not-json", "outputs-not-an-object", "no-command", "bad-option", "bad-grace"],
)
def test_every_way_the_wrapper_can_end_writes_one_verdict(
    args: list[str], env: dict[str, str], termination_log: Path
) -> None:
    completed = subprocess.run(
        runtime_cmd("exec", "--termination-log", str(termination_log), *args),
        env=child_env(**env), capture_output=True, text=True, timeout=60, check=False,
    )
    assert completed.returncode == contract.EXIT_USAGE
    lines = termination_log.read_text().splitlines()
    assert len(lines) == 1
    verdict, details = parse_verdict_line(lines[0])
    assert verdict == contract.VERDICT_APP_FAILURE and details["reason"]
    assert [ln for ln in completed.stderr.splitlines() if ln == lines[0]]
