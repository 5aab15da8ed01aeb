"""The main container's liveness, as the upload sidecar sees it: a file in the shared spool
that the wrapper (``durapipe-runtime exec``) rewrites every ``BEAT_SECONDS`` while the stage's
command runs, and removes once it has ended.

Why: on a preemption the kubelet (and Argo's wait container) signal both containers at once.
A trainer that saves on SIGTERM stages its final checkpoint a moment, or a whole training step,
after the agent got its own SIGTERM; an agent that left at its first idle poll lost that save
and held the trainer's ``close()`` for the whole grace period (seen on the real node: the pod
lingered 5 minutes and the save never reached the store).  The containers need not share a
process namespace, so liveness is a beat, not a pid: a wrapper killed outright stops beating
and the agent stops waiting ``STALE_SECONDS`` later."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

MAIN_BEAT_FILE = "main.alive"
BEAT_SECONDS = 1.0
#: A beat older than this belongs to a wrapper that was killed (SIGKILL, an OOM kill).
STALE_SECONDS = 5.0


class MainBeat:
    """Beats from :meth:`start` until :meth:`stop`, which removes the file."""

    def __init__(self, spool_dir: str | os.PathLike[str]) -> None:
        self.path = Path(spool_dir) / MAIN_BEAT_FILE
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="durapipe-main-beat",
                                        daemon=True)

    def start(self) -> MainBeat:
        self._beat()
        self._thread.start()
        return self

    def _beat(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_name(f".{self.path.name}.tmp")
            temporary.write_text(json.dumps({"pid": os.getpid(), "time": time.time()}))
            os.replace(temporary, self.path)
        except OSError:
            pass  # the agent then waits less for a final save; the attempt itself goes on

    def _run(self) -> None:
        while not self._stopped.wait(BEAT_SECONDS):
            self._beat()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(BEAT_SECONDS * 2)
        try:
            self.path.unlink()
        except OSError:
            pass


def main_may_still_save(spool_dir: Path, now: float | None = None) -> bool:
    """Whether the main container's command still runs, by its beat's age."""
    try:
        beat = (spool_dir / MAIN_BEAT_FILE).stat().st_mtime
    except OSError:
        return False
    return (time.time() if now is None else now) - beat < STALE_SECONDS
