"""Committing a checkpoint (the uploader side): staged request -> blobs -> manifest.

The uploader (a thread of the trainer, or the sidecar agent) hashes what :mod:`spool` staged,
uploads the blobs the previous commit does not already have, verifies their sizes in the
store, and commits by writing the manifest create-only at the next sequence number, while it
holds the line (:mod:`claim`).  After a commit it deletes manifests beyond the newest ``keep``
and the blobs no kept manifest references.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

from durapipe.runtime.claim import LineClaim
from durapipe.runtime.errors import BlobMissing, LineTakenOver
from durapipe.runtime.hashing import TreeEntry, default_algorithm, tree_entries
from durapipe.runtime.manifest import (
    BLOB_DIR,
    MANIFEST_DIR,
    MANIFEST_FORMAT,
    Commit,
    blob_key,
    decode_manifest,
    encode_manifest,
    entry_to_json,
    manifest_key,
    seq_of,
)
from durapipe.runtime.parallel import run_parallel
from durapipe.runtime.spool import REQUEST_FILE, STAGED_FILES
from durapipe.runtime.store import (
    AlreadyExists,
    CorruptObject,
    NotFound,
    Store,
    StoreError,
    retrying,
)

log = logging.getLogger("durapipe.checkpoint")

DEFAULT_KEEP = 3
#: A blob no manifest references is collected only once it is this much older than the
#: collecting commit: younger, it may belong to another writer's commit still uploading.
UNREFERENCED_BLOB_GRACE_SECONDS = 3600.0


class Committer:
    """Turns staged requests into commits in one store.  Used by the thread and the agent."""

    def __init__(
        self,
        store: Store,
        *,
        keep: int = DEFAULT_KEEP,
        algorithm: str | None = None,
        claim: LineClaim | None = None,
    ) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.store = store
        self.keep = keep
        self.algorithm = algorithm or default_algorithm()
        #: Blobs of the newest commit: digest -> (size, fingerprint recorded when the blob was
        #: uploaded and verified).  ``None``: read it from the store first.
        self._known: dict[str, tuple[int, str | None]] | None = None
        #: This writer's hold on the line (shared with a restore that claimed it first).
        self.claim = claim if claim is not None else LineClaim(store)

    def _committed_seqs(self) -> list[int]:
        keys = retrying(lambda: self.store.list(MANIFEST_DIR))
        return sorted(seq for seq in map(seq_of, keys) if seq is not None)

    def _load_known(self, seqs: list[int]) -> dict[str, tuple[int, str | None]]:
        for seq in reversed(seqs):
            try:
                body = decode_manifest(retrying(partial(self.store.get_bytes, manifest_key(seq))))
            except (NotFound, ValueError):
                continue
            return {
                e["digest"]: (e["size"], e.get("stored"))
                for e in body["entries"]
                if e["kind"] == "file"
            }
        return {}

    def commit(self, request_dir: Path) -> Commit:
        """Upload and commit one staged request directory (see :func:`stage`).

        Raises :class:`LineTakenOver` once another writer has claimed the line, and
        :class:`LineBusy` when another run's live lease keeps this writer from claiming it."""
        self.claim.ensure()
        request = json.loads((request_dir / REQUEST_FILE).read_text())
        files_root = request_dir / STAGED_FILES
        mtimes: dict[str, int] = {}
        if request.get("algorithm") == self.algorithm and "entries" in request:
            entries = [
                TreeEntry(e["path"], e["kind"], e["executable"], e["size"], e["digest"])
                for e in request["entries"]
            ]
            mtimes = {e["path"]: e["mtime_ns"] for e in request["entries"] if "mtime_ns" in e}
        else:
            entries = tree_entries(files_root, self.algorithm)
        seqs = self._committed_seqs()
        if self._known is None:
            self._known = self._load_known(seqs)
        known = self._known
        unique = {e.digest: e for e in entries if e.kind == "file"}
        #: digest -> the store's fingerprint of the verified blob, recorded in the manifest.
        stored: dict[str, str] = {}
        repaired: list[str] = []
        to_upload: list[TreeEntry] = []

        def check_reuse(entry: TreeEntry) -> None:
            # Deduplication trusts nothing it has not just checked: a blob is reused only while
            # the store still holds exactly what was verified when it was uploaded.
            size, fingerprint = known.get(entry.digest, (None, None))
            if size == entry.size and fingerprint is not None:
                key = blob_key(entry.digest)
                actual = retrying(lambda: self.store.fingerprint(key, self.algorithm))
                if actual == fingerprint:
                    stored[entry.digest] = actual
                    return
                log.warning(
                    "checkpoint blob %s is %s; uploading it again",
                    key,
                    "missing" if actual is None else "corrupt (it changed since it was verified)",
                )
                repaired.append(key)
            to_upload.append(entry)

        def upload(entry: TreeEntry) -> None:
            source = files_root / entry.path
            key = blob_key(entry.digest)
            stored[entry.digest] = retrying(
                lambda: self.store.put_file(key, source, consume=True, digest=entry.digest)
            )
            actual = retrying(lambda: self.store.size(key))
            if actual != entry.size:
                raise BlobMissing(f"blob {key} has size {actual}, expected {entry.size}")

        try:
            run_parallel(check_reuse, unique.values(), self.store.parallel_files)
            to_upload.sort(key=lambda entry: entry.path)
            run_parallel(upload, to_upload, self.store.parallel_files)
            body = {
                "format": MANIFEST_FORMAT,
                "kind": request["kind"],
                "name": request.get("name", ""),
                "metadata": request.get("metadata", {}),
                "created": request.get("created", time.time()),
                "algorithm": self.algorithm,
                "entries": [
                    entry_to_json(entry, mtimes.get(entry.path), stored.get(entry.digest))
                    for entry in entries
                ],
            }
            seq = self._publish(body, (seqs[-1] + 1) if seqs else 1)
        except BaseException as error:
            # Trust nothing next time; and what this attempt uploaded but no manifest refers
            # to goes now, or a full store would stay full until some later commit succeeds.
            # A writer that lost the line deletes nothing: the newer one may reuse those blobs.
            self._known = None
            if not isinstance(error, LineTakenOver):
                self._discard({blob_key(e.digest) for e in to_upload})
            raise
        self._known = {e.digest: (e.size, stored.get(e.digest)) for e in unique.values()}
        self._collect_garbage(seq)
        uploaded = sum(entry.size for entry in to_upload)
        reused = sum(e.size for e in entries if e.kind == "file") - uploaded
        return Commit(seq, request["kind"], body["metadata"], uploaded, reused, tuple(repaired))

    def _publish(self, body: dict[str, Any], seq: int) -> int:
        """Write the manifest create-only at ``seq`` or the next free number, while this
        writer holds the line (checked before, and after: a newer writer may have claimed it
        in between, and then this commit must not stand)."""
        self.claim.check()
        while True:
            body["seq"] = seq
            data = encode_manifest(body)
            try:
                retrying(partial(self.store.put_bytes, manifest_key(seq), data, create_only=True))
                break
            except AlreadyExists:
                # Another writer took this number; go after it (the check below decides).
                seq = max(self._committed_seqs() + [seq]) + 1
        try:
            self.claim.check()
        except LineTakenOver:
            try:
                retrying(partial(self.store.delete, manifest_key(seq)))
            except StoreError as error:
                log.warning("could not remove the manifest of a commit that lost its line: %s",
                            error)
            raise
        return seq

    def _referenced(self, seqs: Iterable[int]) -> set[str]:
        referenced: set[str] = set()
        for seq in seqs:
            try:
                body = decode_manifest(retrying(partial(self.store.get_bytes, manifest_key(seq))))
            except (NotFound, ValueError):
                continue
            referenced.update(blob_key(e["digest"]) for e in body["entries"] if e["kind"] == "file")
        return referenced

    def _discard(self, keys: set[str]) -> None:
        """Delete blobs of a failed commit that no manifest references (best effort)."""
        if not keys:
            return
        try:
            for key in sorted(keys - self._referenced(self._committed_seqs())):
                retrying(partial(self.store.delete, key))
        except (StoreError, OSError) as error:
            log.warning("could not remove the blobs of a failed checkpoint: %s", error)

    def _collect_garbage(self, newest: int) -> None:
        """Keep the newest ``keep`` manifests and the blobs they reference.

        A blob no manifest ever referenced (an upload of a commit still in flight, or the
        leftover of a killed writer) goes only once it is older, by the store's clock, than
        :data:`UNREFERENCED_BLOB_GRACE_SECONDS` before our manifest: a writer that lost the
        line while collecting must not delete what the new one is uploading.  Failures here
        are logged, not raised: the commit already happened.
        """
        try:
            sweep = getattr(self.store, "remove_stale_temporaries", None)
            if sweep is not None:
                sweep()
            seqs = self._committed_seqs()
            # Manifests above ours (another writer's) are never collected, nor their blobs.
            doomed = [s for s in seqs if s <= newest][: -self.keep]
            if not doomed:
                return
            retired = self._referenced(doomed)
            for seq in doomed:
                retrying(partial(self.store.delete, manifest_key(seq)))
            referenced = self._referenced(s for s in seqs if s not in doomed)
            # By the store's clock, so a skewed pod clock cannot make a fresh upload look old.
            written = retrying(partial(self.store.modified, manifest_key(newest)))
            for key in retrying(lambda: self.store.list(BLOB_DIR)):
                if key in referenced:
                    continue
                if key in retired or self._older_than_grace(key, written):
                    retrying(partial(self.store.delete, key))
        except Exception as error:  # noqa: BLE001 (a committed save must not fail here)
            log.warning("checkpoint garbage collection failed: %s: %s", type(error).__name__, error)

    def _older_than_grace(self, key: str, reference: float | None) -> bool:
        """Whether blob ``key`` was written a grace period before ``reference`` (unknown: no)."""
        if reference is None:
            return False
        modified = retrying(partial(self.store.modified, key))
        return modified is not None and modified < reference - UNREFERENCED_BLOB_GRACE_SECONDS


