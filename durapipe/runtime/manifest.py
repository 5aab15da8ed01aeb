"""What a checkpoint manifest may say, checked before anything is restored from it.

A manifest's checksum proves it is whole, not who wrote it: anyone who can write the line's
prefix can plant one.  So a manifest body is untrusted input: :func:`check_body` accepts only
what the commit protocol writes (known kinds, digests of a known algorithm, relative paths a
restore can create below its own directory, no entry below a symlink or a file) and raises
``ValueError`` for anything else, which makes a restore fall back to the previous commit.
:func:`check_saved_path` is the save-time side: a path that a restore could not create is
refused when it is staged, not discovered when it is needed.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durapipe.runtime.hashing import TreeEntry, hash_bytes

MANIFEST_FORMAT = "durapipe-checkpoint/1"
KIND_BYTES, KIND_FILE, KIND_DIR = "bytes", "file", "dir"
BYTES_NAME = "payload"
ENTRY_KINDS = ("file", "dir", "symlink")
#: Linux's limits: bytes in one path component, and in a path (PATH_MAX less its NUL).
NAME_MAX = 255
PATH_MAX = 4095
#: The longest relative path a save accepts: the rest of PATH_MAX is left to the directory it
#: is restored under (``<DURAPIPE_CHECKPOINT_PATH>/restored.incoming``), which may be deep.
MAX_RELATIVE_PATH_BYTES = 2048
#: File digests: an algorithm the runtime hashes with, and 32 bytes of hex.
_DIGEST = re.compile(r"(sha256|blake3):[0-9a-f]{64}")
_TIME_NS_LIMIT = 2**63


def incoming_dir(destination: Path) -> Path:
    """Where a restore into ``destination`` builds the tree before swapping it in."""
    return destination.with_name(destination.name + ".incoming")


def _checked_path(path: object) -> str:
    """``path`` if it is a relative path a restore can create below its directory."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"entry path {path!r} is not a non-empty string")
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"entry path {path!r} is not UTF-8") from None
    if b"\0" in encoded or encoded.startswith(b"/"):
        raise ValueError(f"entry path {path!r} is absolute or holds a NUL")
    if len(encoded) > PATH_MAX:
        raise ValueError(f"entry path of {len(encoded)} bytes is longer than PATH_MAX")
    for part in encoded.split(b"/"):
        if part in (b"", b".", b".."):
            raise ValueError(f"entry path {path!r} has an empty, '.' or '..' component")
        if len(part) > NAME_MAX:
            raise ValueError(f"entry path {path[:40]!r}... has a component over NAME_MAX")
    return path


