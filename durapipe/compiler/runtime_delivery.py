"""How the runtime reaches the pods: a ConfigMap in the compiled output (the default).

The zipapp (``durapipe.runtime.build_zipapp``: stdlib only, deterministic bytes) is shipped as
the ``binaryData`` of a ConfigMap named by its content hash, so a new runtime is a new name and
pods that run keep the archive they started with.  The volume is mounted read-only at
``contract.RUNTIME_INSTALL_DIR`` in every container of a stage's pod, all of which run the
stage's own image: nothing but the user's image (Python >= 3.10) is pulled.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from pathlib import Path
from typing import Any

from durapipe.compiler.context import CompileContext
from durapipe.files import user_cache_dir, write_atomic
from durapipe.runtime import build_zipapp, contract

Json = dict[str, Any]

#: Kubernetes refuses a ConfigMap whose data is larger than this.
CONFIGMAP_LIMIT = 1024 * 1024
VOLUME = "durapipe-runtime"
COMPONENT = {"app.kubernetes.io/component": "durapipe-runtime"}
NAME_PREFIX = "durapipe-runtime-"
HASH_CHARS = 12


@functools.cache
def _installed_archive() -> bytes:
    """The installed runtime's zipapp.  Deflating it costs ~0.4 s and every compile needs it,
    while its bytes depend only on the runtime's sources and on the builder: so it is kept in
    the user's cache under a digest of both.  The entry holds the archive's own SHA-256 before
    the archive, and a damaged entry (truncated, overwritten) is rebuilt over, so the cache can
    never change the output."""
    sources = build_zipapp.sources()
    key = hashlib.sha256(Path(build_zipapp.__file__).read_bytes())
    for name, data in sorted(sources.items()):
        key.update(f"\0{name}\0{len(data)}\0".encode())
        key.update(data)
    directory = user_cache_dir()
    entry = directory / f"runtime-{key.hexdigest()[:32]}.zipapp" if directory else None
    if entry is not None:
        cached = _read_entry(entry)
        if cached is not None:
            return cached
    data = build_zipapp.archive_bytes()
    if entry is not None:
        try:
            write_atomic(entry, hashlib.sha256(data).hexdigest().encode() + b"\n" + data,
                         durable=False)
        except OSError:
            pass  # a read-only or full cache only costs the next compile the deflate
    return data


def _read_entry(entry: Path) -> bytes | None:
    try:
        raw = entry.read_bytes()
    except OSError:
        return None
    recorded, _, data = raw.partition(b"\n")
    return data if recorded == hashlib.sha256(data).hexdigest().encode() else None


def archive(ctx: CompileContext) -> bytes:
    pinned = ctx.options.runtime_archive
    return pinned if pinned is not None else _installed_archive()


def configmap_name(ctx: CompileContext) -> str:
    return NAME_PREFIX + build_zipapp.content_hash(archive(ctx))[:HASH_CHARS]


def volume(ctx: CompileContext) -> Json:
    return {"name": VOLUME, "configMap": {"name": configmap_name(ctx), "defaultMode": 0o444}}


def mount() -> Json:
    return {"name": VOLUME, "mountPath": contract.RUNTIME_INSTALL_DIR, "readOnly": True}


def configmap(ctx: CompileContext) -> Json:
    data = archive(ctx)
    if len(data) > CONFIGMAP_LIMIT:  # the runtime is ~160 KB; this guards its growth
        raise AssertionError(f"runtime zipapp is {len(data)} bytes, over the ConfigMap limit")
    meta: Json = {"name": configmap_name(ctx)}
    if ctx.pipeline.namespace:
        meta["namespace"] = ctx.pipeline.namespace
    meta["labels"] = {"app.kubernetes.io/managed-by": "durapipe", **COMPONENT}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "immutable": True,
        "binaryData": {contract.RUNTIME_ZIPAPP_NAME: base64.b64encode(data).decode("ascii")},
    }

