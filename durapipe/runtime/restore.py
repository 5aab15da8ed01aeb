"""Restoring a checkpoint: the newest manifest that verifies, materialised below one directory.

``restore_newest`` takes the newest manifest that parses, whose self-checksum matches and whose
blobs all download with the right size and digest; otherwise it falls back to the previous
manifest.  Transient store errors are retried and, when they persist, raised: a store that
cannot be read is never reported as "no checkpoint".  Manifest bodies are checked
(:mod:`manifest`) before anything is created, and nothing is created or followed outside the
directory being restored.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from durapipe.runtime.errors import CheckpointError
from durapipe.runtime.hashing import hash_file
from durapipe.runtime.manifest import (
    BYTES_NAME,
    KIND_BYTES,
    KIND_FILE,
    MANIFEST_DIR,
    PATH_MAX,
    Commit,
    blob_key,
    decode_manifest,
    incoming_dir,
    manifest_key,
    seq_of,
)
from durapipe.runtime.parallel import run_parallel
from durapipe.runtime.store import NotFound, Store, UnexpectedStoreFailure, retrying

log = logging.getLogger("durapipe.checkpoint")

#: Downloads of a blob before its digest mismatch condemns the commit that references it.
DOWNLOAD_ATTEMPTS = 2


@dataclass
class Restored:
    path: Path
    commit: Commit


def list_commits(store: Store) -> list[int]:
    """Sequence numbers of the manifests in ``store``, newest first (no retries here)."""
    keys = store.list(MANIFEST_DIR)
    return sorted((seq for seq in map(seq_of, keys) if seq is not None), reverse=True)


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
