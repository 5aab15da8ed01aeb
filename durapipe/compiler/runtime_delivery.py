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
from typing import Any

from durapipe.compiler.context import CompileContext
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
    return build_zipapp.archive_bytes()


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

