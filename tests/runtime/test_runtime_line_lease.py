"""Two runs on one checkpoint line (lines keyed by a stage's inputs): the writer's lease.

A run takes the line at once from its own run's zombie, from a run that stopped cleanly, and
from a dead run once its lease is stale; it waits about one lease for another run whose lease
is live, then fails with ``LineBusy``.  Real time, real processes where a kill matters, a
2 s lease.  Rows of docs/runtime.md's guarantees table.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from durapipe.runtime import contract
from durapipe.runtime.checkpoint import Checkpoint
from durapipe.runtime.claim import (
    BEAT_SUFFIX,
    CLAIM_SUFFIX,
    WAIT_LEASES,
    WRITER_DIR,
    beat_key,
    claim_key,
)
from durapipe.runtime.errors import LineBusy
from durapipe.runtime.restore import restore_newest
from durapipe.runtime.store import Store, open_store
from durapipe.runtime.verdict import parse_verdict_line
from tests.runtime.runtime_helpers import child_env, runtime_cmd, start_with_setting
from tests.runtime.test_runtime_hostile_lines import make_state, restored_step

LEASE = 2.0
#: The longest a refusal may take: the wait (WAIT_LEASES leases) and room for a busy machine.
REFUSED_WITHIN = LEASE * WAIT_LEASES + 5.0
LEASE_WRITER = Path(__file__).with_name("lease_writer.py")


def run_env(run: str, pod: str = "") -> dict[str, str]:
    env = {contract.ENV_RUN_ID: run, contract.ENV_LINE_LEASE: f"{LEASE:g}"}
    if pod:
        env[contract.ENV_POD_NAME] = pod
    return env


def writer(uri: str, local: Path, run: str) -> Checkpoint:
    """A writer of ``run`` in this process."""
    return Checkpoint(uri, path=local, spool_dir=local / "spool", keep=2, env=run_env(run))


def s3_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("AWS_")}


class WriterProcess:
    """A writer of one run in a process of its own (``lease_writer.py``), driven on stdin."""

    def __init__(self, uri: str, local: Path, run: str, pod: str = "") -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(LEASE_WRITER), uri, str(local)],
            env=child_env(**s3_env(), **run_env(run, pod)),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self._next(60) == "ready"

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.strip())
        self._lines.put("<eof>")

    def _next(self, timeout: float) -> str:
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the writer did not answer within {timeout} s") from None

    def ask(self, command: str, timeout: float = 60) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self._next(timeout)

    def end(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)


def writer_keys(store: Store, suffix: str) -> list[str]:
    return [key for key in store.list(WRITER_DIR) if key.endswith(suffix)]


def beat_time(store: Store) -> float:
    """The writer's time in the line's only beat."""
    (key,) = writer_keys(store, BEAT_SUFFIX)
    return float(json.loads(store.get_bytes(key))["beat"])


def test_a_second_run_meets_a_live_first_run_and_is_refused_after_one_lease(
    store_uri: str, tmp_path: Path
) -> None:
    first = WriterProcess(store_uri, tmp_path / "a", "run-a", pod="pipe-train-a")
    try:
        assert first.ask("save 1") == "ok committed 1"
        second = writer(store_uri, tmp_path / "b", "run-b")
        began = time.monotonic()
        with pytest.raises(LineBusy) as refused:
            second.save_sync(make_state(tmp_path / "s2", 2))
        waited = time.monotonic() - began
        # It waited for the lease to lapse (a writer killed a moment ago would have), no more.
        assert LEASE <= waited <= REFUSED_WITHIN, waited
        message = str(refused.value)
        for part in ("another run still holds this checkpoint line", "run run-a",
                     "pod pipe-train-a", f"on {socket.gethostname()}", "renewed its lease",
                     "wait for run run-a to finish", 'checkpoint { scope = "run" }'):
            assert part in message, (part, message)
        # The first run was not disturbed: it still commits, and its state is the line's.
        assert first.ask("save 3") == "ok committed 2"
        restored = restore_newest(open_store(store_uri), tmp_path / "reader")
        assert restored is not None
        assert json.loads((restored.path / "step.json").read_text()) == {"step": 3}
    finally:
        first.end()


def test_a_sigkilled_run_frees_the_line_when_its_lease_runs_out(tmp_path: Path) -> None:
    uri = (tmp_path / "store").as_uri()
    store = open_store(uri)
    first = WriterProcess(uri, tmp_path / "a", "run-a")
    try:
        assert first.ask("save 1") == "ok committed 1"
        time.sleep(LEASE / 2)  # a few beats: the lease is renewed, not just the first beat
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=30)
    finally:
        first.end()
    last_beat = beat_time(store)
    second = writer(uri, tmp_path / "b", "run-b")
    began = time.monotonic()
    commit = second.save_sync(make_state(tmp_path / "s2", 2))
    taken = time.time()
    assert commit is not None and commit.seq == 2
    # Not before the dead run's lease ran out, and within about one lease of the kill.
    assert taken >= last_beat + LEASE
    assert time.monotonic() - began <= REFUSED_WITHIN
    second.close()
    assert restored_step(uri, tmp_path / "reader") == 2


def test_a_run_that_stalls_past_its_lease_loses_the_line_and_cannot_commit_after(
    tmp_path: Path,
) -> None:
    """SIGSTOP: the writer lives but stops renewing (a stalled node); once its lease is stale
    another run takes the line, and the first, resumed, is refused at its next commit."""
    uri = (tmp_path / "store").as_uri()
    first = WriterProcess(uri, tmp_path / "a", "run-a")
    try:
        assert first.ask("save 1") == "ok committed 1"
        first.process.send_signal(signal.SIGSTOP)
        second = writer(uri, tmp_path / "b", "run-b")
        began = time.monotonic()
        assert second.save_sync(make_state(tmp_path / "s2", 2)) is not None
        assert time.monotonic() - began <= REFUSED_WITHIN
        first.process.send_signal(signal.SIGCONT)
        answer = first.ask("save 3")
        assert answer.startswith("refused LineTakenOver: another writer took over"), answer
        assert "run run-b found this writer's lease stale" in answer, answer
        assert second.save_sync(make_state(tmp_path / "s4", 4)) is not None
        second.close()
        assert restored_step(uri, tmp_path / "reader") == 4
    finally:
        first.end()


@pytest.mark.parametrize("stop", ["close", "exit"])
def test_a_run_that_stopped_cleanly_frees_the_line_at_once(stop: str, tmp_path: Path) -> None:
    """``close()``, or a script that simply ends (the exit hook): no beat is left, and another
    run takes the line without waiting for a lease."""
    uri = (tmp_path / "store").as_uri()
    store = open_store(uri)
    first = WriterProcess(uri, tmp_path / "a", "run-a")
    try:
        assert first.ask("save 1") == "ok committed 1"
        assert len(writer_keys(store, BEAT_SUFFIX)) == 1
        if stop == "close":
            assert first.ask("close") == "ok closed"
        else:
            assert first.ask("exit") == "<eof>"
            assert first.process.wait(timeout=30) == 0
        assert writer_keys(store, BEAT_SUFFIX) == []
        second = writer(uri, tmp_path / "b", "run-b")
        began = time.monotonic()
        assert second.load_sync() is not None  # the restore claims the line
        assert second.save_sync(make_state(tmp_path / "s2", 2)) is not None
        assert time.monotonic() - began < LEASE
    finally:
        first.end()


def test_a_new_attempt_of_the_same_run_takes_over_its_beating_zombie_at_once(
    tmp_path: Path,
) -> None:
    uri = (tmp_path / "store").as_uri()
    store = open_store(uri)
    zombie = WriterProcess(uri, tmp_path / "a", "run-a")
    try:
        assert zombie.ask("save 1") == "ok committed 1"
        retry = writer(uri, tmp_path / "b", "run-a")
        began = time.monotonic()
        assert retry.load_sync() is not None
        assert retry.save_sync(make_state(tmp_path / "s2", 2)) is not None
        assert time.monotonic() - began < LEASE
        answer = zombie.ask("save 3")
        assert answer.startswith("refused LineTakenOver: another writer took over"), answer
        assert "a zombie of an earlier attempt" in answer, answer
        # The zombie, still alive, stopped renewing: only the retry's beat is left.
        time.sleep(LEASE / 2)
        (claim,) = writer_keys(store, CLAIM_SUFFIX)
        assert writer_keys(store, BEAT_SUFFIX) == [claim.removesuffix(CLAIM_SUFFIX) + BEAT_SUFFIX]
    finally:
        zombie.end()


STAGE = """
import durapipe.runtime as runtime
checkpoint = runtime.context().checkpoint
checkpoint.load()
print("training started", flush=True)
"""


def test_a_run_whose_line_another_live_run_holds_fails_at_restore_before_training(
    tmp_path: Path,
) -> None:
    """The first run has only restored (no commit yet: the restore claimed the line); a
    second run's stage, under the wrapper, fails in its restore with the message, no
    traceback, and never starts training."""
    uri = (tmp_path / "store").as_uri()
    store = open_store(uri)
    first = WriterProcess(uri, tmp_path / "a", "run-a", pod="pipe-train-a")
    termination_log = tmp_path / "termination-log"
    try:
        assert first.ask("load") == "ok loaded None"
        env = child_env(**run_env("run-b"), **{
            contract.ENV_CHECKPOINT_URI: uri,
            contract.ENV_CHECKPOINT_PATH: str(tmp_path / "b"),
        })
        began = time.monotonic()
        stage = subprocess.run(
            runtime_cmd("exec", "--termination-log", str(termination_log), "--",
                        sys.executable, "-c", STAGE),
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )
        waited = time.monotonic() - began
    finally:
        first.end()
    assert stage.returncode == contract.EXIT_APP_FAILURE, stage.stderr
    assert "training started" not in stage.stdout
    assert "Traceback" not in stage.stderr, stage.stderr
    assert "durapipe: another run still holds this checkpoint line: run run-a (pod " \
        "pipe-train-a" in stage.stderr, stage.stderr
    assert LEASE <= waited <= REFUSED_WITHIN + 10, waited  # + the interpreters' start
    verdict, details = parse_verdict_line(termination_log.read_text().strip())
    assert verdict == contract.VERDICT_APP_FAILURE
    reported = details["reported"]
    assert isinstance(reported, dict)
    assert reported["exception"] == "durapipe.runtime.errors.LineBusy"
    assert 'checkpoint { scope = "run" }' in reported["message"]
    assert len(writer_keys(store, CLAIM_SUFFIX)) == 1  # the refused run claimed nothing


def test_the_upload_agent_holds_the_line_from_its_start_and_releases_it_at_exit(
    tmp_path: Path,
) -> None:
    uri = (tmp_path / "store").as_uri()
    store = open_store(uri)
    spool = tmp_path / "spool"
    agent = subprocess.Popen(
        runtime_cmd("agent", "--spool", str(spool), "--uri", uri, "--poll-seconds", "0.02"),
        env=child_env(**run_env("run-a", pod="pipe-train-a"),
                      **{contract.ENV_GRACE_SECONDS: "20"}),
    )
    try:
        deadline = time.monotonic() + 60
        while not writer_keys(store, BEAT_SUFFIX):  # claimed before any save
            assert time.monotonic() < deadline, "the agent did not claim the line"
            time.sleep(0.05)
        first_beat = beat_time(store)
        time.sleep(LEASE / 2)
        assert beat_time(store) > first_beat  # renewed while it lives
        # Its own trainer (sidecar mode, same run) restores without waiting and claims
        # nothing; its saves are committed under the agent's claim.
        trainer = Checkpoint(uri, path=tmp_path / "t", spool_dir=spool, uploader="sidecar",
                             env=run_env("run-a"))
        began = time.monotonic()
        assert trainer.load_sync() is None
        assert time.monotonic() - began < LEASE
        handle = trainer.save(make_state(tmp_path / "s1", 1))
        commit = handle.wait(timeout=60)
        assert commit is not None and commit.seq == 1
        assert len(writer_keys(store, CLAIM_SUFFIX)) == 1
        # Another run is refused while the agent lives ...
        with pytest.raises(LineBusy, match="run run-a .pod pipe-train-a"):
            writer(uri, tmp_path / "b", "run-b").load_sync()
    finally:
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == 0
    # ... and takes the line at once once it has exited.
    assert writer_keys(store, BEAT_SUFFIX) == []
    began = time.monotonic()
    restored = writer(uri, tmp_path / "c", "run-c").load_sync()
    assert restored is not None
    assert json.loads((restored / "step.json").read_text()) == {"step": 1}
    assert time.monotonic() - began < LEASE


@pytest.mark.parametrize("reader", ["sdk", "agent"])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_lease_that_is_not_a_positive_number_of_seconds_is_refused(
    value: str, reader: str, tmp_path: Path
) -> None:
    """As a bad grace period is: one line naming the variable, exit 64, no traceback (a zero
    lease would let any run take a live writer's line, an infinite one never free it)."""
    completed = start_with_setting(reader, contract.ENV_LINE_LEASE, value, tmp_path)
    assert completed.returncode == contract.EXIT_USAGE
    assert "ran" not in completed.stdout
    errors = [line for line in completed.stderr.splitlines() if contract.ENV_LINE_LEASE in line]
    assert len(errors) == 1 and "is not a lease" in errors[0], completed.stderr
    assert "Traceback" not in completed.stderr
    assert contract.line_lease_from_env({}) == contract.DEFAULT_LINE_LEASE_SECONDS


def plant_holder(store: Store, run: str, beat: float | None) -> None:
    """A claim of ``run`` whose writer is gone, its last beat stamped ``beat`` by its clock."""
    store.put_bytes(claim_key(1, "dead"), json.dumps(
        {"claimed": time.time(), "host": "node-7", "pid": 1, "pod": "p", "run": run}).encode())
    if beat is not None:
        store.put_bytes(beat_key(1, "dead"), json.dumps({"beat": beat}).encode())


def test_a_beat_older_than_the_lease_is_taken_over_at_once(tmp_path: Path) -> None:
    uri = (tmp_path / "store").as_uri()
    plant_holder(open_store(uri), "run-a", time.time() - 10 * LEASE)
    began = time.monotonic()
    assert writer(uri, tmp_path / "b", "run-b").load_sync() is None
    assert time.monotonic() - began < LEASE


def test_a_dead_writer_whose_clock_ran_ahead_loses_its_lease_once_its_beat_stops_changing(
    tmp_path: Path,
) -> None:
    """Its last beat says an hour from now (its clock was ahead of ours): by the clock it
    looks live, but a beat that does not change for a lease while we watch is a dead one."""
    uri = (tmp_path / "store").as_uri()
    plant_holder(open_store(uri), "run-a", time.time() + 3600)
    began = time.monotonic()
    assert writer(uri, tmp_path / "b", "run-b").load_sync() is None
    assert LEASE <= time.monotonic() - began <= REFUSED_WITHIN


def test_only_node_0s_agent_of_a_multi_node_stage_claims_the_line(tmp_path: Path) -> None:
    """Every pod of a JobSet has an upload agent; only node 0's trainer holds global rank 0
    and writes. Another node's agent claiming the line (the same run: taken over at once)
    would fence node 0's out, as the real node's two-pod JobSet showed (a third claim)."""
    uri = (tmp_path / "store").as_uri()
    store = open_store(uri)
    agents = {}
    for node in ("1", "0"):
        agents[node] = subprocess.Popen(
            runtime_cmd("agent", "--spool", str(tmp_path / f"spool-{node}"), "--uri", uri,
                        "--poll-seconds", "0.02"),
            env=child_env(**run_env("run-a", pod=f"pretrain-{node}"),
                          **{contract.ENV_GRACE_SECONDS: "20",
                             contract.ENV_JOB_COMPLETION_INDEX: node}))
    try:
        deadline = time.monotonic() + 60
        while not writer_keys(store, CLAIM_SUFFIX):
            assert time.monotonic() < deadline, "node 0's agent did not claim the line"
            time.sleep(0.05)
        time.sleep(LEASE)  # time enough for node 1's agent to have claimed, had it
        (claim,) = writer_keys(store, CLAIM_SUFFIX)
        assert json.loads(store.get_bytes(claim))["pod"] == "pretrain-0"
    finally:
        for agent in agents.values():
            agent.send_signal(signal.SIGTERM)
        for agent in agents.values():
            assert agent.wait(timeout=60) == 0
