"""Content hashing of bytes, files and directory trees.

Digests are strings prefixed with their algorithm (``blake3:<hex>`` or ``sha256:<hex>``) so two
environments that hash differently produce different strings (a cache miss), never a collision.
BLAKE3 is used when the ``blake3`` wheel is importable (about 2x SHA-256 per core and it scales
with threads); pods that run the stdlib-only zipapp fall back to SHA-256.  ``DURAPIPE_CONTENT_HASH``
forces one algorithm everywhere when a deployment wants stable digests across mixed images.

A directory digest is a Merkle hash: one line per entry, sorted by the UTF-8 bytes of the relative
POSIX path, carrying the entry kind, the executable bit (not the full mode: umask differences
would make identical trees differ), the size and the file digest or symlink target.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from durapipe.runtime import contract

ENV_CONTENT_HASH = contract.ENV_CONTENT_HASH
_CHUNK = 8 * 1024 * 1024
#: Files at least this large are hashed through mmap by blake3 with all cores.
_MMAP_THRESHOLD = 16 * 1024 * 1024
TREE_HEADER = b"durapipe-tree-v1\n"


class _Hasher(Protocol):
    def update(self, data: bytes | bytearray | memoryview, /) -> object: ...

    def hexdigest(self) -> str: ...


def _blake3_available() -> bool:
    try:
        import blake3  # noqa: F401
    except ImportError:
        return False
    return True


def default_algorithm() -> str:
    """The algorithm content digests use in this environment."""
    forced = os.environ.get(ENV_CONTENT_HASH, "").strip().lower()
    if forced in ("sha256", "blake3"):
        if forced == "blake3" and not _blake3_available():
            raise RuntimeError(f"{ENV_CONTENT_HASH}=blake3 but the blake3 package is not installed")
        return forced
    if forced:
        raise ValueError(f"{ENV_CONTENT_HASH} must be 'sha256' or 'blake3', got {forced!r}")
    return "blake3" if _blake3_available() else "sha256"


def new_hasher(algorithm: str | None = None) -> _Hasher:
    algorithm = algorithm or default_algorithm()
    if algorithm == "blake3":
        import blake3

        hasher: _Hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
        return hasher
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown hash algorithm {algorithm!r}")


def hash_bytes(data: bytes | bytearray | memoryview, algorithm: str | None = None) -> str:
    algorithm = algorithm or default_algorithm()
    hasher = new_hasher(algorithm)
    hasher.update(data)
    return f"{algorithm}:{hasher.hexdigest()}"


def hash_file(path: str | os.PathLike[str], algorithm: str | None = None) -> str:
    """Digest of one file's bytes."""
    algorithm = algorithm or default_algorithm()
    hasher = new_hasher(algorithm)
    size = os.path.getsize(path)
    if algorithm == "blake3" and size >= _MMAP_THRESHOLD:
        # update_mmap lets blake3 hash with every core without copying through Python.
        hasher.update_mmap(os.fspath(path))  # type: ignore[attr-defined]
    else:
        buffer = bytearray(min(_CHUNK, max(size, 1)))
        view = memoryview(buffer)
        with open(path, "rb", buffering=0) as handle:
            while True:
                count = handle.readinto(buffer)
                if not count:
                    break
                hasher.update(view[:count])
    return f"{algorithm}:{hasher.hexdigest()}"


def copy_and_hash(
    source: str | os.PathLike[str], target: str | os.PathLike[str], algorithm: str | None = None
) -> tuple[str, int]:
    """Copy a file and hash it in the same pass; returns ``(digest, size)``.

    One read of the data instead of a copy followed by a second read for hashing.
    """
    algorithm = algorithm or default_algorithm()
    hasher = new_hasher(algorithm)
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    size = 0
    with open(source, "rb", buffering=0) as reader, open(target, "wb", buffering=0) as writer:
        while count := reader.readinto(buffer):
            hasher.update(view[:count])
            # An unbuffered write may be short (a disk filling up): write the rest, which
            # then fails with ENOSPC instead of leaving a silently truncated copy.
            pending = view[:count]
            while pending:
                pending = pending[writer.write(pending) or 0 :]
            size += count
    return f"{algorithm}:{hasher.hexdigest()}", size


@dataclass(frozen=True)
class TreeEntry:
    """One entry of a directory tree, as it enters the Merkle hash."""

    path: str  # relative POSIX path
    kind: str  # "file", "dir" or "symlink"
    executable: bool = False
    size: int = 0
    digest: str = ""  # file digest, or the link target for a symlink

    def line(self) -> bytes:
        flag = "x" if self.executable else "-"
        return f"{self.kind}\0{self.path}\0{flag}\0{self.size}\0{self.digest}\n".encode()


def walk_tree(root: Path) -> Iterator[tuple[str, Path, os.stat_result]]:
    """Yield ``(relative posix path, absolute path, lstat)`` for every entry under ``root``.

    Symlinks are not followed; the order is unspecified (callers sort).
    """
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        for name in dirnames + filenames:
            absolute = base / name
            relative = absolute.relative_to(root).as_posix()
            yield relative, absolute, absolute.lstat()


def tree_entries(
    root: str | os.PathLike[str],
    algorithm: str | None = None,
    file_digest: Callable[[Path], str] | None = None,
) -> list[TreeEntry]:
    """All entries under ``root`` sorted by the bytes of their relative path."""
    algorithm = algorithm or default_algorithm()
    root_path = Path(root)
    entries: list[TreeEntry] = []
    for relative, absolute, info in walk_tree(root_path):
        if stat.S_ISLNK(info.st_mode):
            entries.append(TreeEntry(relative, "symlink", digest=os.readlink(absolute)))
        elif stat.S_ISDIR(info.st_mode):
            entries.append(TreeEntry(relative, "dir"))
        elif stat.S_ISREG(info.st_mode):
            digest = file_digest(absolute) if file_digest else hash_file(absolute, algorithm)
            entries.append(
                TreeEntry(
                    relative,
                    "file",
                    executable=bool(info.st_mode & stat.S_IXUSR),
                    size=info.st_size,
                    digest=digest,
                )
            )
        else:
            raise ValueError(f"cannot hash {absolute}: not a file, directory or symlink")
    entries.sort(key=lambda entry: entry.path.encode())
    return entries


def hash_entries(entries: list[TreeEntry], algorithm: str | None = None) -> str:
    algorithm = algorithm or default_algorithm()
    hasher = new_hasher(algorithm)
    hasher.update(TREE_HEADER)
    for entry in entries:
        hasher.update(entry.line())
    return f"{algorithm}:{hasher.hexdigest()}"


def hash_tree(root: str | os.PathLike[str], algorithm: str | None = None) -> str:
    """Merkle digest of a directory (see the module docstring for the encoding)."""
    algorithm = algorithm or default_algorithm()
    return hash_entries(tree_entries(root, algorithm), algorithm)


def hash_path(path: str | os.PathLike[str], algorithm: str | None = None) -> str:
    """Digest of a file or a directory tree; what output hashes and cache keys use."""
    if os.path.isdir(path):
        return hash_tree(path, algorithm)
    if os.path.isfile(path):
        return hash_file(path, algorithm)
    raise FileNotFoundError(f"no file or directory at {os.fspath(path)}")
