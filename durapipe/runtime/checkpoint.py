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

Single writer per checkpoint line: the compiler keys the line by run and stage, and the newest
writer's claim (``writers/``) fences out an older one still running (see :class:`LineClaim`).
Manifests are untrusted input: :mod:`durapipe.runtime.manifest` checks each body before a
restore, which never creates or follows anything outside its directory.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import json
import logging
import os
import queue
import shutil
import socket
import stat
import sys
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from durapipe.runtime import contract
from durapipe.runtime.hashing import (
    TreeEntry,
    copy_and_hash,
    default_algorithm,
    hash_bytes,
    hash_file,
    tree_entries,
    walk_tree,
)
from durapipe.runtime.manifest import (
    BYTES_NAME,
    KIND_BYTES,
    KIND_DIR,
    KIND_FILE,
    MANIFEST_FORMAT,
    PATH_MAX,
    check_body,
    check_saved_path,
    incoming_dir,
)
from durapipe.runtime.store import (
    AlreadyExists,
    CorruptObject,
    NotFound,
    Store,
    StoreError,
    TransientStoreError,
    UnexpectedStoreFailure,
    open_store,
    retrying,
)

log = logging.getLogger("durapipe.checkpoint")

MANIFEST_DIR = "manifests"
BLOB_DIR = "blobs"
DEFAULT_KEEP = 3
#: Downloads of a blob before its digest mismatch condemns the commit that references it.
DOWNLOAD_ATTEMPTS = 2
#: Inside a staged request: the data, and the request description written last.
STAGED_FILES = "files"
REQUEST_FILE = "request.json"
#: ``<spool>/retrying/<name>.json``: the last error of a request the agent keeps retrying.
RETRY_DIR = "retrying"
#: A blob no manifest references is collected only once it is this much older than the
#: collecting commit: younger, it may belong to another writer's commit still uploading.
UNREFERENCED_BLOB_GRACE_SECONDS = 3600.0


class CheckpointError(Exception):
    """Checkpoints exist but none could be restored, or a save failed."""


@dataclass(frozen=True)
class Commit:
    """A committed checkpoint."""

    seq: int
    kind: str
    metadata: dict[str, Any]
    uploaded_bytes: int = 0
    reused_bytes: int = 0
    #: Blobs found missing or corrupt before reuse, and uploaded again for this commit.
    repaired: tuple[str, ...] = ()


T = TypeVar("T")
_DONE = object()


