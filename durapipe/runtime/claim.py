"""One writer per checkpoint line, enforced: claims, and the lease a live writer keeps.

The rule (docs/runtime.md, "One writer per line"): the newest claim holds the line; a writer
that claims it takes over at once from a claim of its own run (an attempt's zombie) or one
that records no run, and from another run's claim only once that run's lease is stale; while
another run's lease is live, it waits about one lease for it to lapse, then fails with
:class:`LineBusy`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

from durapipe.runtime import contract
from durapipe.runtime.errors import CheckpointError, LineBusy, LineTakenOver
from durapipe.runtime.store import NotFound, Store, StoreError, retrying

log = logging.getLogger("durapipe.checkpoint")

WRITER_DIR = "writers"
CLAIM_SUFFIX = ".json"
BEAT_SUFFIX = ".beat"
#: A waiter gives another run's live lease one lease period and a quarter of another: a
#: writer SIGKILLed just before the wait began stops renewing, and is seen to, within a lease.
WAIT_LEASES = 1.25
#: How long :meth:`LineClaim.release` waits for a beat in flight before deleting the beat:
#: one written after the delete would make the line look held until it went stale.
RELEASE_JOIN_SECONDS = 2.0

Claim = tuple[int, str]
#: The claims this process holds a lease on (see :func:`release_all`).
_HELD: weakref.WeakSet[LineClaim] = weakref.WeakSet()


def release_all() -> None:
    """Release every line this process holds (tests end each case with it, so no lease of
    one outlives it)."""
    for claim in list(_HELD):
        claim.release()


def claim_key(epoch: int, identity: str) -> str:
    return f"{WRITER_DIR}/{epoch:012d}-{identity}{CLAIM_SUFFIX}"


def beat_key(epoch: int, identity: str) -> str:
    return f"{WRITER_DIR}/{epoch:012d}-{identity}{BEAT_SUFFIX}"


def _parse(key: str) -> tuple[Claim, str] | None:
    """The claim a ``writers/`` key belongs to, and which of its objects it is."""
    name = key.rsplit("/", 1)[-1]
    for suffix in (CLAIM_SUFFIX, BEAT_SUFFIX):
        if name.endswith(suffix):
            epoch, _, identity = name.removesuffix(suffix).partition("-")
            if epoch.isdigit() and identity:
                return (int(epoch), identity), suffix
    return None


def claim_record(store: Store, claim: Claim) -> dict[str, object] | None:
    """What ``claim`` records (its run, host, pod); ``None`` when it is gone, ``{}`` for one
    this runtime did not write."""
    try:
        record = json.loads(retrying(partial(store.get_bytes, claim_key(*claim))))
    except NotFound:
        return None
    except ValueError:  # not a claim this runtime wrote: nobody to wait for
        return {}
    return record if isinstance(record, dict) else {}


def claim_runs(store: Store) -> list[str]:
    """The runs whose claims the line holds, oldest claim first (another run's claim stays
    after its attempt: the record that the run used the line)."""
    keys = retrying(lambda: store.list(WRITER_DIR))
    runs = []
    for claim in sorted(c for c in map(_claim_of, keys) if c is not None):
        run = (claim_record(store, claim) or {}).get("run")
        if isinstance(run, str) and run:
            runs.append(run)
    return runs


def _run_quietly(store: Store, claim: Claim) -> str:
    """The run ``claim`` records, ``""`` when it records none or cannot be read."""
    try:
        run = (claim_record(store, claim) or {}).get("run")
    except (StoreError, OSError):
        return ""
    return run if isinstance(run, str) else ""


def _claim_of(key: str) -> Claim | None:
    parsed = _parse(key)
    return parsed[0] if parsed is not None and parsed[1] == CLAIM_SUFFIX else None


@dataclass
class Holder:
    """What a claim says about its writer, and its latest beat as read just now."""

    claim: Claim
    #: ``""`` when the claim records none (a runtime from before leases, or no run id).
    run: str
    where: str
    #: The beat's bytes (compared between polls: a change proves the writer alive whatever
    #: the clocks) and the writer's wall time in it; ``None`` when there is no beat.
    beat: bytes | None
    beat_time: float | None


class LineClaim:
    """One writer per checkpoint line, enforced: the newest claim holds the line.

    A writer claims the line before its first commit (or at restore, see
    :meth:`~durapipe.runtime.checkpoint.Checkpoint.load_sync`) by writing its first beat
    ``writers/<epoch>-<id>.beat`` and then its claim ``writers/<epoch>-<id>.json`` with an
    epoch above every claim it lists (the random id breaks a tie between two writers that
    list at once, so no conditional write is needed; the beat comes first so a claim is
    never seen without one while its writer lives).  The claim that sorts last holds the
    line.  Before a writer writes a manifest and again after, it checks that its claim is
    still the newest; once it is not, the writer stops for good (:class:`LineTakenOver`),
    removes the manifest it may just have written, and deletes nothing else of the line's.

    While it holds the line a daemon thread renews its lease: it overwrites the beat with the
    writer's wall time every quarter lease, and stops (the writer has lost the line) once a
    newer claim exists.  :meth:`release` deletes the beat, so a run that ends cleanly frees
    the line at once; a killed one frees it when its lease runs out.
    """

    def __init__(
        self,
        store: Store,
        *,
        run_id: str | None = None,
        lease_seconds: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if env is None else env
        self.store = store
        self.run_id = env.get(contract.ENV_RUN_ID, "") if run_id is None else run_id
        self.lease = contract.line_lease_from_env(env) if lease_seconds is None else lease_seconds
        self.pod = env.get(contract.ENV_POD_NAME, "")
        self.held: Claim | None = None
        #: Why this writer may no longer commit, once it knows.
        self.lost: str | None = None
        # Re-entrant: check() calls ensure().  Held through a wait for another run's lease,
        # so a commit never claims beside a restore that is still waiting.
        self._lock = threading.RLock()
        self._heartbeat: _Heartbeat | None = None
        self._beats = 0
        #: Counts releases: a claim that a release overtook is withdrawn, not kept alive.
        self._releases = 0

    @property
    def beat_interval(self) -> float:
        return self.lease / 4

    @property
    def poll_interval(self) -> float:
        return min(1.0, self.lease / 10)

    def _claims(self, store: Store) -> list[Claim]:
        keys = retrying(lambda: store.list(WRITER_DIR))
        return sorted(claim for claim in map(_claim_of, keys) if claim is not None)

    # -- taking the line ---------------------------------------------------------------------
    def ensure(
        self, *, via: Store | None = None, sleep: Callable[[float], object] | None = None
    ) -> None:
        """Claim the line unless this writer already has; raise if it has lost it.

        Waits (``sleep``; one that returns true gives up) while another run's lease is live,
        and raises :class:`LineBusy` when it still is after :data:`WAIT_LEASES` leases.
        ``via``: the store to claim through (a restore's, bounded by its deadline); the
        heartbeat always uses the line's own."""
        with self._lock:
            if self.lost is not None:
                raise LineTakenOver(self.lost)
            if self.held is not None:
                return
            store = via or self.store
            began = time.monotonic()
            releases = self._releases
            while True:
                keys = self._wait_until_free(store, sleep or time.sleep, began)
                claims = sorted(c for c in map(_claim_of, keys) if c is not None)
                mine = ((claims[-1][0] + 1) if claims else 1, os.urandom(16).hex())
                record = {
                    "claimed": time.time(),
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "pod": self.pod,
                    "run": self.run_id,
                }
                try:
                    self._put_beat(store, mine)
                    data = json.dumps(record, sort_keys=True).encode()
                    retrying(partial(store.put_bytes, claim_key(*mine), data, create_only=True))
                except BaseException:
                    self._delete_quietly(beat_key(*mine))
                    raise
                newest = self._claims(store)
                if newest and newest[-1] == mine:
                    break
                # Another writer claimed in the same moment and sorts after us: withdraw, and
                # treat it as any holder (our own run's newer attempt fences us out).
                self._delete_quietly(claim_key(*mine), beat_key(*mine))
                winner = self._holder(store, newest[-1]) if newest else None
                if winner is None or not winner.run or winner.run == self.run_id:
                    self.lost = self._lost_message(store, newest[-1] if newest else None, mine)
                    raise LineTakenOver(self.lost)
            if self._releases != releases:
                # Released (the process is ending) while this claim was being made.
                self._delete_quietly(beat_key(*mine))
                raise CheckpointError(f"checkpoint line {self.store.uri} was released while "
                                      "this writer claimed it")
            self.held = mine
            self._heartbeat = _Heartbeat(self, mine)
            self._heartbeat.start()
            _HELD.add(self)
            self._tidy(store, keys, mine)

    def _tidy(self, store: Store, keys: list[str], mine: Claim) -> None:
        """Remove what the claims before ``mine`` left (their writers are fenced out by ours,
        which sorts after them): every beat, and the claims of this run or of none.  Another
        run's claim stays, beat-less, as the record that the run used the line: the
        checkpoint collector keeps a line while a run that has not finished has a claim in it
        (one per run, so a line holds as many claims as runs used it)."""
        for key in keys:
            parsed = _parse(key)
            if parsed is None or parsed[0] >= mine:
                continue
            if parsed[1] == CLAIM_SUFFIX:
                run = _run_quietly(store, parsed[0])
                if run and run != self.run_id:
                    continue
            self._delete_quietly(key)

    def wait_until_free(
        self, *, via: Store | None = None, sleep: Callable[[float], object] | None = None
    ) -> None:
        """Return once this writer could take the line (:meth:`ensure`'s wait) without
        claiming it; :class:`LineBusy` as :meth:`ensure` raises it."""
        with self._lock:
            if self.held is None:
                self._wait_until_free(via or self.store, sleep or time.sleep, time.monotonic())

    def _wait_until_free(
        self, store: Store, sleep: Callable[[float], object], began: float
    ) -> list[str]:
        """Poll ``writers/`` until its newest claim may be taken over; the last listing."""
        bound = self.lease * WAIT_LEASES
        #: claim -> (the beat last read, monotonic time it was first read as such)
        seen: dict[Claim, tuple[bytes | None, float]] = {}
        while True:
            keys = retrying(lambda: store.list(WRITER_DIR))
            claims = sorted(c for c in map(_claim_of, keys) if c is not None)
            if not claims:
                return keys
            holder = self._holder(store, claims[-1])
            if holder is None:
                # Removed by a newer claim between our listing and our read: list again.
                sleep(self.poll_interval)
                continue
            now = time.monotonic()
            free = self._free(holder, seen, now)
            if free is not None:
                if free:
                    log.info("taking checkpoint line %s from run %s (%s): %s",
                             self.store.uri, holder.run, holder.where, free)
                return keys
            waited = now - began
            if waited >= bound:
                raise LineBusy(self._busy_message(holder, waited))
            if sleep(min(self.poll_interval, bound - waited)):
                raise LineBusy(self._busy_message(holder, time.monotonic() - began)
                               + " (stopped waiting: asked to stop)")

    def _free(
        self, holder: Holder, seen: dict[Claim, tuple[bytes | None, float]], now: float
    ) -> str | None:
        """Why ``holder``'s claim may be taken over now ("" for no reason worth a log
        line); ``None`` while its lease is live."""
        if not holder.run or holder.run == self.run_id:
            return ""  # the zombie rule: a retry never waits for its own run
        if holder.beat is None:
            return "it released the line (no heartbeat)"
        if holder.beat_time is None or time.time() - holder.beat_time > self.lease:
            return f"its lease is stale (no heartbeat within {self.lease:g} s, by our clock)"
        first = seen.get(holder.claim)
        if first is None or first[0] != holder.beat:
            seen[holder.claim] = (holder.beat, now)
        elif now - first[1] > self.lease:
            # Whatever the clocks say: it has not beaten for a lease while we watched.
            return f"its heartbeat did not change for {now - first[1]:.1f} s"
        return None

    def _holder(self, store: Store, claim: Claim) -> Holder | None:
        """The writer of ``claim`` as the store describes it; ``None`` when the claim is gone
        (a newer writer removed it: list again)."""
        record = claim_record(store, claim)
        if record is None:
            return None
        run = record.get("run")
        try:
            beat: bytes | None = retrying(partial(store.get_bytes, beat_key(*claim)))
        except NotFound:
            beat = None
        beat_time: float | None = None
        if beat is not None:
            try:
                beat_time = float(json.loads(beat)["beat"])
            except (ValueError, KeyError, TypeError):
                beat_time = None
        return Holder(claim, run if isinstance(run, str) else "", _where(record), beat,
                      beat_time)

    def _busy_message(self, holder: Holder, waited: float) -> str:
        # What to do comes before the URI: the failure record keeps only 500 characters.
        age = max(0.0, time.time() - (holder.beat_time or time.time()))
        return (
            f"another run still holds this checkpoint line: run {holder.run} ({holder.where}) "
            f"renewed its lease {age:.0f} s ago, and this run waited {waited:.0f} s for it "
            f"(the lease is {self.lease:g} s). Runs with the same inputs share a checkpoint "
            f"line, and only one may write it: wait for run {holder.run} to finish, stop it, "
            'or give this stage `checkpoint { scope = "run" }` for a line of its own '
            f"(line: {self.store.uri})"
        )

    # -- keeping the line --------------------------------------------------------------------
    def _put_beat(self, store: Store, claim: Claim) -> None:
        self._beats += 1
        beat = {"beat": time.time(), "count": self._beats, "pid": os.getpid(),
                "run": self.run_id}
        data = json.dumps(beat, sort_keys=True).encode()
        retrying(partial(store.put_bytes, beat_key(*claim), data))

    def _renew(self, claim: Claim, stopped: threading.Event) -> bool:
        """One heartbeat: whether to go on (this writer still holds the line)."""
        claims = self._claims(self.store)
        if not claims or claims[-1] != claim:
            if self.held == claim and self.lost is None:
                self.lost = self._lost_message(self.store, claims[-1] if claims else None, claim)
                log.warning("%s", self.lost)
            self._delete_quietly(beat_key(*claim))
            return False
        if stopped.is_set():
            return False
        self._put_beat(self.store, claim)
        return True

    def check(self) -> None:
        """Raise :class:`LineTakenOver` unless this writer's claim is still the newest."""
        self.ensure()
        claims = self._claims(self.store)
        if claims and claims[-1] == self.held:
            return
        if self.lost is None:
            self.lost = self._lost_message(self.store, claims[-1] if claims else None,
                                           self.held)
        heartbeat = self._heartbeat
        if heartbeat is not None:
            heartbeat.stopped.set()  # not joined: it may be stuck in a store call
        if self.held is not None:
            self._delete_quietly(beat_key(*self.held))
        raise LineTakenOver(self.lost)

    def release(self, *, attempts: int = 5) -> None:
        """Stop renewing the lease and delete the beat: the line is free for another run at
        once.  The claim stays (a zombie older than it is still fenced out by it); a later
        commit of this writer claims the line again.  Never waits for a claim in progress
        (a store that does not answer must not hold an exit): that claim withdraws itself."""
        self._releases += 1
        heartbeat, self._heartbeat = self._heartbeat, None
        held, self.held = self.held, None
        if heartbeat is not None:
            heartbeat.stopped.set()
            if heartbeat is not threading.current_thread():
                heartbeat.join(RELEASE_JOIN_SECONDS)
        _HELD.discard(self)
        if held is not None:
            self._delete_quietly(beat_key(*held), attempts=attempts)

    def _delete_quietly(self, *keys: str, attempts: int = 5) -> None:
        for key in keys:
            try:
                retrying(partial(self.store.delete, key), attempts=attempts)
            except (StoreError, OSError) as error:
                log.warning("could not remove %s of checkpoint line %s: %s", key,
                            self.store.uri, error)

    # -- describing ----------------------------------------------------------------------------
    def _lost_message(self, store: Store, newest: Claim | None, mine: Claim | None) -> str:
        newer = newest if newest is not None and mine is not None and newest > mine else None
        holder = self._holder_quietly(store, newer)
        if holder is not None and holder.run and holder.run != self.run_id:
            why = (f"run {holder.run} found this writer's lease stale (not renewed within "
                   f"{self.lease:g} s: the store unreachable from here, or this process "
                   "stalled) or claimed in the same moment, and only the newest writer may "
                   "commit: this one stops")
        else:
            why = ("two attempts write to one line at once (a zombie of an earlier attempt "
                   "still running?), and only the newest may commit: this one stops")
        return (f"another writer took over this checkpoint line ({self.store.uri}): "
                f"{self._describe(store, newer)}; {why}")

    def _holder_quietly(self, store: Store, claim: Claim | None) -> Holder | None:
        if claim is None:
            return None
        try:
            return self._holder(store, claim)
        except (StoreError, OSError):
            return None

    def _describe(self, store: Store, claim: Claim | None) -> str:
        if claim is None:
            return "this writer's claim is gone from writers/"
        try:
            record = json.loads(store.get_bytes(claim_key(*claim)))
            when = time.strftime("%H:%M:%S", time.gmtime(float(record["claimed"])))
            run = f", run {record['run']}" if record.get("run") else ""
            return f"claim #{claim[0]} by {_where(record)}{run} at {when} UTC"
        except (StoreError, OSError, ValueError, KeyError, TypeError, AttributeError):
            return f"claim #{claim[0]}"


def _where(record: Mapping[str, object]) -> str:
    return f"pod {record.get('pod') or '?'} on {record.get('host') or '?'}, pid {record.get('pid')}"


class _Heartbeat(threading.Thread):
    """Renews a held claim's lease every quarter lease until stopped or the line is lost."""

    def __init__(self, owner: LineClaim, claim: Claim) -> None:
        super().__init__(name="durapipe-line-lease", daemon=True)
        self.owner, self.claim = owner, claim
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.owner.beat_interval):
            try:
                if not self.owner._renew(self.claim, self.stopped):
                    return
            except Exception as error:  # noqa: BLE001 (a failed beat is retried at the next)
                log.warning("could not renew the lease on checkpoint line %s: %s: %s",
                            self.owner.store.uri, type(error).__name__, error)
