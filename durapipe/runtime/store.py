"""Object-store backends for checkpoints: the local filesystem, obstore (S3/GCS/Azure) and a
stdlib S3 client (:mod:`durapipe.runtime.s3`) for images without obstore.

All offer the handful of operations the commit protocol needs, with one error vocabulary:
:class:`NotFound`, :class:`AlreadyExists` (a create-only put lost), :class:`TransientStoreError`
(worth retrying) and anything else (a bug or a permission problem: not retried).
obstore is imported only when a remote URI is opened.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, ParamSpec, TypeVar
from urllib.parse import unquote, urlparse

from durapipe.runtime import contract
from durapipe.runtime.hashing import copy_and_hash, default_algorithm, hash_file, new_hasher
# Re-exported: every caller names the store's vocabulary through this module.
from durapipe.runtime.storebase import AlreadyExists as AlreadyExists
from durapipe.runtime.storebase import CorruptObject as CorruptObject
from durapipe.runtime.storebase import NotFound as NotFound
from durapipe.runtime.storebase import Store as Store
from durapipe.runtime.storebase import StoreError as StoreError
from durapipe.runtime.storebase import TransientStoreError as TransientStoreError
from durapipe.runtime.storebase import UnexpectedStoreFailure as UnexpectedStoreFailure
from durapipe.runtime.storebase import translate_failures as translate_failures

T = TypeVar("T")
P = ParamSpec("P")

#: Objects at least this large move in parallel parts.
PART_SIZE = 16 * 1024 * 1024
PART_CONCURRENCY = 8
#: A local temporary this old belongs to a writer that died (a live one writes it at once).
STALE_TEMPORARY_SECONDS = 600.0
#: Bounds on every S3/GCS/Azure request (obstore's ``client_options``; callers may override).
CLIENT_TIMEOUTS = {"connect_timeout": "5s", "timeout": "60s", "read_timeout": "20s"}
#: obstore's own retries of one request (the checkpoint layer retries whole operations).
OBSTORE_RETRIES = {"max_retries": 3, "retry_timeout": timedelta(seconds=30)}


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
        try:
            self._write(temporary, data)
            self._publish(temporary, target, create_only)
        finally:
            # A failed write (a full disk) must not leave its temporary behind: list() hides
            # them, so nothing would ever reclaim the space.
            temporary.unlink(missing_ok=True)

    def _write(self, temporary: Path, data: bytes) -> None:
        with open(temporary, "wb") as handle:
            handle.write(data)
            if self.fsync:
                handle.flush()
                os.fsync(handle.fileno())

    def put_file(
        self, key: str, path: Path, *, consume: bool = False, digest: str | None = None
    ) -> str:
        target = self._path(key)
        temporary = self._temporary(target)
        algorithm = digest.partition(":")[0] if digest else default_algorithm()
        try:
            # A file the caller gives up is linked, never moved: until the commit is durable
            # the caller's copy is what a restarted uploader starts again from.  Only a file
            # no other name links to is shared, or the store would share an inode the user
            # may rewrite.
            linked = False
            if consume and os.stat(path).st_nlink == 1:
                try:
                    os.link(path, temporary)
                    linked = True
                except OSError:
                    pass
            if linked and digest is not None:
                stored = digest  # hashed as it was staged, and a link does not copy data
                if self.fsync:
                    with open(temporary, "rb") as handle:
                        os.fsync(handle.fileno())
            else:
                if linked:
                    temporary.unlink()
                stored = self._copy(path, temporary, algorithm)
            if digest is not None and stored != digest:
                raise CorruptObject(f"{path} hashes to {stored}, expected {digest}")
            self._publish(temporary, target, create_only=False)
        finally:
            temporary.unlink(missing_ok=True)
        return stored

    def _copy(self, source: Path, temporary: Path, algorithm: str) -> str:
        stored, _ = copy_and_hash(source, temporary, algorithm)
        if self.fsync:
            with open(temporary, "rb") as handle:
                os.fsync(handle.fileno())
        return stored

    def fingerprint(self, key: str, algorithm: str) -> str | None:
        try:
            return hash_file(self._path(key), algorithm)
        except FileNotFoundError:
            return None

    def remove_stale_temporaries(self, older_than: float = STALE_TEMPORARY_SECONDS) -> int:
        """Delete temporaries a killed writer left behind; returns how many went."""
        removed = 0
        cutoff = time.time() - older_than
        for dirpath, _dirnames, filenames in os.walk(self.root):
            for name in filenames:
                if name.startswith(".tmp-"):
                    path = Path(dirpath) / name
                    try:
                        if path.stat().st_mtime < cutoff:
                            path.unlink()
                            removed += 1
                    except FileNotFoundError:
                        pass
        return removed

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

    def modified(self, key: str) -> float | None:
        # ctime: publishing links or renames the file, which sets it, while the mtime of a
        # linked staged file is when it was staged.
        try:
            return self._path(key).stat().st_ctime
        except FileNotFoundError:
            return None


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
        client_options = dict(config.pop("client_options", None) or {})
        if endpoint and str(endpoint).startswith("http://"):
            client_options.setdefault("allow_http", True)
        # A store that accepts connections and never answers must surface as an error, not a
        # hang: every request and every read of a response has a bound, and obstore's own
        # retries stop well inside a pod's grace period (the checkpoint layer retries too).
        for name, value in CLIENT_TIMEOUTS.items():
            client_options.setdefault(name, value)
        config["client_options"] = client_options
        config.setdefault("retry_config", dict(OBSTORE_RETRIES))
        self._store = from_url(self.uri, **config)
        #: Whether ETags are MD5s of the content (S3 without SSE-KMS), so an upload can be
        #: checked against the file without reading it back; ``None`` until known.
        self._etags_are_md5: bool | None = None if self.uri.startswith("s3") else False

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

    @translate_failures
    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        mode = "create" if create_only else "overwrite"
        self._call(lambda: self._obstore.put(self._store, key, data, mode=mode))

    @translate_failures
    def put_file(
        self, key: str, path: Path, *, consume: bool = False, digest: str | None = None
    ) -> str:
        # The body's SHA-256 is part of the request signature (obstore signs payloads), so
        # S3 itself rejects data damaged on the way; the ETag it answers identifies what it
        # stored and is recorded in the manifest for checks before reuse.
        result = self._call(
            lambda: self._obstore.put(
                self._store,
                key,
                path,
                chunk_size=PART_SIZE,
                max_concurrency=PART_CONCURRENCY,
            )
        )
        tag = str((result.get("e_tag") if isinstance(result, dict) else None) or "").strip('"')
        if self._etags_are_md5 is not False:
            expected = s3_etag(path, PART_SIZE)
            if tag != expected:
                # Damaged on the way (a store that checks the signed payload rejects that
                # itself), or a store whose ETags are not MD5s (SSE-KMS): reading the object
                # back tells which, once.
                if digest is None or not self._reads_back_as(key, path, digest):
                    raise TransientStoreError(
                        f"{key}: the stored object differs from {path.name} "
                        f"(ETag {tag or 'missing'}, expected {expected})"
                    )
                self._etags_are_md5 = False
        return f"etag:{tag}" if tag else (self.fingerprint(key, "") or "")

    def _reads_back_as(self, key: str, path: Path, digest: str) -> bool:
        scratch = path.with_name(f".readback-{uuid.uuid4().hex}")
        try:
            algorithm = digest.partition(":")[0]
            size = path.stat().st_size
            return self.get_file(key, scratch, size, algorithm=algorithm) == digest
        finally:
            scratch.unlink(missing_ok=True)

    @translate_failures
    def fingerprint(self, key: str, algorithm: str) -> str | None:
        try:
            meta = self._call(lambda: self._obstore.head(self._store, key))
        except NotFound:
            return None
        tag = str(meta.get("e_tag") or "").strip('"')
        return f"etag:{tag}" if tag else f"size:{meta['size']}"

    @translate_failures
    def get_bytes(self, key: str) -> bytes:
        return self._call(lambda: bytes(self._obstore.get(self._store, key).bytes()))

    @translate_failures
    def get_file(
        self, key: str, path: Path, size: int | None = None, *, algorithm: str | None = None
    ) -> str | None:
        hasher = new_hasher(algorithm) if algorithm else None
        if size is None or size >= 2 * PART_SIZE:
            # Ranges are cut from what the store holds, not from what the caller expects: a
            # range past the end of a truncated object makes obstore panic.  A short
            # download is the caller's to judge (it falls back to an older commit).
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

    @translate_failures
    def size(self, key: str) -> int | None:
        try:
            meta = self._call(lambda: self._obstore.head(self._store, key))
        except NotFound:
            return None
        return int(meta["size"])

    @translate_failures
    def list(self, prefix: str) -> list[str]:
        def collect() -> list[str]:
            return [
                str(meta["path"])
                for batch in self._obstore.list(self._store, prefix.rstrip("/") or None)
                for meta in batch
            ]

        return sorted(self._call(collect))

    @translate_failures
    def delete(self, key: str) -> None:
        try:
            self._call(lambda: self._obstore.delete(self._store, key))
        except NotFound:
            pass

    @translate_failures
    def modified(self, key: str) -> float | None:
        try:
            meta = self._call(lambda: self._obstore.head(self._store, key))
        except NotFound:
            return None
        return float(meta["last_modified"].timestamp())


def s3_etag(path: Path, part_size: int) -> str:
    """The ETag S3 gives ``path`` uploaded as obstore uploads it: the MD5 of a single part, or
    the MD5 of the parts' MD5s and their count for a multipart upload."""
    parts = []
    with open(path, "rb") as handle:
        while chunk := handle.read(part_size):
            parts.append(hashlib.md5(chunk, usedforsecurity=False).digest())
    if len(parts) <= 1:
        return (parts[0] if parts else hashlib.md5(b"", usedforsecurity=False).digest()).hex()
    combined = hashlib.md5(b"".join(parts), usedforsecurity=False).hexdigest()
    return f"{combined}-{len(parts)}"


