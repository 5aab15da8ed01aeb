"""The preemption race the real node found: the kubelet signals the main container and the
upload sidecar at the same moment, and a trainer that finishes its training step before its
final save stages that save after the agent got its SIGTERM.  The agent must wait for it while
the main container's wrapper still beats (``durapipe.runtime.mainbeat``): before, it left at
its first idle poll, the save never reached the store, and the trainer's ``close()`` held the
pod for the whole grace period."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from durapipe.runtime import contract
from durapipe.runtime.mainbeat import MAIN_BEAT_FILE, STALE_SECONDS
from tests.runtime.runtime_helpers import child_env, runtime_cmd
from tests.runtime.test_runtime_checkpoint import start_agent, wait_for_heartbeat
from tests.runtime.test_runtime_hostile_lines import new_checkpoint

#: The trainer: saves a step every 0.1 s; on SIGTERM it finishes a 1.5 s step, then saves its
#: final state and closes, as a real training loop does between two steps.
TRAINER = """
import json, signal, sys, time
from durapipe.runtime.checkpoint import Checkpoint
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
cp = Checkpoint.from_env()
step = 0
print("ready", flush=True)
while not stop:
    step += 1
    cp.save(json.dumps({"step": step}).encode(), metadata={"step": step})
    time.sleep(0.1)
time.sleep(1.5)
step += 1
cp.save(json.dumps({"step": step}).encode(), metadata={"step": step})
cp.close()
print(f"final {step}", flush=True)
"""

GRACE = 30


def test_the_agent_commits_a_final_save_staged_after_its_own_sigterm(tmp_path: Path) -> None:
    uri = (tmp_path / "store").as_uri()
    spool = tmp_path / "spool"
    env = child_env(**{contract.ENV_GRACE_SECONDS: str(GRACE)})
    agent = start_agent(spool, uri, env)
    main = None
    try:
        wait_for_heartbeat(spool)
        main_env = dict(env, **{contract.ENV_CHECKPOINT_URI: uri,
                                contract.ENV_CHECKPOINT_PATH: str(tmp_path / "work"),
                                contract.ENV_SPOOL_DIR: str(spool),
                                contract.ENV_UPLOADER: "sidecar"})
        script = tmp_path / "trainer.py"
        script.write_text(TRAINER)
        main = subprocess.Popen(
            runtime_cmd("exec", "--termination-log", str(tmp_path / "termination-log"), "--",
                        sys.executable, str(script)),
            env=main_env, stdout=subprocess.PIPE, text=True)
        assert main.stdout is not None and main.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        assert (spool / MAIN_BEAT_FILE).exists(), "the wrapper does not beat"
        # The kubelet's SIGTERM, to both containers at once.
        t0 = time.monotonic()
        main.send_signal(signal.SIGTERM)
        agent.send_signal(signal.SIGTERM)
        out, _ = main.communicate(timeout=GRACE + 30)
        main_took = time.monotonic() - t0
        assert agent.wait(timeout=GRACE + 30) == 0
        agent_took = time.monotonic() - t0
    finally:
        for process in (agent, main):
            if process is not None and process.poll() is None:
                process.kill()
    assert "final " in out, f"the trainer's close() failed after {main_took:.1f} s: {out!r}"
    final = int(out.split("final ")[-1])
    restored = new_checkpoint(uri, tmp_path / "restored").load_sync()
    assert restored is not None
    assert json.loads(restored.read_text()) == {"step": final}, "the final save was lost"
    # Both end once the final save is committed: well inside the grace period, and not
    # before the trainer's 1.5 s step.
    assert 1.5 <= main_took < GRACE / 3, main_took
    assert agent_took < main_took + STALE_SECONDS, (agent_took, main_took)
    assert not (spool / MAIN_BEAT_FILE).exists(), "the wrapper left its beat behind"


def test_a_killed_wrappers_beat_holds_the_agent_only_until_it_is_stale(tmp_path: Path) -> None:
    """A wrapper killed outright (SIGKILL, an OOM kill of the container) leaves its beat: the
    agent waits for it to go stale, not for the whole grace period."""
    uri = (tmp_path / "store").as_uri()
    spool = tmp_path / "spool"
    agent = start_agent(spool, uri, child_env(**{contract.ENV_GRACE_SECONDS: str(GRACE)}))
    try:
        wait_for_heartbeat(spool)
        (spool / MAIN_BEAT_FILE).write_text("{}")  # the last beat of a wrapper just killed
        t0 = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=GRACE + 30) == 0
        took = time.monotonic() - t0
    finally:
        if agent.poll() is None:
            agent.kill()
    assert STALE_SECONDS - 1 <= took < STALE_SECONDS + 5, took