def run_parallel(action: Callable[[T], None], items: Iterable[T], workers: int) -> None:
    """Apply ``action`` to every item on up to ``workers`` threads; re-raise the first error.

    Plain threads rather than ``concurrent.futures``: its executors refuse work once the
    interpreter starts shutting down, which is exactly when the exit hook flushes uploads.
    """
    pending = iter(list(items))
    errors: list[BaseException] = []
    lock = threading.Lock()

    def drain() -> None:
        while True:
            with lock:
                if errors:
                    return
                item = next(pending, _DONE)
            if item is _DONE:
                return
            try:
                action(item)  # type: ignore[arg-type]
            except BaseException as error:  # noqa: BLE001 (re-raised by the caller's thread)
                with lock:
                    errors.append(error)
                return

    if workers <= 1:
        drain()
    else:
        threads = [threading.Thread(target=drain, daemon=True) for _ in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if errors:
        raise errors[0]


# -- manifests ----------------------------------------------------------------------------------


def manifest_key(seq: int) -> str:
    return f"{MANIFEST_DIR}/{seq:012d}.json"


def blob_key(digest: str) -> str:
    return f"{BLOB_DIR}/{digest.replace(':', '-')}"


def _seq_of(key: str) -> int | None:
    name = key.rsplit("/", 1)[-1]
    stem = name[: -len(".json")] if name.endswith(".json") else ""
    return int(stem) if stem.isdigit() else None


def encode_manifest(body: Mapping[str, Any]) -> bytes:
    """Manifest bytes carrying a checksum over everything else, so a torn write is detected."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    checksum = hash_bytes(canonical.encode(), "sha256")
    return json.dumps({"checksum": checksum, "body": body}, sort_keys=True).encode()


def decode_manifest(data: bytes) -> dict[str, Any]:
    """The manifest body, or ``ValueError`` when the bytes are not an intact, well-formed
    manifest (see :mod:`durapipe.runtime.manifest`)."""
    outer = json.loads(data)
    if not isinstance(outer, dict) or not isinstance(outer.get("body"), dict):
        raise ValueError("not a manifest")  # noqa: TRY004 (callers treat ValueError as torn)
    body: dict[str, Any] = outer["body"]
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    if hash_bytes(canonical.encode(), "sha256") != outer.get("checksum"):
        raise ValueError("manifest checksum mismatch")
    # Whole is not the same as well-formed: the checksum does not say who wrote it.
    check_body(body)
    return body


def _entry_to_json(
    entry: TreeEntry, mtime_ns: int | None = None, stored: str | None = None
) -> dict[str, Any]:
    encoded: dict[str, Any] = {
        "path": entry.path,
        "kind": entry.kind,
        "executable": entry.executable,
        "size": entry.size,
        "digest": entry.digest,
    }
    if mtime_ns is not None:
        # Not part of the content identity; restored so "newest file" lookups still work.
        encoded["mtime_ns"] = mtime_ns
    if stored is not None:
        # The store's fingerprint of the verified blob, compared before the blob is reused.
        encoded["stored"] = stored
    return encoded


# -- one writer per line ------------------------------------------------------------------------

WRITER_DIR = "writers"


class LineTakenOver(CheckpointError):  # noqa: N818 (reads as what happened to the writer)
    """Another writer claimed this checkpoint line after this one: this one may not commit."""


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


# -- committing (the uploader side) -------------------------------------------------------------


class BlobMissing(CheckpointError):
    """A blob just uploaded is not in the store as written: worth committing again."""


class Committer:
    """Turns staged requests into commits in one store.  Used by the thread and the agent."""

    def __init__(self, store: Store, *, keep: int = DEFAULT_KEEP, algorithm: str | None = None):
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.store = store
        self.keep = keep
        self.algorithm = algorithm or default_algorithm()
        #: Blobs of the newest commit: digest -> (size, fingerprint recorded when the blob was
        #: uploaded and verified).  ``None``: read it from the store first.
        self._known: dict[str, tuple[int, str | None]] | None = None
        self._claim = LineClaim(store)

    def _committed_seqs(self) -> list[int]:
        keys = retrying(lambda: self.store.list(MANIFEST_DIR))
        return sorted(seq for seq in map(_seq_of, keys) if seq is not None)

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

        Raises :class:`LineTakenOver` once another writer has claimed the line."""
        self._claim.ensure()
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
                    _entry_to_json(entry, mtimes.get(entry.path), stored.get(entry.digest))
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
        self._claim.check()
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
            self._claim.check()
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


# -- loading ------------------------------------------------------------------------------------


@dataclass
class Restored:
    path: Path
    commit: Commit


def list_commits(store: Store) -> list[int]:
    """Sequence numbers of the manifests in ``store``, newest first (no retries here)."""
    keys = store.list(MANIFEST_DIR)
    return sorted((seq for seq in map(_seq_of, keys) if seq is not None), reverse=True)


def restore_newest(
    store: Store,
    destination: Path,
    *,
    attempts: int = 5,
    sleep: Callable[[float], None] | None = None,
) -> Restored | None:
    """Restore the newest verifying checkpoint into ``destination`` (replaced).

    Returns ``None`` only when the store holds no manifest at all.  Raises
    :class:`TransientStoreError` when the store keeps failing, and :class:`CheckpointError` when
    manifests exist but none verifies.
    """

    def again(operation: Callable[[], Any]) -> Any:
        return retrying(operation, attempts=attempts, sleep=sleep)

    seqs = again(lambda: list_commits(store))
    if not seqs:
        return None
    problems = []
    for seq in seqs:
        try:
            body = decode_manifest(again(partial(store.get_bytes, manifest_key(seq))))
            path = _materialise(store, body, destination, again)
        except (NotFound, ValueError, CheckpointError, UnexpectedStoreFailure) as error:
            # Deleted by retention meanwhile, torn, malformed, its data does not verify, or
            # the client fails on it (obstore panics on some damage): fall back.
            problems.append(f"#{seq}: {error}")
            log.warning("checkpoint %d unusable, trying the previous one: %s", seq, error)
            continue
        commit = Commit(seq, body["kind"], body.get("metadata", {}))
        return Restored(path, commit)
    raise CheckpointError("no committed checkpoint verifies: " + "; ".join(problems))


def _materialise(
    store: Store, body: Mapping[str, Any], destination: Path, again: Callable[[Any], Any]
) -> Path:
    """Restore a checked manifest body (see :func:`decode_manifest`) into ``destination``.

    Nothing is created or followed outside the tree being built: every path is created one
    component at a time below it, a component that is not a directory made here is refused,
    and symlink entries (which nothing in the manifest may lie below) are created last.
    """
    incoming = incoming_dir(destination)
    shutil.rmtree(incoming, ignore_errors=True)
    incoming.mkdir(parents=True)
    algorithm = body["algorithm"]
    try:
        files, links = _lay_out(body["entries"], incoming)

        def fetch(item: tuple[Mapping[str, Any], Path]) -> None:
            entry, target = item
            key = blob_key(entry["digest"])
            for attempt in range(DOWNLOAD_ATTEMPTS):
                digest = again(
                    lambda: store.get_file(key, target, entry["size"], algorithm=algorithm)
                )
                if target.stat().st_size != entry["size"]:
                    problem = "size mismatch"
                elif (digest or hash_file(target, algorithm)) != entry["digest"]:
                    problem = "digest mismatch"
                else:
                    break
                # Damaged on the way, or in the store: only another download tells which,
                # and falling back to an older commit for a flipped bit in transit loses work.
                log.warning("%s: %s (download %d)", entry["path"], problem, attempt + 1)
            else:
                raise CheckpointError(f"{entry['path']}: {problem}")
            if entry.get("executable"):
                target.chmod(target.stat().st_mode | 0o111)
            if "mtime_ns" in entry:
                os.utime(target, ns=(entry["mtime_ns"], entry["mtime_ns"]))

        run_parallel(fetch, files, store.parallel_files)
        for target_text, link in links:
            os.symlink(target_text, link)
        shutil.rmtree(destination, ignore_errors=True)
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.replace(incoming, destination)
    except BaseException:
        shutil.rmtree(incoming, ignore_errors=True)
        raise
    if body["kind"] == KIND_BYTES:
        return destination / BYTES_NAME
    if body["kind"] == KIND_FILE:
        return destination / str(body["name"])
    return destination


def _lay_out(
    entries: Iterable[Mapping[str, Any]], root: Path
) -> tuple[list[tuple[Mapping[str, Any], Path]], list[tuple[str, Path]]]:
    """Create the directories of a checked entry list below ``root``; return the files to
    download and the symlinks to create, each with its path."""
    room = PATH_MAX - len(os.fsencode(root)) - 1
    made: set[Path] = {root}
    files: list[tuple[Mapping[str, Any], Path]] = []
    links: list[tuple[str, Path]] = []
    for entry in sorted(entries, key=lambda e: str(e["path"])):
        relative = str(entry["path"])
        if len(relative.encode()) > room:
            raise CheckpointError(f"{relative[:60]}...: too long to restore under {root}")
        parts = relative.split("/")
        if entry["kind"] == "dir":
            _make_dirs(root, parts, made)
            continue
        _make_dirs(root, parts[:-1], made)
        target = root.joinpath(*parts)
        if entry["kind"] == "symlink":
            links.append((str(entry["digest"]), target))
        else:
            files.append((entry, target))
    return files, links


def _make_dirs(root: Path, parts: list[str], made: set[Path]) -> None:
    """``root/parts...`` as real directories, created here: a component that is anything else
    (a symlink above all) is refused rather than followed."""
    path = root
    for part in parts:
        path = path / part
        if path in made:
            continue
        try:
            os.mkdir(path)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                raise CheckpointError(f"{path.relative_to(root)} is not a directory") from None
        made.add(path)


# -- staging (the caller side) ------------------------------------------------------------------

_sequence = itertools.count()


def _stage_file(
    source: Path, target: Path, relative: str, algorithm: str, entries: list[dict[str, Any]]
) -> None:
    info = source.stat()
    digest, size = copy_and_hash(source, target, algorithm)
    if info.st_mode & 0o111:
        target.chmod(info.st_mode & 0o777)
    entries.append(
        {
            "path": relative,
            "kind": "file",
            "executable": bool(info.st_mode & stat.S_IXUSR),
            "size": size,
            "digest": digest,
            "mtime_ns": info.st_mtime_ns,
        }
    )


def stage(
    data: bytes | bytearray | memoryview | str | os.PathLike[str],
    spool_dir: Path,
    metadata: Mapping[str, Any] | None = None,
    *,
    restore_dir: Path | None = None,
) -> Path:
    """Copy ``data`` into a new request directory under ``spool_dir/pending`` and publish it.

    Files are hashed while they are copied (one pass), and the entries travel in the request,
    so the uploader does not read the data again to hash it.  The request becomes visible to
    uploaders only by the final rename, so a process killed while staging leaves a
    ``.partial`` directory that nobody uploads.  A path that could not be restored (longer
    than ``MAX_RELATIVE_PATH_BYTES``, or than PATH_MAX under ``restore_dir``) is refused with
    :class:`CheckpointError`.
    """
    algorithm = default_algorithm()
    pending = spool_dir / "pending"
    pending.mkdir(parents=True, exist_ok=True)
    name = f"{time.time_ns():020d}-{os.getpid()}-{next(_sequence):06d}"
    partial = pending / f"{name}.partial"
    files = partial / STAGED_FILES
    files.mkdir(parents=True)
    entries: list[dict[str, Any]] = []
    request: dict[str, Any] = {
        "metadata": dict(metadata or {}),
        "created": time.time(),
        "algorithm": algorithm,
    }
    try:
        if isinstance(data, (bytes, bytearray, memoryview)):
            (files / BYTES_NAME).write_bytes(data)
            entries.append(
                _entry_to_json(
                    TreeEntry(
                        BYTES_NAME, "file", size=len(data), digest=hash_bytes(data, algorithm)
                    )
                )
            )
            request["kind"] = KIND_BYTES
        else:
            source = Path(data)
            if source.is_dir():
                for relative, absolute, info in walk_tree(source):
                    _check_restorable(relative, absolute, restore_dir)
                    target = files / relative
                    if stat.S_ISLNK(info.st_mode):
                        target.parent.mkdir(parents=True, exist_ok=True)
                        link_target = os.readlink(absolute)
                        os.symlink(link_target, target)
                        entries.append(
                            _entry_to_json(TreeEntry(relative, "symlink", digest=link_target))
                        )
                    elif stat.S_ISDIR(info.st_mode):
                        target.mkdir(parents=True, exist_ok=True)
                        entries.append(_entry_to_json(TreeEntry(relative, "dir")))
                    elif stat.S_ISREG(info.st_mode):
                        target.parent.mkdir(parents=True, exist_ok=True)
                        _stage_file(absolute, target, relative, algorithm, entries)
                    else:
                        raise ValueError(f"cannot checkpoint {absolute}: not a regular file")
                request["kind"] = KIND_DIR
            elif source.is_file():
                _check_restorable(source.name, source, restore_dir)
                _stage_file(source, files / source.name, source.name, algorithm, entries)
                request["kind"] = KIND_FILE
                request["name"] = source.name
            else:
                raise FileNotFoundError(f"nothing to checkpoint at {source}")
        entries.sort(key=lambda entry: str(entry["path"]).encode())
        request["entries"] = entries
        (partial / REQUEST_FILE).write_text(json.dumps(request))
        final = pending / name
        os.replace(partial, final)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return final


def _check_restorable(relative: str, source: Path, restore_dir: Path | None) -> None:
    try:
        check_saved_path(relative, source, restore_dir)
    except ValueError as error:
        raise CheckpointError(str(error)) from None


def pending_requests(spool_dir: Path) -> list[Path]:
    pending = spool_dir / "pending"
    if not pending.is_dir():
        return []
    return sorted(p for p in pending.iterdir() if p.is_dir() and not p.name.endswith(".partial"))


def write_result(spool_dir: Path, request_dir: Path, result: Mapping[str, Any]) -> None:
    done = spool_dir / "done"
    done.mkdir(parents=True, exist_ok=True)
    temporary = done / f".{request_dir.name}.tmp"
    temporary.write_text(json.dumps(result))
    os.replace(temporary, done / f"{request_dir.name}.json")


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
        return {"error": f"{type(error).__name__}: {error}", "retryable": retryable}
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


def settle(
    spool_dir: Path, request_dir: Path, result: Mapping[str, Any], *, record: bool = True
) -> None:
    """A request is finished: (``record``) leave its result in ``spool/done`` for a waiter in
    another process, then drop the staged copy.  In this order, so a kill in between leaves
    a request that is committed again, never one that is lost."""
    if record:
        write_result(spool_dir, request_dir, result)
    shutil.rmtree(request_dir, ignore_errors=True)
    (spool_dir / RETRY_DIR / f"{request_dir.name}.json").unlink(missing_ok=True)


class Backoff:
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


# -- deadlines ----------------------------------------------------------------------------------

#: Seconds of the grace period kept back, so a bounded wait reports before the SIGKILL.
GRACE_MARGIN = 2.0
DEFAULT_GRACE_SECONDS = contract.DEFAULT_GRACE_SECONDS
#: Before a stop request, a wait without a timeout is bounded by this many grace periods.
RUNNING_BOUND_FACTOR = 60
_stop_signalled_at: float | None = None


class CheckpointDeadlineExceeded(CheckpointError, TimeoutError):
    """A save was not committed within its bound (derived from the pod's grace period)."""


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


class _RestoreAbandoned(BaseException):
    """Unwinds a restore whose caller gave up at its deadline, cleaning up what it wrote and
    past every fallback (nobody waits for an older commit either).  A ``BaseException`` so
    that no handler of store or manifest errors takes it for a reason to try another commit."""


class _DeadlineStore:
    """A store whose every call first checks a deadline: a restore given up by its caller
    stops at its next request instead of going on against a store that does not answer."""

    def __init__(self, store: Store, deadline: Deadline) -> None:
        self._store = store
        self._deadline = deadline
        self.uri = store.uri
        self.parallel_files = store.parallel_files

    def _check(self) -> Store:
        if self._deadline.expired():
            raise _RestoreAbandoned
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
        #: The last failure of an attempt that is being retried (for the timeout message).
        self.last_error: str | None = None

    def _resolve(self, result: dict[str, Any]) -> None:
        self._result = result
        self._done.set()

    def done(self) -> bool:
        if self._done.is_set():
            return True
        return self._checkpoint.uploader == "sidecar" and self._checkpoint._poll_result(self)

    def wait(self, timeout: float | None = None) -> Commit:
        """Block until committed; raise :class:`CheckpointError` if it failed and
        :class:`CheckpointDeadlineExceeded` if it is not committed within ``timeout`` seconds
        (by default: what is left of this save's :class:`Deadline`; a timeout is counted from
        the call, and a stop request cuts either short at the stop deadline)."""
        deadline = self.deadline if timeout is None else Deadline(self._checkpoint.grace_seconds,
                                                                  timeout)
        if not self._checkpoint._wait_result(self, deadline):
            raise self._checkpoint._deadline_error([self], deadline)
        assert self._result is not None
        if "error" in self._result:
            raise CheckpointError(self._result["error"])
        return Commit(
            int(self._result["seq"]),
            str(self._result.get("kind", "")),
            {},
            int(self._result.get("uploaded_bytes", 0)),
            int(self._result.get("reused_bytes", 0)),
            tuple(self._result.get("repaired", ())),
        )

    def __await__(self) -> Generator[Any, None, Commit]:
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
        self._restored: Restored | None = None
        #: A restore given up at its deadline that may still be running (see load_sync).
        self._restoring: threading.Thread | None = None
        self._queue: queue.Queue[_Upload | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._committer: Committer | None = None
        self._handles: dict[str, SaveHandle] = {}
        self._lock = threading.Lock()

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
        )

    # -- save --------------------------------------------------------------------------------
    def save(
        self,
        data: bytes | bytearray | memoryview | str | os.PathLike[str],
        metadata: Mapping[str, Any] | None = None,
    ) -> SaveHandle:
        """Stage ``data`` (bytes, a file or a directory) and upload it in the background.

        Blocks only while the data is copied into the spool directory.  The returned handle
        can be waited on (``.wait()``) or awaited.
        """
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
    ) -> Commit:
        """Save and wait until committed (Flyte's ``save_sync``)."""
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
        """Finish pending uploads (bounded like :meth:`flush`) and stop the upload thread."""
        try:
            self.flush()
        finally:
            if self._worker is not None:
                atexit.unregister(self._flush_at_exit)
                self._queue.put(None)
                # A worker stuck in a store call is a daemon: it must not hold the exit.
                self._worker.join(timeout=1.0)
                self._worker = None

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
        # hang its pod: the wait is bounded, and a missed deadline is said out loud.
        with self._lock:
            pending = len(self._handles)
        if pending:
            log.info("waiting for %d checkpoint upload(s) before exiting", pending)
            try:
                self.flush()
            except CheckpointDeadlineExceeded as error:
                sys.stderr.write(f"durapipe: {error}\n")
                _record_failure(error)

    def _ensure_worker(self) -> None:
        with self._lock:
            if self._worker is None:
                atexit.register(self._flush_at_exit)
                self._committer = Committer(self.store, keep=self.keep)
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
            backoff = Backoff()
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
        return self._restored.path if self._restored else None

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
                box["restored"] = restore_newest(
                    _DeadlineStore(self.store, deadline), self._restore_dir,
                    attempts=self.load_attempts, sleep=deadline.sleep,
                )
            except _RestoreAbandoned:
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
    def _restore_dir(self) -> Path:
        return self.path / "restored"

    @property
    def restored_commit(self) -> Commit | None:
        return self._restored.commit if self._restored else None


def _record_failure(error: BaseException) -> None:
    # Imported here: the SDK imports this module.
    from durapipe.runtime.sdk import record_failure

    record_failure(error)


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
    "CheckpointError",
    "Commit",
    "Committer",
    "LineTakenOver",
    "SaveHandle",
    "TransientStoreError",
    "latest_checkpoint",
    "restore_newest",
    "stage",
]
