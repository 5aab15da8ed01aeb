"""The one deadline every wait of a checkpoint operation derives from (docs/runtime.md,
"Deadlines"), and the stop request that shortens it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from durapipe.runtime import contract
from durapipe.runtime.store import Store

#: Seconds of the grace period kept back, so a bounded wait reports before the SIGKILL.
GRACE_MARGIN = 2.0
DEFAULT_GRACE_SECONDS = contract.DEFAULT_GRACE_SECONDS
#: Before a stop request, a wait without a timeout is bounded by this many grace periods.
RUNNING_BOUND_FACTOR = 60
_stop_signalled_at: float | None = None


def grace_from_env(env: Mapping[str, str] | None = None) -> float:
    """``DURAPIPE_GRACE_SECONDS`` (the pod's ``terminationGracePeriodSeconds``), else 30;
    ``ValueError`` when it is not a grace period (:func:`contract.parse_grace_seconds`)."""
    return contract.grace_seconds_from_env(os.environ if env is None else env)


def note_stop_signal(at: float | None = None) -> None:
    """Record when SIGTERM arrived (called from the SDK's flag-only handler: no I/O)."""
    global _stop_signalled_at
    if _stop_signalled_at is None:
        _stop_signalled_at = time.time() if at is None else at


def stop_time() -> float | None:
    """When this attempt was asked to stop (wall clock), if it was: the SIGTERM the SDK saw,
    or the wrapper's stop file, whichever came first."""
    times = [] if _stop_signalled_at is None else [_stop_signalled_at]
    control = os.environ.get(contract.ENV_CONTROL_DIR)
    if control:
        try:
            times.append((Path(control) / contract.CONTROL_STOP_FILE).stat().st_mtime)
        except OSError:
            pass
    return min(times) if times else None


#: How often a wait re-reads its deadline, which a stop request arriving meanwhile shortens.
DEADLINE_POLL_SECONDS = 0.05


class Deadline:
    """The one deadline every wait of a checkpoint operation derives from (docs/runtime.md,
    "Deadlines").

    Created once when the operation begins (a save handed over, a restore started) and passed
    down to everything that waits for it: its own bound runs from then, ``RUNNING_BOUND_FACTOR``
    grace periods (30 minutes for the default 30 s: long enough for a big upload, never
    forever) or the caller's ``timeout``; and once a stop is requested it also never passes the
    stop deadline, the stop time plus the grace period less ``GRACE_MARGIN`` (a wait that
    outlives the pod's SIGKILL reports nothing).  Each wait asks :meth:`remaining`, so the
    waits of one operation share one budget instead of each starting a fresh one.
    """

    def __init__(
        self, grace_seconds: float, timeout: float | None = None, *, began: float | None = None
    ) -> None:
        self.grace_seconds = grace_seconds
        self.timeout = timeout
        #: ``time.monotonic()`` when the operation began.
        self.began = time.monotonic() if began is None else began
        bound = grace_seconds * RUNNING_BOUND_FACTOR if timeout is None else timeout
        self._own_end = self.began + bound

    @classmethod
    def since(cls, grace_seconds: float, wall_time: float) -> Deadline:
        """The deadline of an operation that began at ``wall_time`` (``time.time()``) in
        another process: a save staged by a trainer, found in the spool."""
        began = time.monotonic() - max(0.0, time.time() - wall_time)
        return cls(grace_seconds, began=began)

    def _stop_left(self) -> float | None:
        stopped = stop_time()
        if stopped is None:
            return None
        return stopped + self.grace_seconds - GRACE_MARGIN - time.time()

    def remaining(self) -> float:
        """Seconds left (0 once passed); a stop request can only shorten it."""
        left = self._own_end - time.monotonic()
        stop_left = self._stop_left()
        return max(0.0, left if stop_left is None else min(left, stop_left))

    def expired(self) -> bool:
        return self.remaining() <= 0.0

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, or until the deadline if that comes first."""
        time.sleep(min(seconds, self.remaining()))

    def wait_for(self, finished: Callable[[float], bool]) -> bool:
        """Call ``finished(slice)`` (which may block up to ``slice`` seconds) until it says
        so or the deadline passes; whether it finished.  Slices, so a stop request that
        arrives during the wait shortens it."""
        while True:
            left = self.remaining()
            if finished(min(left, DEADLINE_POLL_SECONDS)):
                return True
            if left <= 0.0:
                return False

    def explain(self) -> str:
        """Which bound this deadline is, for error messages."""
        stop_left = self._stop_left()
        if stop_left is not None and stop_left <= self._own_end - time.monotonic():
            return (f"the stop deadline: the {self.grace_seconds:g} s grace period less "
                    f"{GRACE_MARGIN:g} s from the stop request")
        if self.timeout is not None:
            return f"the timeout of {self.timeout:g} s"
        return (f"the bound of {RUNNING_BOUND_FACTOR} grace periods of {self.grace_seconds:g} s "
                "before a stop request")

    def exceeded(self, what: str) -> str:
        """``<what> within <seconds since the operation began> s (<which bound>)``."""
        return f"{what} within {time.monotonic() - self.began:.1f} s ({self.explain()})"


class RestoreAbandoned(BaseException):
    """Unwinds a restore whose caller gave up at its deadline, cleaning up what it wrote and
    past every fallback (nobody waits for an older commit either).  A ``BaseException`` so
    that no handler of store or manifest errors takes it for a reason to try another commit."""


class DeadlineStore:
    """A store whose every call first checks a deadline: a restore given up by its caller
    stops at its next request instead of going on against a store that does not answer."""

    def __init__(self, store: Store, deadline: Deadline) -> None:
        self._store = store
        self._deadline = deadline
        self.uri = store.uri
        self.parallel_files = store.parallel_files

    def _check(self) -> Store:
        if self._deadline.expired():
            raise RestoreAbandoned
        return self._store

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        self._check().put_bytes(key, data, create_only=create_only)

    def put_file(
        self, key: str, path: Path, *, consume: bool = False, digest: str | None = None
    ) -> str:
        return self._check().put_file(key, path, consume=consume, digest=digest)

    def fingerprint(self, key: str, algorithm: str) -> str | None:
        return self._check().fingerprint(key, algorithm)

    def get_bytes(self, key: str) -> bytes:
        return self._check().get_bytes(key)

    def get_file(
        self, key: str, path: Path, size: int | None = None, *, algorithm: str | None = None
    ) -> str | None:
        return self._check().get_file(key, path, size, algorithm=algorithm)

    def size(self, key: str) -> int | None:
        return self._check().size(key)

    def list(self, prefix: str) -> list[str]:
        return self._check().list(prefix)

    def modified(self, key: str) -> float | None:
        return self._check().modified(key)

    def delete(self, key: str) -> None:
        self._check().delete(key)

