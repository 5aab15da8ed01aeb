"""One writer per checkpoint line, enforced: the newest writer's claim fences out older ones."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from functools import partial

from durapipe.runtime.errors import LineTakenOver
from durapipe.runtime.store import Store, StoreError, retrying

log = logging.getLogger("durapipe.checkpoint")

WRITER_DIR = "writers"


def claim_key(epoch: int, identity: str) -> str:
    return f"{WRITER_DIR}/{epoch:012d}-{identity}.json"


def _claim_of(key: str) -> tuple[int, str] | None:
    stem = key.rsplit("/", 1)[-1].removesuffix(".json")
    epoch, _, identity = stem.partition("-")
    return (int(epoch), identity) if epoch.isdigit() and identity else None


class LineClaim:
    """One writer per checkpoint line, enforced: the newest writer holds the line.

    A writer claims the line before its first commit by writing ``writers/<epoch>-<id>.json``
    with an epoch above every claim it lists (the random id breaks a tie between two writers
    that list at once, so no conditional write is needed).  The claim that sorts last holds
    the line.  Before a writer writes a manifest and again after, it checks that its claim is
    still the newest; once it is not, the writer stops for good (:class:`LineTakenOver`),
    removes the manifest it may just have written, and deletes nothing else of the line's.

    The newest wins because two writers on one line are an attempt and the zombie of an
    earlier one (a pod on a partitioned node that Argo already replaced): the retry is what
    the workflow waits for, and the zombie must not commit, least of all collect garbage
    under the retry.  A lease with an expiry would instead make every retry after a SIGKILL
    or an OOM kill wait until the dead attempt's lease ran out.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.held: tuple[int, str] | None = None
        #: Why this writer may no longer commit, once it knows.
        self.lost: str | None = None

    def _claims(self) -> list[tuple[int, str]]:
        keys = retrying(lambda: self.store.list(WRITER_DIR))
        return sorted(claim for claim in map(_claim_of, keys) if claim is not None)

    def ensure(self) -> None:
        """Claim the line unless this writer already has; raise if it has lost it."""
        if self.lost is not None:
            raise LineTakenOver(self.lost)
        if self.held is not None:
            return
        older = self._claims()
        mine = ((older[-1][0] + 1) if older else 1, uuid.uuid4().hex)
        record = {
            "claimed": time.time(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "pod": os.environ.get("POD_NAME", ""),
        }
        data = json.dumps(record, sort_keys=True).encode()
        retrying(partial(self.store.put_bytes, claim_key(*mine), data, create_only=True))
        self.held = mine
        for claim in older:  # their writers are fenced out by ours, which sorts after them
            try:
                retrying(partial(self.store.delete, claim_key(*claim)))
            except StoreError as error:
                log.warning("could not remove an older writer's claim: %s", error)

    def check(self) -> None:
        """Raise :class:`LineTakenOver` unless this writer's claim is still the newest."""
        self.ensure()
        claims = self._claims()
        if claims and claims[-1] == self.held:
            return
        newer = claims[-1] if claims and self.held is not None and claims[-1] > self.held else None
        self.lost = (
            f"another writer took over this checkpoint line ({self.store.uri}): "
            f"{self._describe(newer)}; two attempts write to one line at once (a zombie of an "
            "earlier attempt still running?), and only the newest may commit: this one stops"
        )
        raise LineTakenOver(self.lost)

    def _describe(self, claim: tuple[int, str] | None) -> str:
        if claim is None:
            return "this writer's claim is gone from writers/"
        try:
            record = json.loads(self.store.get_bytes(claim_key(*claim)))
            who = f"pod {record.get('pod') or '?'} on {record.get('host')}, pid {record.get('pid')}"
            when = time.strftime("%H:%M:%S", time.gmtime(float(record["claimed"])))
            return f"claim #{claim[0]} by {who} at {when} UTC"
        except (StoreError, OSError, ValueError, KeyError, TypeError, AttributeError):
            return f"claim #{claim[0]}"
