"""The local runner's result cache: one entry per (stage, key) in the run's store, which a
reader never sees half-written.

On a filesystem store (``file://``, the default) an entry is a directory committed with one
rename, and a hit serves the outputs from it.  On an object store (``s3://``) there is no
rename: each writer uploads the outputs under a prefix of its own, then writes the entry's
``entry.json`` last, in one PUT, naming every file with its size and content digest.  A writer
that dies before that PUT leaves objects no entry names (a miss); a hit downloads the files
into the run directory, checks each against its digest, and only then moves them into place,
so a damaged or partly deleted entry is a miss too, never half an output.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

from durapipe.runner.records import write_json_atomic
from durapipe.runtime.hashing import default_algorithm, hash_file
from durapipe.runtime.store import NotFound, Store, open_store

ENTRY = "entry.json"


@dataclass(frozen=True)
class Hit:
    #: Output name -> where this run finds it.
    outputs: dict[str, str]
    output_hashes: dict[str, str]


class Cache(Protocol):
    def lookup(self, stage: str, key: str, names: Sequence[str], max_age: float | None,
               restore_to: Path) -> Hit | None:
        """The entry's outputs, or ``None`` for a miss.  ``restore_to`` is the directory a
        cache that must copy the outputs puts them in (one subdirectory per output name)."""
        ...

    def save(self, stage: str, key: str, outputs: Mapping[str, str],
             output_hashes: Mapping[str, str], run_id: str,
             components: Mapping[str, object]) -> None:
        """Commit an entry; ``components``: what its key was made of (``memo.components``)."""
        ...

    def entries(self, stage: str) -> list[tuple[str, Mapping[str, object]]]:
        """``(created, components)`` of the stage's entries that recorded them: what a miss
        is explained against (``memo.explain_miss``)."""
        ...


def open_cache(store_root: str, pipeline: str) -> Cache:
    """The cache under ``<store>/<pipeline>/cache`` (store errors surface at first use)."""
    parsed = urlparse(store_root)
    if parsed.scheme == "file":
        return DirectoryCache(Path(unquote(parsed.path)) / pipeline / "cache")
    return ObjectCache(f"{store_root.rstrip('/')}/{pipeline}/cache")


def _recorded(entry: object) -> tuple[str, Mapping[str, object]] | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("components"), dict):
        return None
    return f"{float(entry.get('created', 0)):020.6f}", entry["components"]


def _expired(entry: Mapping[str, Any], max_age: float | None) -> bool:
    return max_age is not None and time.time() - float(entry["created"]) > max_age


class DirectoryCache:
    """Entries as directories of a local store; committed with one rename."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def lookup(self, stage: str, key: str, names: Sequence[str], max_age: float | None,
               restore_to: Path) -> Hit | None:
        entry_dir = self.root / stage / key
        try:
            entry = json.loads((entry_dir / ENTRY).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if _expired(entry, max_age):
            return None
        outputs = {name: str(entry_dir / "outputs" / name) for name in names}
        if not all(Path(p).exists() for p in outputs.values()):
            return None
        return Hit(outputs, dict(entry["output_hashes"]))

    def entries(self, stage: str) -> list[tuple[str, Mapping[str, object]]]:
        found = []
        for path in sorted((self.root / stage).glob(f"*/{ENTRY}")):
            try:
                recorded = _recorded(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError):
                continue
            if recorded is not None:
                found.append(recorded)
        return found

    def save(self, stage: str, key: str, outputs: Mapping[str, str],
             output_hashes: Mapping[str, str], run_id: str,
             components: Mapping[str, object]) -> None:
        entry_dir = self.root / stage / key
        staging = entry_dir.parent / f".{key}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            (staging / "outputs").mkdir(parents=True)
            for name, path in outputs.items():
                source, target = Path(path), staging / "outputs" / name
                if source.is_dir():
                    shutil.copytree(source, target, symlinks=True)
                elif source.exists():
                    shutil.copy2(source, target)
            write_json_atomic(staging / ENTRY, {
                "created": time.time(), "run": run_id, "output_hashes": dict(output_hashes),
                "components": dict(components)})
            if entry_dir.exists():
                shutil.rmtree(entry_dir)
            os.replace(staging, entry_dir)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)


