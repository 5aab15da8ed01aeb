"""Stage cache keys: one pure function the compiler and the local runner both call.

The key is the SHA-256 of a canonical JSON encoding of the record.  SHA-256 (not BLAKE3) because
the record is a few kilobytes and the key must be identical on every machine whatever is
installed there; the large inputs enter the record already hashed (``upstream``), and those
content digests are where the fast hash pays off (:mod:`durapipe.runtime.hashing`).

Canonical means: object keys sorted, no insignificant whitespace, UTF-8, integers as integers,
floats in Python's shortest round-trip form, NaN and infinities rejected, and only the fields
listed in :data:`RECORD_FIELDS` accepted, so a typo cannot silently drop out of the key.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, TypedDict

#: Bump when the meaning of a record field changes: every key changes with it.
CACHE_KEY_SCHEMA_VERSION: Final = 1


class CacheKeyRecord(TypedDict):
    """The canonical inputs of a stage's cache key."""

    schema_version: int
    #: Image digest (``repo@sha256:...``) or tag; digests make keys reproducible, tags do not.
    image: str
    #: The stage command as an argv list.
    command: list[str]
    #: Only the environment variables allowlisted as result-affecting.
    env: dict[str, str]
    #: Parameter values (JSON values).
    params: dict[str, Any]
    #: The user's cache version salt ("" when none).
    salt: str
    #: Content digest of each upstream input, by input name.
    upstream: dict[str, str]


RECORD_FIELDS: Final = frozenset(CacheKeyRecord.__annotations__)


def make_record(
    *,
    image: str,
    command: Sequence[str],
    env: Mapping[str, str] | None = None,
    params: Mapping[str, Any] | None = None,
    salt: str = "",
    upstream: Mapping[str, str] | None = None,
) -> CacheKeyRecord:
    """Build a record with the current schema version."""
    return CacheKeyRecord(
        schema_version=CACHE_KEY_SCHEMA_VERSION,
        image=image,
        command=list(command),
        env=dict(env or {}),
        params=dict(params or {}),
        salt=salt,
        upstream=dict(upstream or {}),
    )


def _check_json_value(value: object, where: str) -> None:
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: {value!r} has no canonical JSON form")
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_json_value(item, f"{where}[{index}]")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: object keys must be strings, got {key!r}")
            _check_json_value(item, f"{where}.{key}")
        return
    raise TypeError(f"{where}: {type(value).__name__} is not a JSON value")


def validate_record(record: Mapping[str, Any]) -> None:
    """Raise ``ValueError``/``TypeError`` unless ``record`` is a well-formed cache-key record."""
    missing = RECORD_FIELDS - record.keys()
    unknown = record.keys() - RECORD_FIELDS
    if missing or unknown:
        raise ValueError(
            f"cache-key record: missing fields {sorted(missing)}, unknown fields {sorted(unknown)}"
        )
    version = record["schema_version"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise TypeError("cache-key record: schema_version must be an integer")
    if not isinstance(record["image"], str) or not isinstance(record["salt"], str):
        raise TypeError("cache-key record: image and salt must be strings")
    command = record["command"]
    if not isinstance(command, (list, tuple)) or not all(isinstance(a, str) for a in command):
        raise TypeError("cache-key record: command must be a list of strings")
    for field in ("env", "upstream"):
        mapping = record[field]
        if not isinstance(mapping, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()
        ):
            raise TypeError(f"cache-key record: {field} must map strings to strings")
    if not isinstance(record["params"], Mapping):
        raise TypeError("cache-key record: params must be an object")
    _check_json_value(record["params"], "params")


def canonical_json(record: Mapping[str, Any]) -> bytes:
    """The exact bytes that are hashed."""
    validate_record(record)
    return json.dumps(
        record, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def cache_key(record: Mapping[str, Any]) -> str:
    """Lowercase hex SHA-256 of the canonical encoding of ``record``."""
    return hashlib.sha256(canonical_json(record)).hexdigest()
