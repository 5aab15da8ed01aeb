"""Object-store backends for checkpoints: the local filesystem (stdlib) and obstore (S3/GCS/Azure).

Both offer the handful of operations the commit protocol needs, with one error vocabulary:
:class:`NotFound`, :class:`AlreadyExists` (a create-only put lost), :class:`TransientStoreError`
(worth retrying) and anything else (a bug or a permission problem: not retried).
obstore is imported only when a remote URI is opened.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import unquote, urlparse

from durapipe.runtime.hashing import copy_and_hash, new_hasher

T = TypeVar("T")

#: Objects at least this large move in parallel parts.
PART_SIZE = 16 * 1024 * 1024
PART_CONCURRENCY = 8


class StoreError(Exception):
    """A store operation failed for a reason retrying will not fix."""


class NotFound(StoreError):
    pass


class AlreadyExists(StoreError):
    pass


class TransientStoreError(StoreError):
    """A network or server error: the same operation may succeed if retried."""


class Store(Protocol):
    """What the checkpoint commit protocol needs from a store.  Keys are ``/``-separated."""

    uri: str
    #: How many files the checkpoint code moves at once: more hides network latency, but a
    #: local disk copy is bound by memory bandwidth and only slows down when split.
    parallel_files: int

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> None: ...

    def put_file(self, key: str, path: Path, *, consume: bool = False) -> None:
        """Upload a local file.  ``consume``: the caller gives the file up (it may be moved)."""
        ...

    def get_bytes(self, key: str) -> bytes: ...

    def get_file(
        self, key: str, path: Path, size: int | None = None, *, algorithm: str | None = None
    ) -> str | None:
        """Download to ``path``; with ``algorithm``, also return the content digest computed
        while writing (one pass over the data instead of a second read)."""
        ...

    def size(self, key: str) -> int | None:
        """The object's size, or ``None`` when it does not exist."""
        ...

    def list(self, prefix: str) -> list[str]: ...

    def delete(self, key: str) -> None: ...


def retrying(
    operation: Callable[[], T],
    *,
    attempts: int = 5,
    base_delay: float = 0.05,
    max_delay: float = 2.0,
    sleep: Callable[[float], None] | None = None,
) -> T:
    """Run ``operation``, retrying :class:`TransientStoreError` with exponential backoff."""
    for index in range(attempts):
        try:
            return operation()
        except TransientStoreError:
            if index == attempts - 1:
                raise
            (sleep or time.sleep)(min(max_delay, base_delay * (2**index)))
    raise AssertionError("unreachable")


# -- local filesystem -------------------------------------------------------------------------


class LocalStore:
    """A directory as an object store.

    Writes go to a temporary file in the target directory first; ``os.replace`` publishes an
    overwrite and ``os.link`` a create-only write (it fails if the name exists), so readers
    never see a partial object.  ``fsync`` makes commits survive a machine crash, not only a
    process kill.
    """

    parallel_files = 1

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.uri = self.root.resolve().as_uri()
        self.fsync = fsync

    def _path(self, key: str) -> Path:
        parts = [part for part in key.split("/") if part]
        if not parts or any(part in (".", "..") for part in parts):
            raise ValueError(f"invalid key {key!r}")
        return self.root.joinpath(*parts)

    def _publish(self, temporary: Path, target: Path, create_only: bool) -> None:
        try:
            if create_only:
                try:
                    os.link(temporary, target)
                except FileExistsError:
                    raise AlreadyExists(f"{self.uri}/{target.relative_to(self.root)}") from None
            else:
                os.replace(temporary, target)
            if self.fsync:
                _fsync_dir(target.parent)
        finally:
            temporary.unlink(missing_ok=True)

    def _temporary(self, target: Path) -> Path:
        target.parent.mkdir(parents=True, exist_ok=True)
        return target.parent / f".tmp-{uuid.uuid4().hex}"

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        target = self._path(key)
        temporary = self._temporary(target)
        with open(temporary, "wb") as handle:
            handle.write(data)
            if self.fsync:
                handle.flush()
                os.fsync(handle.fileno())
        self._publish(temporary, target, create_only)

    def put_file(self, key: str, path: Path, *, consume: bool = False) -> None:
        target = self._path(key)
        temporary = self._temporary(target)
        # A consumed file that no other name links to can simply be moved in; a hard-linked
        # one must be copied, or the store would share an inode the user may rewrite.
        moved = False
        if consume and os.stat(path).st_nlink == 1:
            try:
                os.rename(path, temporary)
                moved = True
            except OSError:
                pass
        if not moved:
            shutil.copyfile(path, temporary)
        if self.fsync:
            with open(temporary, "rb") as handle:
                os.fsync(handle.fileno())
        self._publish(temporary, target, create_only=False)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise NotFound(key) from None

    def get_file(
        self, key: str, path: Path, size: int | None = None, *, algorithm: str | None = None
    ) -> str | None:
        try:
            if algorithm is None:
                shutil.copyfile(self._path(key), path)
                return None
            digest, _ = copy_and_hash(self._path(key), path, algorithm)
            return digest
        except FileNotFoundError:
            raise NotFound(key) from None

    def size(self, key: str) -> int | None:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return None

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix) if prefix.strip("/") else self.root
        if not base.is_dir():
            return []
        keys = []
        for dirpath, _dirnames, filenames in os.walk(base):
            for name in filenames:
                if name.startswith(".tmp-"):
                    continue
                keys.append((Path(dirpath) / name).relative_to(self.root).as_posix())
        return sorted(keys)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


