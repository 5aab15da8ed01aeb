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
    problems: list[str] = field(default_factory=list)
    landed: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        kills = ", ".join(f"{name} {count}" for name, count in sorted(self.kills.items()))
        return (
            f"{sum(self.kills.values())} kills ({kills}); "
            f"rounds with a new commit: {dict(sorted(self.landed.items()))}; "
            f"{self.torn} torn, {self.lost} lost"
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


class Harness:
    def __init__(self, work: Path, s3_bucket_uri: str | None, env: dict[str, str]) -> None:
        self.work = work
        self.lines: list[Line] = []
        stores = [("local", (work / "store").as_uri())]
        if s3_bucket_uri:
            stores.append(("s3", s3_bucket_uri))
        for store_name, base in stores:
            for uploader in ("thread", "sidecar"):
                uri = f"{base.rstrip('/')}/{uploader}"
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

    def round(self, index: int, rng: random.Random, counts: Counts) -> None:
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
        for line in self.lines:
            if line.agent is not None:
                os.kill(line.agent, signal.SIGKILL)
                self._ask(f"reap {line.agent}")
                line.agent = None
        self.zygote.kill()
        self.zygote.wait()


def run_kills(
    work: Path, rounds: int, seed: int, *, s3_bucket_uri: str | None, env: dict[str, str]
) -> Counts:
    counts = Counts()
    rng = random.Random(seed)
    harness = Harness(work, s3_bucket_uri, env)
    try:
        for index in range(rounds):
            harness.round(index, rng, counts)
    finally:
        harness.close()
    return counts


def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURAPIPE_")}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    env.update(extra)
    return env