class NoStoreClient(StoreError):
    """Nothing in this Python can open the URI (no obstore, and no stdlib client for it)."""


def obstore_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("obstore") is not None


def store_client(uri: str) -> str:
    """Which client would open ``uri``: ``local``, ``obstore`` or ``stdlib-s3``.

    obstore when the image has it (S3, GCS, Azure; multipart, parallel ranges); otherwise the
    runtime's own S3 client for ``s3://``; ``DURAPIPE_STORE_CLIENT`` forces one.  Raises
    :class:`NoStoreClient` with what to install when neither can.
    """
    scheme = urlparse(uri).scheme
    if scheme in ("", "file"):
        return "local"
    forced = os.environ.get(contract.ENV_STORE_CLIENT, "")
    if forced not in ("", "obstore", "stdlib"):
        raise NoStoreClient(f"{contract.ENV_STORE_CLIENT}={forced!r}: use obstore or stdlib")
    s3 = scheme in ("s3", "s3a")
    if forced == "stdlib" or (not forced and s3 and not obstore_importable()):
        if not s3:
            raise NoStoreClient(f"{uri}: the stdlib client speaks S3 only; install obstore "
                                "(pip install obstore) in the stage's image")
        return "stdlib-s3"
    if not obstore_importable():
        raise NoStoreClient(f"{uri}: needs obstore, which this Python ({sys.executable}) "
                            "cannot import; install it in the stage's image "
                            "(pip install obstore)")
    return "obstore"


def open_store(uri: str, **options: Any) -> Store:
    """A store for ``file:///path``, a plain path, or a remote URI (see :func:`store_client`)."""
    parsed = urlparse(uri)
    client = store_client(uri)
    if client == "local":
        path = unquote(parsed.path) if parsed.scheme == "file" else uri
        return LocalStore(path, **options)
    if client == "stdlib-s3":
        from durapipe.runtime.s3 import StdlibS3Store

        return StdlibS3Store(uri)
    return ObStore(uri, **options)