def _fsync_dir(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


# -- obstore (S3, GCS, Azure) -----------------------------------------------------------------


class ObStore:
    """S3-compatible (and GCS/Azure) storage through obstore.

    Large uploads use obstore's parallel multipart upload; large downloads fetch ranges in
    parallel threads (obstore releases the GIL) and write them in place with ``pwrite``.
    """

    parallel_files = 4

    def __init__(self, uri: str, **options: Any) -> None:
        import obstore
        from obstore.store import from_url

        self._obstore = obstore
        self.uri = uri.rstrip("/")
        config = dict(options)
        endpoint = config.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint and str(endpoint).startswith("http://"):
            client_options = dict(config.pop("client_options", None) or {})
            client_options.setdefault("allow_http", True)
            config["client_options"] = client_options
        self._store = from_url(self.uri, **config)

    def _call(self, operation: Callable[[], T]) -> T:
        from obstore import exceptions

        try:
            return operation()
        except FileNotFoundError as error:
            raise NotFound(str(error)) from None
        except (exceptions.AlreadyExistsError, exceptions.PreconditionError) as error:
            raise AlreadyExists(str(error)) from None
        except (
            exceptions.PermissionDeniedError,
            exceptions.UnauthenticatedError,
            exceptions.InvalidPathError,
            exceptions.NotSupportedError,
            exceptions.UnknownConfigurationKeyError,
        ) as error:
            raise StoreError(f"{type(error).__name__}: {error}") from error
        except (exceptions.BaseError, OSError, TimeoutError) as error:
            raise TransientStoreError(f"{type(error).__name__}: {error}") from error

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        mode = "create" if create_only else "overwrite"
        self._call(lambda: self._obstore.put(self._store, key, data, mode=mode))

    def put_file(self, key: str, path: Path, *, consume: bool = False) -> None:
        self._call(
            lambda: self._obstore.put(
                self._store,
                key,
                path,
                chunk_size=PART_SIZE,
                max_concurrency=PART_CONCURRENCY,
            )
        )

    def get_bytes(self, key: str) -> bytes:
        return self._call(lambda: bytes(self._obstore.get(self._store, key).bytes()))

    def get_file(
        self, key: str, path: Path, size: int | None = None, *, algorithm: str | None = None
    ) -> str | None:
        hasher = new_hasher(algorithm) if algorithm else None
        if size is None:
            size = self.size(key)
            if size is None:
                raise NotFound(key)
        if size < 2 * PART_SIZE:
            data = self.get_bytes(key)
            path.write_bytes(data)
            if hasher is None:
                return None
            hasher.update(data)
            return f"{algorithm}:{hasher.hexdigest()}"
        starts = list(range(0, size, PART_SIZE))
        with open(path, "wb") as handle:
            # get_ranges fetches a batch of parts concurrently inside obstore (no GIL); batches
            # bound the memory held to PART_CONCURRENCY parts.
            for first in range(0, len(starts), PART_CONCURRENCY):
                batch = starts[first : first + PART_CONCURRENCY]
                ends = [min(size, start + PART_SIZE) for start in batch]
                fetch = partial(self._obstore.get_ranges, self._store, key, starts=batch, ends=ends)
                parts = self._call(fetch)
                for part in parts:
                    view = memoryview(part)
                    if hasher is not None:
                        hasher.update(view)
                    handle.write(view)
        return f"{algorithm}:{hasher.hexdigest()}" if hasher is not None else None

    def size(self, key: str) -> int | None:
        try:
            meta = self._call(lambda: self._obstore.head(self._store, key))
        except NotFound:
            return None
        return int(meta["size"])

    def list(self, prefix: str) -> list[str]:
        def collect() -> list[str]:
            return [
                str(meta["path"])
                for batch in self._obstore.list(self._store, prefix.rstrip("/") or None)
                for meta in batch
            ]

        return sorted(self._call(collect))

    def delete(self, key: str) -> None:
        try:
            self._call(lambda: self._obstore.delete(self._store, key))
        except NotFound:
            pass


def open_store(uri: str, **options: Any) -> Store:
    """A store for ``file:///path``, a plain path, or any URI obstore understands."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        path = unquote(parsed.path) if parsed.scheme == "file" else uri
        return LocalStore(path, **options)
    return ObStore(uri, **options)