def _check_entry(entry: object, algorithm: str) -> tuple[str, str]:
    """``(path, kind)`` of one well-formed entry."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"entry {entry!r} is not an object")
    path, kind, digest = _checked_path(entry.get("path")), entry.get("kind"), entry.get("digest")
    if kind not in ENTRY_KINDS:
        raise ValueError(f"{path!r}: unknown entry kind {kind!r}")
    if not isinstance(entry.get("executable", False), bool):
        raise ValueError(f"{path!r}: 'executable' is not a boolean")
    size = entry.get("size")
    if type(size) is not int or size < 0:
        raise ValueError(f"{path!r}: size {size!r} is not a non-negative integer")
    mtime = entry.get("mtime_ns", 0)
    if type(mtime) is not int or not -_TIME_NS_LIMIT <= mtime < _TIME_NS_LIMIT:
        raise ValueError(f"{path!r}: mtime_ns {mtime!r} is out of range")
    if not isinstance(entry.get("stored", ""), str):
        raise ValueError(f"{path!r}: 'stored' is not a string")
    if kind == "file" and not (
        isinstance(digest, str) and _DIGEST.fullmatch(digest) and digest.startswith(algorithm)
    ):
        raise ValueError(f"{path!r}: {digest!r} is not a {algorithm} digest")
    if kind == "symlink":
        if not isinstance(digest, str) or not digest:
            raise ValueError(f"{path!r}: a symlink needs a target")
        try:
            encoded = os.fsencode(digest)  # a non-UTF-8 target was staged surrogate-escaped
        except UnicodeEncodeError:
            raise ValueError(f"{path!r}: symlink target is not a file name") from None
        if b"\0" in encoded or len(encoded) > PATH_MAX:
            raise ValueError(f"{path!r}: symlink target holds a NUL or exceeds PATH_MAX")
    return path, str(kind)


def check_entries(entries: object, algorithm: str) -> dict[str, str]:
    """Path -> kind for a well-formed list of entries, or ``ValueError``.

    Every path appears once, and no entry lies below a symlink (following it could leave the
    restore directory) or below a file.  Ancestors need not be listed: a file commit has none.
    """
    if not isinstance(entries, list):
        raise ValueError(f"entries are a {type(entries).__name__}, not a list")
    kinds: dict[str, str] = {}
    for entry in entries:
        path, kind = _check_entry(entry, algorithm)
        if path in kinds:
            raise ValueError(f"{path!r} appears twice")
        kinds[path] = kind
    for path in kinds:
        parts = path.split("/")
        for depth in range(1, len(parts)):
            above = kinds.get("/".join(parts[:depth]), "dir")
            if above != "dir":
                raise ValueError(f"{path!r} lies below a {above} entry")
    return kinds


def check_body(body: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` unless ``body`` is a manifest body the commit protocol could write."""
    if body.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"unknown manifest format {body.get('format')!r}")
    algorithm = body.get("algorithm")
    if algorithm not in ("sha256", "blake3"):
        raise ValueError(f"unknown hash algorithm {algorithm!r}")
    if not isinstance(body.get("metadata", {}), Mapping):
        raise ValueError("metadata is not an object")
    kinds = check_entries(body.get("entries"), str(algorithm))
    kind, name = body.get("kind"), body.get("name", "")
    if kind == KIND_DIR:
        return
    if kind not in (KIND_BYTES, KIND_FILE):
        raise ValueError(f"unknown checkpoint kind {kind!r}")
    expected = BYTES_NAME if kind == KIND_BYTES else name
    if not isinstance(expected, str) or "/" in expected or kinds != {expected: "file"}:
        raise ValueError(f"a {kind} checkpoint must hold exactly one file named {expected!r}")


def check_saved_path(relative: str, source: Path, restore_dir: Path | None) -> None:
    """Refuse (``ValueError``) a path a restore could not create.

    Longer than :data:`MAX_RELATIVE_PATH_BYTES`, or too long to restore under
    ``restore_dir`` (this trainer's own restore directory) within PATH_MAX.
    """
    size = len(relative.encode("utf-8", "surrogateescape"))
    if size > MAX_RELATIVE_PATH_BYTES:
        raise ValueError(
            f"cannot checkpoint {source}: its path in the checkpoint ({size} bytes) is longer "
            f"than {MAX_RELATIVE_PATH_BYTES} bytes, the most a restore can promise to create "
            f"(PATH_MAX is {PATH_MAX + 1} bytes, and the restore directory needs the rest)"
        )
    if restore_dir is not None:
        prefix = len(os.fsencode(incoming_dir(restore_dir))) + 1
        if prefix + size > PATH_MAX:
            raise ValueError(
                f"cannot checkpoint {source}: it could not be restored under "
                f"{incoming_dir(restore_dir)} ({prefix + size} bytes, over PATH_MAX); "
                "use a shorter checkpoint path or shorter names"
            )


# -- the line's layout and the manifest codec ------------------------------------------------

MANIFEST_DIR = "manifests"
BLOB_DIR = "blobs"


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


def manifest_key(seq: int) -> str:
    return f"{MANIFEST_DIR}/{seq:012d}.json"


def blob_key(digest: str) -> str:
    return f"{BLOB_DIR}/{digest.replace(':', '-')}"


def seq_of(key: str) -> int | None:
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


def entry_to_json(
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
