"""What every store client shares: the :class:`Store` protocol and its errors.

Below :mod:`store` (the local and obstore clients, and ``open_store``, which picks a client) and
:mod:`s3` (the stdlib S3 client), so that neither imports the other's module to speak the
same vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import ParamSpec, Protocol, TypeVar

T = TypeVar("T")
P = ParamSpec("P")


class StoreError(Exception):
    """A store operation failed for a reason retrying will not fix."""


class NotFound(StoreError):
    pass


class AlreadyExists(StoreError):
    pass


class TransientStoreError(StoreError):
    """A network or server error: the same operation may succeed if retried."""


class CorruptObject(StoreError):
    """Data did not match the digest it was stored under."""


class UnexpectedStoreFailure(StoreError):
    """A store client failed in a way it does not classify: a panic in obstore's Rust code
    (``pyo3_runtime.PanicException``, a ``BaseException``), an exception a client library
    should not raise, an answer that does not parse.  A restore treats the commit it was
    reading as unusable and falls back; a commit retries it like any store error."""


#: What a store call lets through untranslated: its own vocabulary, local I/O errors (a full
#: disk is reported as such), and the interpreter being interrupted or told to exit.
_NOT_TRANSLATED = (StoreError, OSError, KeyboardInterrupt, SystemExit, GeneratorExit)


def translate_failures(method: Callable[P, T]) -> Callable[P, T]:
    """Make every other failure of a store method an :class:`UnexpectedStoreFailure`."""

    @wraps(method)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return method(*args, **kwargs)
        except _NOT_TRANSLATED:
            raise
        except BaseException as error:  # noqa: BLE001 (PanicException is a BaseException)
            store, key = (args + (None, None))[:2]
            where = f"{getattr(store, 'uri', '?')} {method.__name__}({key!r})"
            raise UnexpectedStoreFailure(f"{where}: {type(error).__name__}: {error}") from error

    return call


class Store(Protocol):
    """What the checkpoint commit protocol needs from a store.  Keys are ``/``-separated."""

    uri: str
    #: How many files the checkpoint code moves at once: more hides network latency, but a
    #: local disk copy is bound by memory bandwidth and only slows down when split.
    parallel_files: int

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> None: ...

    def put_file(
        self, key: str, path: Path, *, consume: bool = False, digest: str | None = None
    ) -> str:
        """Upload a local file and return the stored object's :meth:`fingerprint`.

        ``consume``: the caller will neither change the file nor need it changed, so the store
        may share it (a hard link) instead of copying; the file itself stays where it is until
        the caller removes it.  ``digest``: the content digest the caller expects; a store that
        reads the data while storing it checks it and raises :class:`CorruptObject`.
        """
        ...

    def fingerprint(self, key: str, algorithm: str) -> str | None:
        """What identifies the stored content: the content digest where the store can compute
        it cheaply (a local file is re-read), else the store's own checksum (S3's ETag).  It
        changes whenever the object's content does; ``None`` when the object does not exist."""
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

    def modified(self, key: str) -> float | None:
        """When the object was last written, in seconds since the epoch by the store's clock
        (compare it only with another object's); ``None`` when it does not exist."""
        ...
