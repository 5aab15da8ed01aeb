"""SIGKILL at random points of save, commit, upload and agent hand-over, on every store.

One harness for the CI test (a fixed seed, a few dozen kills) and for the soak
(``python benchmarks/runtime_checkpoint.py --soak``, a thousand).  Four checkpoint lines, one
writer each: {local, s3} x {in-process upload thread, sidecar agent}.  Each round forks a
trainer from a pre-imported zygote, lets it save for a random moment and SIGKILLs it; on the
sidecar lines the agent is killed too in a quarter of the rounds (before or after the
trainer) and a fresh one started.  After every round:

- **torn**: the newest manifest does not restore, or restores something that is not one
  whole state (files of different steps), or load() answers an older commit;
- **lost**: the restored step is older than a step whose ``wait()`` had returned, or (sidecar,
  once a live agent has drained the spool) older than a step whose ``save()`` had returned.

With ``collector=True`` a checkpoint collector runs too (``checkpoints gc`` with ``max_age``
0, so every line is old enough), in passes one after another from its own forked process,
SIGKILLed at a random moment of each round: the writers' lines are claimed by a run that has
not finished, so the collector must keep them whatever it is doing; beside them, lines of
finished runs are written every few rounds, which it must remove. After every round (the
collector dead) each of those still there must restore (**dangling**: a manifest left without
its blobs); at the end one pass that is not killed must leave none of them.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from durapipe.runtime.checkpoint import CheckpointError, restore_newest
from durapipe.runtime.manifest import MANIFEST_DIR
from durapipe.runtime.spool import pending_requests
from durapipe.runtime.store import Store, open_store

ZYGOTE = Path(__file__).with_name("fault_zygote.py")
FROZEN = b"frozen-embedding" * 4096
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Line:
    """One checkpoint line and its single writer."""

    name: str
    uri: str
    uploader: str
    root: Path
    store: Store
    agent: int | None = None
    acked: int = 0  # newest step whose wait() returned
    handed: int = 0  # newest step whose save() returned
    seq: int = 0
    landed: int = 0  # rounds that ended with a newer commit

    @property
    def spool(self) -> Path:
        return self.root / "spool"


@dataclass
class Counts:
    kills: Counter[str] = field(default_factory=Counter)
    torn: int = 0
    lost: int = 0
    dangling: int = 0
    #: Lines of finished runs written, and removed by the collector while it was being killed.
    finished_lines: int = 0
    collected: int = 0
    problems: list[str] = field(default_factory=list)
    landed: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        kills = ", ".join(f"{name} {count}" for name, count in sorted(self.kills.items()))
        return (
            f"{sum(self.kills.values())} kills ({kills}); "
            f"rounds with a new commit: {dict(sorted(self.landed.items()))}; "
            f"{self.torn} torn, {self.lost} lost"
            + (f", {self.dangling} dangling; {self.collected} of {self.finished_lines} lines "
               "of finished runs collected" if self.finished_lines else "")
        )


def newest_seq(store: Store) -> int | None:
    seqs = [int(k.rsplit("/", 1)[1].split(".")[0]) for k in store.list(MANIFEST_DIR)]
    return max(seqs) if seqs else None


def consistent_step(path: Path, metadata: dict[str, object]) -> int:
    step = int(json.loads((path / "step.json").read_text())["step"])
    if metadata != {"step": step}:
        raise ValueError(f"metadata {metadata} but step {step}")
    weights = (path / "shards" / "weights.bin").read_bytes()
    if weights != step.to_bytes(8, "little") * (len(weights) // 8):
        raise ValueError(f"weights are not all of step {step}")
    if (path / "frozen.bin").read_bytes() != FROZEN:
        raise ValueError("frozen.bin differs")
    return step


#: The run the writers' claims name when a collector runs: one that has not finished.
WRITERS_RUN = "crash-run"
#: The lease of writers and collector then: a killed collector's claim on a line it was
#: removing lapses within a round or two, so a later pass takes the line over.
COLLECTOR_LEASE_SECONDS = "1"


class Harness:
    def __init__(self, work: Path, s3_bucket_uri: str | None, env: dict[str, str],
                 collector: bool = False) -> None:
        self.work = work
        self.lines: list[Line] = []
        self.collector = collector
        self.collector_pid: int | None = None
        self.finished: list[tuple[str, str]] = []  # (store root URI, line prefix) written
        self.roots: list[str] = []
        stores = [("local", (work / "store").as_uri())]
        if s3_bucket_uri:
            stores.append(("s3", s3_bucket_uri))
        if collector:
            env = {**env, "DURAPIPE_RUN_ID": WRITERS_RUN,
                   "DURAPIPE_LINE_LEASE_SECONDS": COLLECTOR_LEASE_SECONDS}
        for store_name, base in stores:
            self.roots.append(base.rstrip("/"))
            for uploader in ("thread", "sidecar"):
                # Named as the compiler names lines (``.../checkpoints``), so a collector of
                # the store root finds them.
                uri = f"{base.rstrip('/')}/{uploader}/checkpoints"
                root = work / f"{store_name}-{uploader}"
                root.mkdir(parents=True)
                self.lines.append(
                    Line(f"{store_name}/{uploader}", uri, uploader, root, open_store(uri))
                )
        self.zygote = subprocess.Popen(
            [sys.executable, str(ZYGOTE)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def _ask(self, command: str) -> int:
        assert self.zygote.stdin is not None and self.zygote.stdout is not None
        self.zygote.stdin.write(command + "\n")
        self.zygote.stdin.flush()
        return int(self.zygote.stdout.readline())

    def _kill(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        status = self._ask(f"reap {pid}")
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            raise AssertionError(f"child {pid} ended by itself (status {status}) before the kill")

    def _ensure_agent(self, line: Line) -> None:
        if line.agent is None:
            line.agent = self._ask(f"agent {line.uri} {line.spool}")

    def _start_collector(self, index: int, rng: random.Random, counts: Counts) -> None:
        if index % 5 == 0:
            for root in self.roots:
                self._write_finished_line(root, index, counts)
        self.collector_pid = self._ask(
            f"collect {' '.join(self.roots)} --protect {WRITERS_RUN} --log "
            f"{self.work / 'collector.log'}")
        if index % 5 == 0:
            # Lines to remove: killed within its first pass, often in the middle of one.
            time.sleep(rng.uniform(0, 0.03))
            self._kill_collector(counts)
            self._check_finished_lines(counts)
            self.collector_pid = self._ask(
                f"collect {' '.join(self.roots)} --protect {WRITERS_RUN} --log "
                f"{self.work / 'collector.log'}")

    def _write_finished_line(self, root: str, index: int, counts: Counts) -> None:
        from durapipe.runtime.checkpoint import Checkpoint

        prefix = f"finished-{index}/checkpoints"
        checkpoint = Checkpoint(f"{root}/{prefix}", path=self.work / "finished" / prefix,
                                keep=2, env={"DURAPIPE_RUN_ID": f"finished-run-{index}"})
        for step in (1, 2, 3):
            state = self.work / "finished-state"
            write_state_for(state, step)
            checkpoint.save_sync(state, metadata={"step": step})
        checkpoint.close()
        self.finished.append((root, prefix))
        counts.finished_lines += 1

    def _kill_collector(self, counts: Counts) -> None:
        if self.collector_pid is not None:
            self._kill(self.collector_pid)
            self.collector_pid = None
            counts.kills["collector"] += 1

    def _check_finished_lines(self, counts: Counts) -> None:
        """The collector is dead: whatever it left of the finished runs' lines restores."""
        for root, prefix in list(self.finished):
            keys = open_store(root).list(prefix + "/")
            if not keys:
                counts.collected += 1
                self.finished.remove((root, prefix))
                continue
            view = open_store(f"{root}/{prefix}")
            manifests = [k for k in keys if f"/{MANIFEST_DIR}/" in k]
            try:
                restored = restore_newest(view, self.work / "check-finished")
                if manifests and restored is None:
                    raise ValueError(f"{len(manifests)} manifest(s) but nothing restores")
                if restored is not None:
                    consistent_step(restored.path, restored.commit.metadata)
            except (CheckpointError, ValueError, OSError) as error:
                counts.dangling += 1
                counts.problems.append(f"{prefix}: dangling: {error}")

    def final_pass(self, counts: Counts) -> None:
        """One pass nobody kills, once the killed collectors' leases lapsed: no line of a
        finished run is left, and the writers' lines are whole."""
        from durapipe.runtime import linegc

        time.sleep(float(COLLECTOR_LEASE_SECONDS) * 1.5)
        for root in self.roots:
            # By the collectors' lease: a claimant judges another's lease by its own.
            linegc.collect(open_store(root), max_age=0, apply=True,
                           lease_seconds=float(COLLECTOR_LEASE_SECONDS),
                           protection=linegc.Protection(frozenset({WRITERS_RUN})))
        self._check_finished_lines(counts)
        for root, prefix in self.finished:
            counts.problems.append(f"{prefix}: left after a final pass: "
                                   f"{open_store(root).list(prefix)}")
        for line in self.lines:
            self._check(line, counts)

    def round(self, index: int, rng: random.Random, counts: Counts) -> None:
        if self.collector:
            self._start_collector(index, rng, counts)
        line = rng.choice(self.lines)
        slow = line.name.startswith("s3")
        if line.uploader == "sidecar":
            self._ensure_agent(line)
        workdir = line.root / f"trainer-{index}"
        spool = line.spool if line.uploader == "sidecar" else workdir / "spool"
        pid = self._ask(f"train {line.uri} {workdir} {spool} {line.uploader} {index}")
        if index % 10 == 9:
            # Every tenth trainer lives until it has committed something new, so the run
            # makes progress however slow the machine is; the others die at random.
            deadline = time.monotonic() + 60
            while (newest_seq(line.store) or 0) <= line.seq and time.monotonic() < deadline:
                time.sleep(0.005)
        kill_agent = line.uploader == "sidecar" and rng.random() < 0.25
        agent_first = kill_agent and rng.random() < 0.5
        time.sleep(rng.uniform(0, 0.3 if slow else 0.04))
        if agent_first:
            self._kill_agent(line, counts)
            time.sleep(rng.uniform(0, 0.02))
        self._kill(pid)
        counts.kills[f"{line.name} trainer"] += 1
        if kill_agent and not agent_first:
            time.sleep(rng.uniform(0, 0.1 if slow else 0.02))
            self._kill_agent(line, counts)
        self._read_acks(line, workdir)
        if line.uploader == "sidecar":
            # What was handed over is the agent's now: a live agent must commit it.
            self._ensure_agent(line)
            deadline = time.monotonic() + 120
            while pending_requests(line.spool) and time.monotonic() < deadline:
                time.sleep(0.005)
            line.acked = max(line.acked, line.handed)
        if self.collector:
            # At a random moment of the round: mid-pass, between passes, or mid-removal.
            time.sleep(rng.uniform(0, 0.05))
            self._kill_collector(counts)
            self._check_finished_lines(counts)
        self._check(line, counts)

    def _kill_agent(self, line: Line, counts: Counts) -> None:
        if line.agent is not None:
            self._kill(line.agent)
            line.agent = None
            counts.kills[f"{line.name} agent"] += 1

    def _read_acks(self, line: Line, workdir: Path) -> None:
        try:
            text = (workdir / "acks").read_text()
        except FileNotFoundError:
            return
        for entry in text.splitlines():
            what, _, step = entry.partition(" ")
            if not step.isdigit():
                continue  # the kill cut the line short
            if what == "committed":
                line.acked = max(line.acked, int(step))
            elif what == "handed":
                line.handed = max(line.handed, int(step))

    def _check(self, line: Line, counts: Counts) -> None:
        seq = newest_seq(line.store)
        where = self.work / "check"
        try:
            restored = restore_newest(line.store, where)
            if seq is None:
                if restored is not None:
                    raise ValueError("restored without a manifest")
                step = 0
            elif restored is None or restored.commit.seq != seq:
                raise ValueError(f"newest manifest #{seq} but load() gave {restored}")
            else:
                step = consistent_step(restored.path, restored.commit.metadata)
        except (CheckpointError, ValueError, OSError) as error:
            counts.torn += 1
            counts.problems.append(f"{line.name}: torn: {error}")
            return
        if step < line.acked:
            counts.lost += 1
            counts.problems.append(f"{line.name}: restored step {step} < acknowledged {line.acked}")
        if (seq or 0) > line.seq:
            counts.landed[line.name] += 1
        line.seq = max(line.seq, seq or 0)

    def close(self) -> None:
        if self.collector_pid is not None:
            os.kill(self.collector_pid, signal.SIGKILL)
            self._ask(f"reap {self.collector_pid}")
            self.collector_pid = None
        for line in self.lines:
            if line.agent is not None:
                os.kill(line.agent, signal.SIGKILL)
                self._ask(f"reap {line.agent}")
                line.agent = None
        self.zygote.kill()
        self.zygote.wait()


def run_kills(
    work: Path, rounds: int, seed: int, *, s3_bucket_uri: str | None, env: dict[str, str],
    collector: bool = False,
) -> Counts:
    counts = Counts()
    rng = random.Random(seed)
    harness = Harness(work, s3_bucket_uri, env, collector=collector)
    try:
        for index in range(rounds):
            harness.round(index, rng, counts)
        if collector:
            harness.final_pass(counts)
    finally:
        harness.close()
    return counts


def write_state_for(root: Path, step: int) -> None:
    """One whole state of ``step``, as the zygote's trainers write it."""
    (root / "shards").mkdir(parents=True, exist_ok=True)
    (root / "shards" / "weights.bin").write_bytes(step.to_bytes(8, "little") * 512)
    (root / "frozen.bin").write_bytes(FROZEN)
    (root / "step.json").write_text(json.dumps({"step": step}))


def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURAPIPE_")}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    env.update(extra)
    return env