def attempt_request(committer: Committer, request_dir: Path) -> dict[str, Any]:
    """Try to commit one request once; the result says whether trying again may help
    (``"retryable"``).  Never raises: whatever went wrong, a waiter must hear about it."""
    try:
        commit = committer.commit(request_dir)
    except Exception as error:  # noqa: BLE001
        retryable = is_retryable(error)
        log.log(
            logging.WARNING if retryable else logging.ERROR,
            "checkpoint upload of %s failed%s: %s",
            request_dir.name,
            " (will retry)" if retryable else "",
            error,
        )
        return {"error": f"{type(error).__name__}: {error}", "retryable": retryable,
                "exception": type(error).__name__}
    result: dict[str, Any] = {
        "seq": commit.seq,
        "kind": commit.kind,
        "uploaded_bytes": commit.uploaded_bytes,
        "reused_bytes": commit.reused_bytes,
    }
    if commit.repaired:
        result["repaired"] = list(commit.repaired)
    return result


def is_retryable(error: BaseException) -> bool:
    """Errors of the store or the network, including refusals (a 403 while credentials are
    rotated looks like one that lasts): retried until the waiter's deadline, which then names
    the last error.  A request that cannot be committed (its staged data is gone or damaged)
    or a local disk that refuses it (full, read-only) is reported at once."""
    if isinstance(error, CorruptObject):
        return False
    return isinstance(error, (StoreError, BlobMissing, TimeoutError, ConnectionError))



class UploadBackoff:
    """Delays between attempts to commit: doubling from ``first`` up to ``cap``."""

    def __init__(self, first: float = 0.2, cap: float = 5.0) -> None:
        self.first, self.cap = first, cap
        self.current = first

    def next(self) -> float:
        delay = self.current
        self.current = min(self.cap, self.current * 2)
        return delay

    def reset(self) -> None:
        self.current = self.first
