"""The checkpoint store user code calls: ``save()`` / ``load()`` with a commit protocol.

Layout under the checkpoint URI::

    blobs/<algorithm>-<hex>         content-addressed file data, shared between commits
    manifests/<seq, 12 digits>.json  one per commit, written create-only

A save is staged locally (the only part that blocks the caller), then an uploader (a thread of
this process, or the sidecar agent reading the same spool directory) hashes the staged files,
uploads the blobs the previous commit does not already have, verifies their sizes in the store,
and commits by writing the manifest with a create-only put at the next sequence number.  After a
commit it deletes manifests beyond the newest ``keep`` and the blobs no kept manifest references.

``load()`` takes the newest manifest that parses, whose self-checksum matches and whose blobs all
download with the right size and digest; otherwise it falls back to the previous manifest.
Transient store errors are retried and, when they persist, raised: a store that cannot be read
is never reported as "no checkpoint".

Single writer per checkpoint line: the newest writer's claim (``writers/``) fences out an older
one of its run still running, and another run's only once its lease has lapsed (see
:class:`~durapipe.runtime.claim.LineClaim`; a restore claims the line first).
Manifests are untrusted input: :mod:`durapipe.runtime.manifest` checks each body before a
restore, which never creates or follows anything outside its directory.

This module is the user's API (:class:`Checkpoint`, docs/runtime.md); the protocol lives in
:mod:`~durapipe.runtime.spool` (staging), :mod:`~durapipe.runtime.commit` (uploading and
committing), :mod:`~durapipe.runtime.claim` (one writer per line),
:mod:`~durapipe.runtime.restore` and :mod:`~durapipe.runtime.deadline`.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import queue
import shutil
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from durapipe.runtime import contract, resume_report
from durapipe.runtime.claim import LineClaim
from durapipe.runtime.commit import DEFAULT_KEEP, Committer, UploadBackoff, attempt_request
from durapipe.runtime.deadline import Deadline, DeadlineStore, RestoreAbandoned, grace_from_env
from durapipe.runtime.errors import (
    CheckpointDeadlineExceeded,
    CheckpointError,
    LineBusy,
    LineTakenOver,
)
from durapipe.runtime.manifest import Commit
from durapipe.runtime.restore import Restored, restore_newest
from durapipe.runtime.spool import REQUEST_FILE, RETRY_DIR, pending_requests, settle, stage
from durapipe.runtime.store import Store, TransientStoreError, open_store
from durapipe.runtime.verdict import record_failure

log = logging.getLogger("durapipe.checkpoint")


def _ended(thread: threading.Thread, seconds: float) -> bool:
    thread.join(seconds)
    return not thread.is_alive()


# -- the user-facing object ---------------------------------------------------------------------


class SaveHandle:
    """A staged save.  ``wait()`` blocks until committed; ``await handle`` does the same."""

    def __init__(
        self, checkpoint: Checkpoint, request_name: str, deadline: Deadline | None = None
    ) -> None:
        self._checkpoint = checkpoint
        self.request_name = request_name
        #: Counted from the hand-over: every wait for this save without a timeout (``wait()``,
        #: ``flush()``, the exit hook) shares it.
        self.deadline = deadline or Deadline(checkpoint.grace_seconds)
        self._done = threading.Event()
        self._result: dict[str, Any] | None = None
        #: Saved by a process that is not the line's writer: nothing was staged.
        self.skipped = False
        #: The last failure of an attempt that is being retried (for the timeout message).
        self.last_error: str | None = None

    def _resolve(self, result: dict[str, Any]) -> None:
        self._result = result
        self._done.set()

    def done(self) -> bool:
        if self._done.is_set():
            return True
        return self._checkpoint.uploader == "sidecar" and self._checkpoint._poll_result(self)

    def wait(self, timeout: float | None = None) -> Commit | None:
        """Block until committed; raise :class:`CheckpointError` if it failed and
        :class:`CheckpointDeadlineExceeded` if it is not committed within ``timeout`` seconds
        (by default: what is left of this save's :class:`Deadline`; a timeout is counted from
        the call, and a stop request cuts either short at the stop deadline).  ``None`` for
        the save of a process that is not its line's writer (a torchrun rank other than 0),
        which stages and commits nothing."""
        if self.skipped:
            return None
        deadline = self.deadline if timeout is None else Deadline(self._checkpoint.grace_seconds,
                                                                  timeout)
        if not self._checkpoint._wait_result(self, deadline):
            raise self._checkpoint._deadline_error([self], deadline)
        assert self._result is not None
        if "error" in self._result:
            error = str(self._result["error"])
            # The uploader's own class where it says what happened to the line.
            kind = {"LineBusy": LineBusy, "LineTakenOver": LineTakenOver}.get(
                str(self._result.get("exception")))
            if kind is None:
                raise CheckpointError(error)
            raise kind(error.removeprefix(f"{kind.__name__}: "))
        return Commit(
            int(self._result["seq"]),
            str(self._result.get("kind", "")),
            {},
            int(self._result.get("uploaded_bytes", 0)),
            int(self._result.get("reused_bytes", 0)),
            tuple(self._result.get("repaired", ())),
        )

    def __await__(self) -> Generator[Any, None, Commit | None]:
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(None, self.wait).__await__()


@dataclass
class _Upload:
    request_dir: Path
    handle: SaveHandle


class Checkpoint:
    """Save and restore the checkpoints of one stage (one checkpoint line).

    ``uploader="thread"`` uploads from a background thread of this process; ``"sidecar"`` leaves
    staged requests in ``spool_dir`` for the upload agent (:mod:`durapipe.runtime.agent`).
    """

    def __init__(
        self,
        uri: str,
        *,
        path: str | os.PathLike[str] | None = None,
        keep: int = DEFAULT_KEEP,
        spool_dir: str | os.PathLike[str] | None = None,
        uploader: str = "thread",
        store: Store | None = None,
        load_attempts: int = 5,
        grace_seconds: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if uploader not in ("thread", "sidecar"):
            raise ValueError(f"uploader must be 'thread' or 'sidecar', got {uploader!r}")
        self.uri = uri
        self.store = store if store is not None else open_store(uri)
        self.path = Path(path) if path is not None else Path.cwd() / ".durapipe-checkpoint"
        self.keep = keep
        self.spool_dir = Path(spool_dir) if spool_dir is not None else self.path / ".spool"
        self.uploader = uploader
        self.load_attempts = load_attempts
        #: The pod's grace period: every wait without a timeout is bounded by it.
        self.grace_seconds = (grace_from_env() if grace_seconds is None
                              else contract.parse_grace_seconds(grace_seconds))
        ranks = os.environ if env is None else env
        #: torchrun's ranks (0 and 0 for one process).  Every process of a multi-node stage
        #: restores, each into a directory of its own; only global rank 0 writes, so the line
        #: keeps one writer however many processes call ``save``.
        self.rank = contract.distributed_rank(ranks, contract.ENV_RANK)
        self.local_rank = contract.distributed_rank(ranks, contract.ENV_LOCAL_RANK)
        #: Where to say what the first restore found (the compiled pod's, or the runner's).
        self._resume_report = ranks.get(contract.ENV_RESUME_REPORT) or None
        #: An earlier run's line to restore from while this one has no commit.
        self.resume_from = resume_from_line(ranks)
        #: The line the first restore read (``uri``, or ``resume_from``).
        self.restored_from = uri
        self._skip_logged = False
        self._restored: Restored | None = None
        #: A restore given up at its deadline that may still be running (see load_sync).
        self._restoring: threading.Thread | None = None
        self._queue: queue.Queue[_Upload | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._committer: Committer | None = None
        self._handles: dict[str, SaveHandle] = {}
        self._lock = threading.Lock()
        #: This process's hold on the line: taken at the first restore (or commit) and kept
        #: alive by a heartbeat until close() or exit.
        self._claim = LineClaim(self.store, env=ranks)
        self._exit_hook = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Checkpoint | None:
        """The checkpoint line the compiled pod describes, or ``None`` when it has none."""
        env = os.environ if env is None else env
        uri = env.get(contract.ENV_CHECKPOINT_URI)
        if not uri:
            return None
        return cls(
            uri,
            path=env.get(contract.ENV_CHECKPOINT_PATH) or None,
            keep=int(env.get(contract.ENV_CHECKPOINT_KEEP) or DEFAULT_KEEP),
            spool_dir=env.get(contract.ENV_SPOOL_DIR) or None,
            uploader=env.get(contract.ENV_UPLOADER) or "thread",
            grace_seconds=grace_from_env(env),
            env=env,
        )

    # -- save --------------------------------------------------------------------------------
    def save(
        self,
        data: bytes | bytearray | memoryview | str | os.PathLike[str],
        metadata: Mapping[str, Any] | None = None,
    ) -> SaveHandle:
        """Stage ``data`` (bytes, a file or a directory) and upload it in the background.

        Blocks only while the data is copied into the spool directory.  The returned handle
        can be waited on (``.wait()``) or awaited.  On a process that is not the line's
        writer (``is_writer`` false: torchrun rank > 0) it stages nothing and the handle's
        ``wait()`` returns ``None``: rank 0's save is the one the line keeps.
        """
        if not self.is_writer:
            if not self._skip_logged:
                self._skip_logged = True
                log.info("rank %d: checkpoint saves are rank 0's; this one is skipped", self.rank)
            skipped = SaveHandle(self, f"skipped-rank-{self.rank}")
            skipped.skipped = True
            skipped._done.set()
            return skipped
        request_dir = stage(data, self.spool_dir, metadata, restore_dir=self._restore_dir)
        handle = SaveHandle(self, request_dir.name)
        if self.uploader == "thread":
            with self._lock:
                self._handles[request_dir.name] = handle
            self._ensure_worker()
            self._queue.put(_Upload(request_dir, handle))
        return handle

    def save_sync(
        self,
        data: bytes | bytearray | memoryview | str | os.PathLike[str],
        metadata: Mapping[str, Any] | None = None,
    ) -> Commit | None:
        """Save and wait until committed (Flyte's ``save_sync``); ``None`` where
        :meth:`save` skips (not the line's writer)."""
        return self.save(data, metadata).wait()

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every save handed over so far is committed (or has failed).

        Raises :class:`CheckpointDeadlineExceeded`, naming what is not committed, when that
        takes longer than ``timeout`` (by default: each save's own :class:`Deadline`, so a
        save whose ``wait()`` already spent its bound is not waited for again)."""
        given = None if timeout is None else Deadline(self.grace_seconds, timeout)
        if self.uploader == "thread":
            with self._lock:
                handles = list(self._handles.values())
            late = [h for h in handles if not self._wait_result(h, given or h.deadline)]
            if late:
                raise self._deadline_error(late, given or late[0].deadline)
            return
        handles_by_name: dict[str, SaveHandle] = {}
        while True:
            pending = pending_requests(self.spool_dir)
            if not pending:
                return
            handles = [handles_by_name.setdefault(r.name, self._spooled_handle(r, given))
                       for r in pending]
            if all(handle.deadline.expired() for handle in handles):
                raise self._deadline_error(handles, handles[0].deadline)
            time.sleep(0.02)

    def _spooled_handle(self, request_dir: Path, deadline: Deadline | None) -> SaveHandle:
        """A handle on a request in the spool; its deadline counts from the hand-over (the
        request file is written last, just before it)."""
        if deadline is None:
            try:
                handed_over = (request_dir / REQUEST_FILE).stat().st_mtime
            except OSError:
                handed_over = time.time()
            deadline = Deadline.since(self.grace_seconds, handed_over)
        return SaveHandle(self, request_dir.name, deadline)

    def close(self) -> None:
        """Finish pending uploads (bounded like :meth:`flush`), stop the upload thread, and
        release the line (another run with the same inputs may take it at once)."""
        try:
            self.flush()
        finally:
            if self._worker is not None:
                self._queue.put(None)
                # A worker stuck in a store call is a daemon: it must not hold the exit.
                self._worker.join(timeout=1.0)
                self._worker = None
            with self._lock:
                if self._exit_hook:
                    atexit.unregister(self._flush_at_exit)
                    self._exit_hook = False
            self._claim.release()

    def _deadline_error(
        self, handles: list[SaveHandle], deadline: Deadline
    ) -> CheckpointDeadlineExceeded:
        names = ", ".join(handle.request_name for handle in handles)
        errors = sorted({h.last_error or self._retry_note(h) or "" for h in handles} - {""})
        message = deadline.exceeded(f"checkpoint save(s) {names} not committed")
        if errors:
            message += "; last error: " + "; ".join(errors)
        return CheckpointDeadlineExceeded(message)

    def _retry_note(self, handle: SaveHandle) -> str | None:
        if self.uploader != "sidecar":
            return None
        try:
            note = json.loads((self.spool_dir / RETRY_DIR / f"{handle.request_name}.json").read_text())
        except (OSError, ValueError):
            return None
        return str(note.get("error")) if isinstance(note, dict) else None

    def _flush_at_exit(self) -> None:
        # A script that ends without close() must not lose the saves it handed over, nor
        # hang its pod: the wait is bounded, and a missed deadline is said out loud.  Then
        # the line is released, so a run that ends frees it at once, not a lease later.
        with self._lock:
            pending = len(self._handles)
        try:
            if pending:
                log.info("waiting for %d checkpoint upload(s) before exiting", pending)
                try:
                    self.flush()
                except CheckpointDeadlineExceeded as error:
                    sys.stderr.write(f"durapipe: {error}\n")
                    record_failure(error)
        finally:
            # Once: the store may be gone by now, and an exit must not wait on it.
            self._claim.release(attempts=1)

    def _register_exit_hook(self) -> None:
        """Once: flush and release at exit (the caller holds ``_lock``)."""
        if not self._exit_hook:
            atexit.register(self._flush_at_exit)
            self._exit_hook = True

    def _ensure_worker(self) -> None:
        with self._lock:
            if self._worker is None:
                self._register_exit_hook()
                self._committer = Committer(self.store, keep=self.keep, claim=self._claim)
                self._worker = threading.Thread(
                    target=self._run_worker, name="durapipe-checkpoint-upload", daemon=True
                )
                self._worker.start()

    def _run_worker(self) -> None:
        assert self._committer is not None
        covered: list[SaveHandle] = []
        item: _Upload | None = None
        while True:
            if item is None:
                item = self._queue.get()
                if item is None:
                    return
                covered.append(item.handle)
            if self._queue.qsize() > 0:
                # A newer save is already waiting: uploading this one would only delay the
                # state a restart wants.  The newer commit resolves this handle too.
                shutil.rmtree(item.request_dir, ignore_errors=True)
                item = None
                continue
            backoff = UploadBackoff()
            result = attempt_request(self._committer, item.request_dir)
            while result.get("retryable"):
                # The store is failing, not the request: keep it and try again (a waiter's
                # bound decides how long anyone waits) unless a newer save supersedes it.
                for handle in covered:
                    handle.last_error = str(result["error"])
                try:
                    newer = self._queue.get(timeout=backoff.next())
                except queue.Empty:
                    result = attempt_request(self._committer, item.request_dir)
                    continue
                if newer is None:
                    return  # closed: the staged copy stays in the spool
                shutil.rmtree(item.request_dir, ignore_errors=True)
                item = newer
                covered.append(newer.handle)
                result = attempt_request(self._committer, item.request_dir)
            settle(self.spool_dir, item.request_dir, result, record=False)
            with self._lock:
                for handle in covered:
                    self._handles.pop(handle.request_name, None)
            for handle in covered:
                handle._resolve(result)
            covered = []
            item = None

    def _poll_result(self, handle: SaveHandle) -> bool:
        done = self.spool_dir / "done" / f"{handle.request_name}.json"
        try:
            handle._resolve(json.loads(done.read_text()))
        except (OSError, ValueError):
            return False
        return True

    def _wait_result(self, handle: SaveHandle, deadline: Deadline) -> bool:
        if self.uploader == "thread" or handle._done.is_set():
            return deadline.wait_for(handle._done.wait)

        def polled(seconds: float) -> bool:
            if self._poll_result(handle):
                return True
            time.sleep(min(seconds, 0.02))
            return False

        return deadline.wait_for(polled)

    # -- load --------------------------------------------------------------------------------
    def load_sync(self) -> Path | None:
        """Restore the newest committed checkpoint; its local path, or ``None`` if none exists.

        Raises :class:`CheckpointDeadlineExceeded` when the restore has not finished by its
        :class:`Deadline` (which begins with this call)."""
        if self._restored is None:
            self._restored = self._restore_before(Deadline(self.grace_seconds))
            self._report_restore(self._restored)
        return self._restored.path if self._restored else None

    def _report_restore(self, restored: Restored | None) -> None:
        """Say which commit the attempt resumed from (rank 0 only: one report per pod); a
        report that cannot be written costs `status` its detail, never the training."""
        if self._resume_report is None or not self.is_writer:
            return
        commit = restored.commit if restored is not None else None
        try:
            resume_report.write(self._resume_report, self.restored_from,
                                commit.seq if commit is not None else None,
                                commit.metadata if commit is not None else None)
        except OSError as error:
            log.warning("could not write the resume report %s: %s", self._resume_report, error)

    def _restore_before(self, deadline: Deadline) -> Restored | None:
        """:func:`restore_newest` on a thread of its own, waited for until ``deadline``: a
        store that never answers cannot hold the caller longer, whatever its client's own
        timeouts (obstore's requests take no deadline).  Given up, the thread stops at its
        next store request; a later restore into the same directory waits for it first."""
        previous = self._restoring
        if previous is not None and not deadline.wait_for(partial(_ended, previous)):
            raise CheckpointDeadlineExceeded(
                deadline.exceeded("the previous, abandoned restore has not stopped")
            )
        box: dict[str, Any] = {}

        def restore() -> None:
            try:
                self._take_line(deadline)
                box["restored"] = restore_newest(
                    DeadlineStore(self.store, deadline), self._restore_dir,
                    attempts=self.load_attempts, sleep=deadline.sleep,
                )
                if box["restored"] is None and self.resume_from is not None:
                    # Read only: the earlier run's line is neither claimed nor written.
                    box["restored"] = restore_newest(
                        DeadlineStore(open_store(self.resume_from), deadline),
                        self._restore_dir, attempts=self.load_attempts, sleep=deadline.sleep)
                    if box["restored"] is not None:
                        self.restored_from = self.resume_from
            except RestoreAbandoned:
                pass
            except BaseException as error:  # noqa: BLE001 (re-raised in the caller's thread)
                box["error"] = error

        worker = threading.Thread(target=restore, name="durapipe-checkpoint-restore",
                                  daemon=True)
        self._restoring = worker
        worker.start()
        if deadline.wait_for(partial(_ended, worker)):
            self._restoring = None
        if "error" in box:
            raise box["error"]
        if "restored" in box:
            restored: Restored | None = box["restored"]
            return restored
        raise CheckpointDeadlineExceeded(
            deadline.exceeded(f"checkpoint restore from {self.uri} not finished")
        )

    def _take_line(self, deadline: Deadline) -> None:
        """Before anything is restored: the writer claims the line (the upload thread's
        commits use that claim), so a run whose line another live run holds fails now with
        :class:`LineBusy`, not at its first commit; a later run with the same inputs finds
        this one's lease from here on.  With the sidecar, the agent claims; the trainer only
        waits as a claim would, so that it fails here too.  Other ranks neither."""
        if not self.is_writer:
            return
        via = DeadlineStore(self.store, deadline)
        if self.uploader == "sidecar":
            self._claim.wait_until_free(via=via, sleep=deadline.sleep)
            return
        self._claim.ensure(via=via, sleep=deadline.sleep)
        with self._lock:
            self._register_exit_hook()

    async def load_async(self) -> Path | None:
        return await asyncio.get_running_loop().run_in_executor(None, self.load_sync)

    def load(self) -> Any:
        """``load_sync()``; inside a running event loop, an awaitable of it (Flyte's ``load``)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self.load_sync()
        return self.load_async()

    @property
    def is_writer(self) -> bool:
        """Whether this process writes the line: the only process, or torchrun's rank 0."""
        return self.rank == 0

    @property
    def _restore_dir(self) -> Path:
        # Processes of one node share ``path``: concurrent restores into one directory would
        # replace each other's files, so each local rank but the first has its own.
        if self.local_rank == 0:
            return self.path / "restored"
        return self.path / f"restored.local-rank-{self.local_rank}"

    @property
    def restored_commit(self) -> Commit | None:
        return self._restored.commit if self._restored else None



def resume_from_line(env: Mapping[str, str]) -> str | None:
    """This stage's entry of ``DURAPIPE_CHECKPOINT_RESUME_FROM``; a value that is not such an
    object is said in the log and ignored (the stage starts from its own line)."""
    text = env.get(contract.ENV_CHECKPOINT_RESUME_FROM) or ""
    if not text.strip():
        return None
    try:
        lines = json.loads(text)
    except ValueError:
        lines = None
    if not isinstance(lines, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in lines.items()):
        log.error("%s is not a JSON object of stage names to checkpoint line URIs; ignored: "
                  "%.200r", contract.ENV_CHECKPOINT_RESUME_FROM, text)
        return None
    line = lines.get(env.get(contract.ENV_STAGE, ""))
    return line or None


def latest_checkpoint(
    root: str | os.PathLike[str] | None,
    glob_pattern: str = "**/last.ckpt",
    *,
    key: Callable[[Path], Any] | None = None,
) -> Path | None:
    """The newest match of ``glob_pattern`` under a restored tree (by mtime unless ``key``)."""
    if root is None:
        return None
    base = Path(root)
    if glob_pattern.startswith("**/"):
        matches: Iterable[Path] = base.rglob(glob_pattern[3:])
    else:
        matches = base.glob(glob_pattern)
    candidates = list(matches)
    if not candidates:
        return None
    return max(candidates, key=key or (lambda p: p.stat().st_mtime_ns))


__all__ = [
    "Checkpoint",
    "CheckpointDeadlineExceeded",
    "CheckpointError",
    "Commit",
    "Committer",
    "LineBusy",
    "LineTakenOver",
    "SaveHandle",
    "TransientStoreError",
    "latest_checkpoint",
    "restore_newest",
    "stage",
]