class ObjectCache:
    """Entries in an object store: the outputs under a writer's own prefix, then
    ``entry.json``, the commit, naming each file with its size and digest."""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def _entry(self, store: Store, stage: str, key: str) -> dict[str, Any] | None:
        try:
            entry = json.loads(store.get_bytes(f"{stage}/{key}/{ENTRY}"))
        except (NotFound, ValueError):
            return None
        return entry if isinstance(entry, dict) else None

    def lookup(self, stage: str, key: str, names: Sequence[str], max_age: float | None,
               restore_to: Path) -> Hit | None:
        store = open_store(self.uri)
        entry = self._entry(store, stage, key)
        if entry is None or _expired(entry, max_age) or sorted(entry["outputs"]) != sorted(names):
            return None
        staging = restore_to.parent / f".cache-restore-{uuid.uuid4().hex[:8]}"
        try:
            prefix = f"{stage}/{key}/{entry['writer']}"
            for name, listing in entry["outputs"].items():
                if not _download(store, f"{prefix}/{name}", listing, staging / name):
                    return None
            if restore_to.exists():
                shutil.rmtree(restore_to)
            os.replace(staging, restore_to)
        except NotFound:
            return None  # a file the entry names is gone: recompute rather than half-restore
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        return Hit({name: str(restore_to / name) for name in names},
                   dict(entry["output_hashes"]))

    def entries(self, stage: str) -> list[tuple[str, Mapping[str, object]]]:
        store = open_store(self.uri)
        found = []
        for name in store.list(f"{stage}/"):
            if name.endswith(f"/{ENTRY}") and name.count("/") == 2:
                try:
                    recorded = _recorded(json.loads(store.get_bytes(name)))
                except (NotFound, ValueError):
                    continue
                if recorded is not None:
                    found.append(recorded)
        return found

    def save(self, stage: str, key: str, outputs: Mapping[str, str],
             output_hashes: Mapping[str, str], run_id: str,
             components: Mapping[str, object]) -> None:
        if not all(Path(p).exists() for p in outputs.values()):
            return  # an entry without every output could never be a hit
        store = open_store(self.uri)
        writer = uuid.uuid4().hex[:12]
        listings = {name: _upload(store, f"{stage}/{key}/{writer}/{name}", Path(path))
                    for name, path in sorted(outputs.items())}
        previous = self._entry(store, stage, key)
        body = {"created": time.time(), "run": run_id, "writer": writer,
                "output_hashes": dict(output_hashes), "outputs": listings,
                "components": dict(components)}
        # The commit: one PUT, after every file it names is stored.
        store.put_bytes(f"{stage}/{key}/{ENTRY}", json.dumps(body, sort_keys=True).encode())
        if previous is not None and previous.get("writer") not in (None, writer):
            _delete_quietly(store, f"{stage}/{key}/{previous['writer']}/")


def _upload(store: Store, prefix: str, path: Path) -> dict[str, Any]:
    """Store one output (a file, or a directory's files) and say what was stored."""
    if not path.is_dir():
        return {"kind": "file", "files": {"": _put(store, prefix, path)}}
    files: dict[str, list[Any]] = {}
    dirs: list[str] = []
    for item in sorted(path.rglob("*")):
        relative = item.relative_to(path).as_posix()
        if item.is_dir():
            dirs.append(relative)
        elif item.is_file():
            files[relative] = _put(store, f"{prefix}/{relative}", item)
    return {"kind": "dir", "files": files, "dirs": dirs}


def _put(store: Store, key: str, path: Path) -> list[Any]:
    digest = hash_file(path, default_algorithm())
    store.put_file(key, path, digest=digest)
    return [path.stat().st_size, digest]


def _download(store: Store, prefix: str, listing: Mapping[str, Any], target: Path) -> bool:
    """Fetch one output to ``target``; False when a file does not match its digest."""
    if listing["kind"] == "file":
        target.parent.mkdir(parents=True, exist_ok=True)
        return _get(store, prefix, listing["files"][""], target)
    target.mkdir(parents=True)
    for relative in listing["dirs"]:
        (target / relative).mkdir(parents=True, exist_ok=True)
    for relative, expected in listing["files"].items():
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        if not _get(store, f"{prefix}/{relative}", expected, target / relative):
            return False
    return True


def _get(store: Store, key: str, expected: Sequence[Any], path: Path) -> bool:
    size, digest = int(expected[0]), str(expected[1])
    found = store.get_file(key, path, size, algorithm=digest.partition(":")[0])
    return found == digest and path.stat().st_size == size


def _delete_quietly(store: Store, prefix: str) -> None:
    """Remove a superseded writer's files; a reader still fetching them gets a miss."""
    from durapipe.runtime.store import StoreError

    try:
        for key in store.list(prefix):
            store.delete(key)
    except StoreError:
        pass
