"""The upload agent: a sidecar process that commits checkpoints staged in a shared spool dir.

The training process only stages (``Checkpoint(uploader="sidecar").save``): it copies the state
into ``<spool>/pending/<name>/`` and renames it into place.  From then on the checkpoint belongs
to this agent, which lives in another container (its own cgroup), so a state handed over just
before the trainer is OOM-killed or preempted still reaches the store.

On SIGTERM the agent keeps committing what is already pending until the spool is empty or the
grace period (``DURAPIPE_GRACE_SECONDS``) is nearly spent, then exits.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from types import FrameType

from durapipe.runtime import contract
from durapipe.runtime.checkpoint import (
    DEFAULT_KEEP,
    Committer,
    pending_requests,
    process_request,
    write_result,
)
from durapipe.runtime.podstatus import record_pod_status
from durapipe.runtime.store import Store, open_store

log = logging.getLogger("durapipe.agent")
#: Seconds of the grace period kept back so the agent exits before its own SIGKILL.
GRACE_MARGIN = 2.0
HEARTBEAT_FILE = "agent.json"


class UploadAgent:
    def __init__(self, spool_dir: Path, store: Store, *, keep: int = DEFAULT_KEEP) -> None:
        self.spool_dir = spool_dir
        self.committer = Committer(store, keep=keep)
        self.stopping = threading.Event()

    def drain_once(self) -> int:
        """Commit the newest pending request; older ones it supersedes share its result.

        Returns how many requests were settled.
        """
        requests = pending_requests(self.spool_dir)
        if not requests:
            return 0
        newest, older = requests[-1], requests[:-1]
        result = process_request(self.committer, self.spool_dir, newest)
        for request_dir in older:
            write_result(self.spool_dir, request_dir, dict(result, superseded=True))
            shutil.rmtree(request_dir, ignore_errors=True)
        return len(requests)

    def run(self, *, poll_seconds: float = 0.2, grace_seconds: float = 30.0) -> None:
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        (self.spool_dir / HEARTBEAT_FILE).write_text(json.dumps({"pid": os.getpid()}))
        while not self.stopping.is_set():
            if not self.drain_once():
                self.stopping.wait(poll_seconds)
        deadline = time.monotonic() + max(0.0, grace_seconds - GRACE_MARGIN)
        # Stages that save on SIGTERM hand over their final state a little after we got ours.
        while time.monotonic() < deadline:
            if not self.drain_once() and not _trainer_may_still_save(self.spool_dir):
                break
            time.sleep(poll_seconds)
        left = pending_requests(self.spool_dir)
        if left:
            log.error("exiting with %d checkpoint(s) not uploaded", len(left))


def _trainer_may_still_save(spool_dir: Path) -> bool:
    """A staging in progress shows as a ``.partial`` directory."""
    pending = spool_dir / "pending"
    return pending.is_dir() and any(p.name.endswith(".partial") for p in pending.iterdir())


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
    grace = float(os.environ.get(contract.ENV_GRACE_SECONDS) or 30)
    agent = UploadAgent(spool_dir, open_store(uri), keep=keep)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        agent.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    agent.run(poll_seconds=poll_seconds, grace_seconds=grace)
    # By now (Argo stops sidecars after the main container ends) the pod status says how the
    # main container ended, even when an OOM kill took the wrapper down with it.
    ending = record_pod_status(spool_dir)
    if ending is not None:
        log.info("main container ended: %s", json.dumps(ending))
    return 0
