"""The spool: saves staged on local disk, waiting for an uploader, and their results.

``<spool>/pending/<name>/`` holds one staged request (the data under ``files/``, then
``request.json``, written last and published by a rename); ``<spool>/done/<name>.json`` its
result for a waiter in another process; ``<spool>/retrying/<name>.json`` the last error of a
request the agent keeps retrying.  Staging is the only part of a save that blocks the caller.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from durapipe.runtime.errors import CheckpointError
from durapipe.runtime.hashing import (
    TreeEntry,
    copy_and_hash,
    default_algorithm,
    hash_bytes,
    walk_tree,
)
from durapipe.runtime.manifest import (
    BYTES_NAME,
    KIND_BYTES,
    KIND_DIR,
    KIND_FILE,
    check_saved_path,
    entry_to_json,
)

#: Inside a staged request: the data, and the request description written last.
STAGED_FILES = "files"
REQUEST_FILE = "request.json"
#: ``<spool>/retrying/<name>.json``: the last error of a request the agent keeps retrying.
RETRY_DIR = "retrying"

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
                entry_to_json(
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
                            entry_to_json(TreeEntry(relative, "symlink", digest=link_target))
                        )
                    elif stat.S_ISDIR(info.st_mode):
                        target.mkdir(parents=True, exist_ok=True)
                        entries.append(entry_to_json(TreeEntry(relative, "dir")))
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
