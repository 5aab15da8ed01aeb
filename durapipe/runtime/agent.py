"""The upload agent: a sidecar process that commits checkpoints staged in a shared spool dir.

The training process only stages (``Checkpoint(uploader="sidecar").save``): it copies the state
into ``<spool>/pending/<name>/`` and renames it into place.  From then on the checkpoint belongs
to this agent, which lives in another container (its own cgroup), so a state handed over just
before the trainer is OOM-killed or preempted still reaches the store.

A commit that fails for a reason of the store (network, 5xx, timeouts) stays pending and is
retried with backoff; one that cannot succeed (its data is damaged, the store refuses it) is
reported at once.  On SIGTERM the agent keeps committing what is already pending until the
spool is empty or the grace period (``DURAPIPE_GRACE_SECONDS``) is nearly spent, then reports
what it could not commit and exits; a store that never answers cannot hold it longer.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from durapipe.runtime import contract
from durapipe.runtime.commit import DEFAULT_KEEP, Committer, UploadBackoff, attempt_request
from durapipe.runtime.deadline import GRACE_MARGIN, grace_from_env
from durapipe.runtime.errors import CheckpointError
from durapipe.runtime.mainbeat import main_may_still_save
from durapipe.runtime.spool import RETRY_DIR, pending_requests, settle, write_result
from durapipe.runtime.podstatus import record_pod_status
from durapipe.runtime.signalflag import SignalFlag
from durapipe.runtime.store import Store, StoreError, open_store, store_client

log = logging.getLogger("durapipe.agent")
DEFAULT_GRACE_SECONDS = contract.DEFAULT_GRACE_SECONDS
HEARTBEAT_FILE = "agent.json"


class UploadAgent:
    def __init__(
        self,
        spool_dir: Path,
        store: Store,
        *,
        keep: int = DEFAULT_KEEP,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
    ) -> None:
        self.spool_dir = spool_dir
        self.committer = Committer(store, keep=keep)
        self.grace_seconds = grace_seconds
        #: Set by the SIGTERM handler, so it must take no lock (``signalflag``).
        self.stopping = SignalFlag()
        #: Monotonic time by which the agent must have exited (set once stopping).
        self.deadline: float | None = None
        self.backoff = UploadBackoff()

    def _deadline_passed(self) -> bool:
        if self.deadline is None and self.stopping.is_set():
            self.deadline = time.monotonic() + max(0.0, self.grace_seconds - GRACE_MARGIN)
        return self.deadline is not None and time.monotonic() >= self.deadline

    def _attempt(self, request_dir: Path) -> dict[str, Any] | None:
        """One commit attempt on a thread of its own, so a store that never answers cannot
        hold the agent past its deadline; ``None`` when the deadline came first."""
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["result"] = attempt_request(self.committer, request_dir)
            except BaseException as error:  # noqa: BLE001 (re-raised by the agent's thread)
                box["error"] = error

        worker = threading.Thread(target=work, name="durapipe-agent-commit", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.05)
            if worker.is_alive() and self._deadline_passed():
                return None
        if "error" in box:
            raise box["error"]
        result: dict[str, Any] = box["result"]
        return result

    def drain_once(self) -> str:
        """Try to commit the newest pending request; older ones it supersedes share its result.

        Returns ``"idle"`` (nothing pending), ``"settled"``, ``"retry"`` (the store failed;
        the request stays pending) or ``"deadline"``.
        """
        requests = pending_requests(self.spool_dir)
        if not requests:
            return "idle"
        newest, older = requests[-1], requests[:-1]
        result = self._attempt(newest)
        if result is None:
            return "deadline"
        if result.get("retryable"):
            note = self.spool_dir / RETRY_DIR / f"{newest.name}.json"
            note.parent.mkdir(parents=True, exist_ok=True)
            note.write_text(json.dumps({"error": result["error"]}))
            return "retry"
        self.backoff.reset()
        settle(self.spool_dir, newest, result)
        if "error" in result:
            # This request cannot be committed; the ones before it still may be.
            return "settled"
        for request_dir in older:
            settle(self.spool_dir, request_dir, dict(result, superseded=True))
        return "settled"

    def run(self, *, poll_seconds: float = 0.2, grace_seconds: float | None = None) -> None:
        if grace_seconds is not None:
            self.grace_seconds = grace_seconds
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        (self.spool_dir / HEARTBEAT_FILE).write_text(json.dumps({"pid": os.getpid()}))
        try:
            self._drain_until_stopped(poll_seconds)
        finally:
            # A finished run frees its line at once (its lease would hold it a while more).
            self.committer.claim.release()

    def claim_line(self) -> None:
        """Take the line now, before the first save: while the trainer trains, another run
        with the same inputs finds this one's lease instead of a free line.  A refusal is
        logged, not raised: the trainer's restore refuses alike and fails the stage with the
        message, and each commit tries the claim again."""
        try:
            self.committer.claim.ensure(sleep=self.stopping.wait)
        except CheckpointError as error:  # LineBusy, LineTakenOver
            log.error("%s", error)
        except (StoreError, OSError) as error:
            log.warning("could not claim the checkpoint line yet (the first commit will "
                        "try again): %s", error)

    def _drain_until_stopped(self, poll_seconds: float) -> None:
        # On a thread of its own: a store that never answers, or another run's lease waited
        # for, must not hold the agent past its deadline (commits wait for it, in theirs).
        # Only the pod whose trainer holds global rank 0 writes the line: another node's agent
        # claiming it would fence node 0's out (the same run, so at once).
        if os.environ.get(contract.ENV_JOB_COMPLETION_INDEX, "0") in ("", "0"):
            threading.Thread(target=self.claim_line, name="durapipe-agent-claim",
                             daemon=True).start()
        while not self.stopping.is_set():
            outcome = self.drain_once()
            if outcome == "idle":
                self.stopping.wait(poll_seconds)
            elif outcome == "retry":
                self.stopping.wait(self.backoff.next())
        # Stages that save on SIGTERM hand over their final state a little after we got ours.
        while not self._deadline_passed():
            outcome = self.drain_once()
            if outcome == "deadline":
                break
            if outcome == "idle" and not _trainer_may_still_save(self.spool_dir) \
                    and not main_may_still_save(self.spool_dir):
                break
            assert self.deadline is not None
            pause = self.backoff.next() if outcome == "retry" else poll_seconds
            time.sleep(max(0.0, min(pause, self.deadline - time.monotonic())))
        self._report_uncommitted()

    def _report_uncommitted(self) -> None:
        """Whatever is still pending at the deadline is reported, to the log and to its
        waiters, and left in the spool (a restarted agent would commit it)."""
        left = pending_requests(self.spool_dir)
        if not left:
            return
        log.error(
            "exiting at the deadline (grace period %g s) with %d checkpoint(s) not committed: %s",
            self.grace_seconds,
            len(left),
            ", ".join(request.name for request in left),
        )
        for request in left:
            try:
                note = json.loads((self.spool_dir / RETRY_DIR / f"{request.name}.json").read_text())
            except (OSError, ValueError):
                note = {}
            error = "not committed before the upload agent's deadline (grace period)"
            if isinstance(note, dict) and note.get("error"):
                error += f"; last error: {note['error']}"
            write_result(self.spool_dir, request, {"error": error, "deadline": True})


#: A staging that has not written anything for this long belongs to a trainer that died.
STALE_PARTIAL_SECONDS = 5.0


def _trainer_may_still_save(spool_dir: Path, now: float | None = None) -> bool:
    """A staging in progress shows as a ``.partial`` directory that is still being written.

    One a killed trainer left behind must not hold the agent for the whole grace period:
    the trainer's container may not share our process namespace, so liveness is judged by
    progress (the newest modification time inside it), not by its pid.
    """
    pending = spool_dir / "pending"
    if not pending.is_dir():
        return False
    cutoff = (time.time() if now is None else now) - STALE_PARTIAL_SECONDS
    for partial in pending.iterdir():
        if partial.name.endswith(".partial") and _last_write(partial) >= cutoff:
            return True
    return False


def _last_write(root: Path) -> float:
    newest = 0.0
    try:
        newest = root.stat().st_mtime
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                try:
                    newest = max(newest, os.lstat(os.path.join(dirpath, name)).st_mtime)
                except FileNotFoundError:
                    pass
    except FileNotFoundError:
        pass
    return newest


def agent_verdict(verdict: str, details: dict[str, Any]) -> str:
    """``durapipe-agent:<verdict> {json}``: the one line that says whether uploads can happen."""
    return f"{contract.AGENT_VERDICT_TAG}{verdict} {json.dumps(details, sort_keys=True)}"


def open_with_verdict(uri: str) -> tuple[Store | None, int]:
    """Open the store and print the agent's verdict line to stderr: ``ready`` with the client
    that will upload, or ``no_store_client`` (exit status :data:`contract.EXIT_NO_STORE_CLIENT`)
    so a pod that cannot upload fails loudly instead of losing its checkpoints."""
    import platform

    python = platform.python_version()
    try:
        client = store_client(uri)
        store = open_store(uri)
    except StoreError as error:
        print(agent_verdict("no_store_client", {"uri": uri, "python": python,
                                                "error": str(error)}),
              file=sys.stderr, flush=True)
        return None, contract.EXIT_NO_STORE_CLIENT
    print(agent_verdict("ready", {"uri": uri, "python": python, "client": client}),
          file=sys.stderr, flush=True)
    return store, 0


def preflight(uri: str | None = None) -> int:
    """The init container's check, in the stage's own image before the trainer starts: the
    image's Python runs the runtime (the zipapp's entry refuses < 3.10), and a client for the
    checkpoint store exists."""
    uri = uri or os.environ.get(contract.ENV_CHECKPOINT_URI)
    if not uri:
        import platform

        print(agent_verdict("ready", {"python": platform.python_version(), "client": None}),
              file=sys.stderr, flush=True)
        return 0
    return open_with_verdict(uri)[1]


def run_agent(
    *,
    spool: str | None = None,
    uri: str | None = None,
    keep: int | None = None,
    poll_seconds: float = 0.2,
) -> int:
    logging.basicConfig(level=logging.INFO, format="durapipe-agent: %(message)s")
    spool_dir = Path(spool or os.environ.get(contract.ENV_SPOOL_DIR) or contract.DEFAULT_SPOOL_DIR)
    uri = uri or os.environ.get(contract.ENV_CHECKPOINT_URI)
    if not uri:
        log.error("no checkpoint URI (--uri or %s)", contract.ENV_CHECKPOINT_URI)
        return contract.EXIT_USAGE
    keep = keep or int(os.environ.get(contract.ENV_CHECKPOINT_KEEP) or DEFAULT_KEEP)
    try:
        grace_seconds = grace_from_env()
        contract.line_lease_from_env(os.environ)
    except ValueError as error:  # refused as the wrapper refuses it, not defaulted
        log.error("%s", error)
        return contract.EXIT_USAGE
    store, code = open_with_verdict(uri)
    if store is None:
        return code
    agent = UploadAgent(spool_dir, store, keep=keep, grace_seconds=grace_seconds)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        agent.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    agent.run(poll_seconds=poll_seconds)
    # By now (Argo stops sidecars after the main container ends) the pod status says how the
    # main container ended, even when an OOM kill took the wrapper down with it.
    ending = record_pod_status(spool_dir)
    if ending is not None:
        log.info("main container ended: %s", json.dumps(ending))
    return 0
