"""The collector's property (#25): on random histories of runs, commits, kills, retries, runs
ending, time passing and collection passes, no pass ever reduces the newest restorable commit
of a line it must keep (one a run that has not finished has claimed, one a live writer holds,
one younger than ``max_age``); a line it may collect goes whole or not at all; and every run
that starts on a line restores that line's newest commit.

The histories run the real runtime on a local store: each run is a :class:`Checkpoint` of its
own run id (as its pods would be), "kill" stops a writer's heartbeat without a word (what
SIGKILL leaves: a claim and a beat that go stale), and the store's clock is virtual for ages
(``age`` moves it days ahead) and real for leases (``wait`` sleeps past one)."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durapipe.runtime import linegc
from durapipe.runtime.checkpoint import Checkpoint
from durapipe.runtime.claim import release_all
from durapipe.runtime.restore import restore_newest
from durapipe.runtime.store import LocalStore

LEASE = 0.2
DAY = 86400.0
MAX_AGE = 3 * DAY
LINES = ("p/inputs/train/k0/checkpoints", "p/inputs/train/k1/checkpoints",
         "p/inputs/eval/k2/checkpoints")


class VirtualClock:
    """Days the store's clock is ahead of the machine's: the objects written at a skew keep
    it, so ``age`` makes what exists older and leaves what is written after it young."""

    def __init__(self) -> None:
        self.skew = 0.0
        self.written: dict[str, float] = {}
        self.lock = threading.Lock()


class AgingStore(LocalStore):
    def __init__(self, root: str | Path, clock: VirtualClock) -> None:
        super().__init__(root, fsync=False)
        self.clock = clock

    def _note(self, key: str) -> None:
        with self.clock.lock:
            self.clock.written[str(self._path(key))] = self.clock.skew

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        super().put_bytes(key, data, create_only=create_only)
        self._note(key)

    def put_file(self, key: str, *args: Any, **kwargs: Any) -> Any:
        out = super().put_file(key, *args, **kwargs)
        self._note(key)
        return out

    def modified(self, key: str) -> float | None:
        real = super().modified(key)
        if real is None:
            return None
        return real + self.clock.written.get(str(self._path(key)), 0.0)


@dataclass
class Run:
    name: str
    line: int
    checkpoint: Checkpoint | None = None  # None: no attempt running
    finished: bool = False
    killed_at: float | None = None


@dataclass
class Model:
    root: Path
    clock: VirtualClock = field(default_factory=VirtualClock)
    runs: list[Run] = field(default_factory=list)
    #: Per line: the newest step committed since the line was last collected (0: none).
    newest: list[int] = field(default_factory=lambda: [0] * len(LINES))
    #: Per line: the runs whose claims it holds (a claim stays after its attempt).
    claimants: list[set[str]] = field(default_factory=lambda: [set() for _ in LINES])
    #: Per line: the skew at its newest commit (for "younger than max_age").
    committed_skew: list[float] = field(default_factory=lambda: [0.0] * len(LINES))
    counter: itertools.count[int] = field(default_factory=itertools.count)
    removed: int = 0

    def store(self, line: int | None = None) -> AgingStore:
        return AgingStore(self.root / "store" / (LINES[line] if line is not None else ""),
                          self.clock)

    def live(self, line: int) -> Run | None:
        return next((r for r in self.runs if r.line == line and r.checkpoint is not None), None)

    def restorable(self, line: int) -> int:
        work = self.root / f"probe-{next(self.counter)}"
        restored = restore_newest(self.store(line), work)
        return 0 if restored is None else int(restored.commit.metadata["step"])

    # -- events -------------------------------------------------------------------------------
    def attempt(self, run: Run) -> None:
        """A new attempt of ``run`` (its first, or a retry): claim, restore, check the step."""
        other = next((r for r in self.runs if r.line == run.line and r is not run
                      and r.killed_at is not None and r.checkpoint is None), None)
        if other is not None and other.name not in (run.name,):
            # Another run's killed attempt: its lease must lapse before this one may start.
            wait = LEASE * 1.2 - (time.monotonic() - other.killed_at)
            if wait > 0:
                time.sleep(wait)
        checkpoint = Checkpoint(self.store(run.line).root.as_uri(), store=self.store(run.line),
                                path=self.root / f"work-{next(self.counter)}", keep=2,
                                env={"DURAPIPE_RUN_ID": run.name,
                                     "DURAPIPE_LINE_LEASE_SECONDS": str(LEASE)})
        restored = checkpoint.load_sync()
        step = 0 if restored is None else int(restored.read_bytes().split()[1])
        assert step == self.newest[run.line], (run, step, self.newest)
        run.checkpoint, run.killed_at = checkpoint, None
        self.claimants[run.line].add(run.name)

    def start(self, line: int) -> None:
        if self.live(line) is not None:
            return  # a second live run with these inputs would wait for the first (LineBusy)
        run = Run(f"run-{next(self.counter)}", line)
        self.runs.append(run)
        self.attempt(run)

    def commit(self, index: int) -> None:
        live = [r for r in self.runs if r.checkpoint is not None]
        if not live:
            return
        run = live[index % len(live)]
        step = self.newest[run.line] + 1
        assert run.checkpoint is not None
        assert run.checkpoint.save_sync(f"step {step}".encode(), metadata={"step": step})
        self.newest[run.line] = step
        self.committed_skew[run.line] = self.clock.skew

    def kill(self, index: int) -> None:
        live = [r for r in self.runs if r.checkpoint is not None]
        if not live:
            return
        run = live[index % len(live)]
        assert run.checkpoint is not None
        heartbeat = run.checkpoint._claim._heartbeat
        if heartbeat is not None:
            heartbeat.stopped.set()  # no release, no deleted beat: SIGKILL's leftovers
        run.checkpoint, run.killed_at = None, time.monotonic()

    def retry(self, index: int) -> None:
        killed = [r for r in self.runs if r.killed_at is not None and not r.finished]
        if killed and self.live(killed[index % len(killed)].line) is None:
            self.attempt(killed[index % len(killed)])

    def finish(self, index: int) -> None:
        going = [r for r in self.runs if not r.finished]
        if not going:
            return
        run = going[index % len(going)]
        if run.checkpoint is not None:
            run.checkpoint.close()
            run.checkpoint = None
        run.finished = True

    def wait(self) -> None:
        time.sleep(LEASE * 1.2)

    def age(self, days: int) -> None:
        self.clock.skew += days * DAY

    def collect(self) -> None:
        unfinished = {r.name for r in self.runs if not r.finished}
        must_keep = [bool(self.claimants[i] & unfinished) or self.live(i) is not None
                     or self.clock.skew - self.committed_skew[i] <= MAX_AGE * 0.9
                     for i in range(len(LINES))]
        before = [self.restorable(i) for i in range(len(LINES))]
        outcomes = linegc.collect(self.store(), max_age=MAX_AGE, apply=True, lease_seconds=LEASE,
                                  protection=linegc.Protection(frozenset(unfinished)))
        removed = {o.line.prefix.rstrip("/") for o in outcomes if o.action == "removed"}
        for i, prefix in enumerate(LINES):
            after = self.restorable(i)
            if must_keep[i]:
                assert prefix not in removed and after == before[i], (prefix, outcomes)
            elif prefix in removed:
                # Whole: nothing of it is left, and the next run starts from nothing.
                assert not self.store(i).list(""), (prefix, self.store(i).list(""))
                self.newest[i], self.claimants[i] = 0, set()
                self.removed += 1
            else:
                assert after == before[i]


EVENTS = st.one_of(
    st.tuples(st.just("start"), st.integers(0, len(LINES) - 1)),
    st.tuples(st.just("commit"), st.integers(0, 7)),
    st.tuples(st.just("kill"), st.integers(0, 7)),
    st.tuples(st.just("retry"), st.integers(0, 7)),
    st.tuples(st.just("finish"), st.integers(0, 7)),
    st.tuples(st.just("age"), st.integers(1, 5)),
    st.tuples(st.just("collect"), st.just(0)),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(history=st.lists(EVENTS, min_size=5, max_size=40))
def test_no_pass_reduces_a_line_it_must_keep_and_runs_resume_from_the_newest(
        history: list[tuple[str, int]], tmp_path_factory: Any) -> None:
    model = Model(tmp_path_factory.mktemp("history"))
    waits = 0
    try:
        for event, value in history:
            if event == "kill" and waits >= 2:
                continue  # each kill costs a lease of real time to a later start; two will do
            if event in ("start", "retry", "commit", "kill", "finish"):
                getattr(model, event)(value)
            elif event == "age":
                model.age(value)
            else:
                model.collect()
            waits += event == "kill"
        model.age(2 * int(MAX_AGE / DAY))
        model.wait()
        model.collect()  # at the end: every line a finished run left old goes, whole
    finally:
        for run in model.runs:
            if run.checkpoint is not None:
                run.checkpoint.close()
        release_all()


def test_the_property_removes_lines_at_all() -> None:
    """The property would hold for a collector that never removes anything: one history where
    it must remove, and does."""
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        model = Model(Path(directory))
        model.start(0)
        model.commit(0)
        model.finish(0)
        model.start(1)
        model.commit(0)  # run-… of line 1 stays live
        model.age(4)
        model.collect()
        assert model.removed == 1 and model.newest == [0, 1, 0]
        model.start(0)  # a new run of line 0's inputs: from nothing
        model.finish(0)
        model.finish(0)
        release_all()
