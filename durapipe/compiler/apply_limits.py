"""What a default Argo CD sync (and ``kubectl apply``) can apply: client-side apply stores the
whole object as JSON in its ``kubectl.kubernetes.io/last-applied-configuration`` annotation,
and the API server refuses an object whose annotations (keys and values together) exceed
262,144 bytes.  ``compile`` refuses gitops output with such an object (P0409) instead of
leaving it to fail at sync time.  An object annotated for server-side apply
(``argocd.argoproj.io/sync-options: ServerSideApply=true``) carries no such annotation.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from durapipe.dsl.diagnostics import Diagnostic

#: Kubernetes' limit on the total size of an object's annotations (TotalAnnotationSizeLimitB).
ANNOTATION_LIMIT = 256 * 1024
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
SYNC_OPTIONS = "argocd.argoproj.io/sync-options"


def server_side(doc: dict[str, Any]) -> bool:
    annotations = doc.get("metadata", {}).get("annotations") or {}
    options = str(annotations.get(SYNC_OPTIONS, "")).replace(" ", "").split(",")
    return "ServerSideApply=true" in options


def annotation_bytes(doc: dict[str, Any]) -> int:
    """The size of ``doc``'s annotations once client-side apply has added its own: the other
    annotations, the key, and the object as kubectl's Go JSON writes it (compact, with ``<``,
    ``>``, ``&`` escaped as six bytes and U+2028/U+2029 as six)."""
    annotations = doc.get("metadata", {}).get("annotations") or {}
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    value = len(text.encode("utf-8")) + 1  # kubectl ends the value with a newline
    value += 5 * sum(text.count(c) for c in "<>&") + 3 * (text.count("\u2028") +
                                                          text.count("\u2029"))
    others = sum(len(str(k).encode()) + len(str(v).encode()) for k, v in annotations.items())
    return others + len(LAST_APPLIED) + value


def apply_limit_diagnostics(objects: Iterable[tuple[dict[str, Any], str]]
                            ) -> list[Diagnostic]:
    """P0409 for each object (with the source it comes from) that a client-side apply could
    not store; an object several pipelines share is reported once."""
    from durapipe.dsl.diagnostics import Diagnostic

    found: list[Diagnostic] = []
    seen: set[tuple[str, str, str]] = set()
    for doc, source in objects:
        meta = doc.get("metadata", {})
        key = (str(doc.get("kind")), str(meta.get("namespace", "")), str(meta.get("name")))
        if key in seen or server_side(doc):
            continue
        seen.add(key)
        size = annotation_bytes(doc)
        if size > ANNOTATION_LIMIT:
            found.append(Diagnostic(
                "P0409",
                f"{key[0]} `{key[2]}` would carry {size:,} bytes of annotations under "
                f"client-side apply (its last-applied-configuration), over the "
                f"{ANNOTATION_LIMIT:,} bytes Kubernetes allows: a default Argo CD sync and "
                "`kubectl apply` cannot apply it",
                help=("ship the runtime in an image (--runtime-image)"
                      if doc.get("kind") == "ConfigMap" else
                      "split the pipeline into several, or move long text (commands, env "
                      "values) into files of the image"),
                location=source))
    return found


__all__ = ["ANNOTATION_LIMIT", "annotation_bytes", "apply_limit_diagnostics", "server_side"]
