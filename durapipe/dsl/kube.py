"""Text that Kubernetes, the kubelet or Argo read specially, checked before it reaches them.

The rules are the API server's own (``k8s.io/apimachinery/pkg/util/validation``): a label value
is empty or at most 63 characters of ``[A-Za-z0-9._-]`` starting and ending alphanumeric; a
label or annotation key is a qualified name, ``[prefix/]name`` with a DNS-1123 subdomain prefix
of at most 253 characters and a name like a label value (non-empty).  Argo substitutes
``{{...}}`` in every string of a workflow, with no escape, so user text holding ``{{`` (or a
``{`` right before a ``${...}`` reference, which lowers to ``{{...}}``) is refused wherever it
is written: :func:`template_texts` walks *every* string of the model, so a field added later
is covered without being listed here.

Cluster settings add tolerations (``kubectl taint`` syntax) and ``pod_patch``, checked against
the PodSpec schema in ``podspec.json`` (``tools/gen_podspec_schema.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any

from durapipe.dsl.model import Interp, Pipeline, Ref
from durapipe.dsl.source import KEY

_NAME_PART_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS1123_SUBDOMAIN_RE = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_CONFIG_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")

TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
#: Where the compiled pod mounts the runtime and the shared memory volume (the compiler's
#: ``plan.RUNTIME_ROOT``; a test keeps the two equal): a user volume may not cover them.
RUNTIME_ROOT = "/var/run/durapipe"
RESERVED_MOUNTS = (RUNTIME_ROOT, "/dev/shm")


def _name_part_problem(text: str, what: str) -> str | None:
    if len(text) > 63:
        return f"{what} is at most 63 characters"
    if not _NAME_PART_RE.match(text):
        return (f"{what} holds only letters, digits, `-`, `_` and `.`, and starts and ends "
                "with a letter or digit")
    return None


def label_value_problem(value: str) -> str | None:
    return None if value == "" else _name_part_problem(value, "a label value")


def qualified_name_problem(key: str) -> str | None:
    """Why ``key`` is not a valid label or annotation key, or ``None``."""
    prefix, slash, name = key.rpartition("/")
    if slash and not prefix:
        return "the prefix before `/` is empty"
    if slash and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN_RE.match(prefix)):
        return (f"the prefix `{prefix}` is not a DNS subdomain (lower-case letters, digits, "
                "`-` and `.`, at most 253 characters)")
    if not name:
        return "the name part is empty"
    return _name_part_problem(name, "the name part")


def dns_label_problem(value: str) -> str | None:
    if len(value) > 63 or not _DNS1123_LABEL_RE.match(value):
        return "not a DNS-1123 label (lower-case letters, digits and `-`, at most 63 characters)"
    return None


def dns_subdomain_problem(value: str) -> str | None:
    if len(value) > 253 or not _DNS1123_SUBDOMAIN_RE.match(value):
        return ("not a DNS-1123 subdomain (lower-case letters, digits, `-` and `.`, at most 253 "
                "characters)")
    return None


def config_key_problem(value: str) -> str | None:
    """A key of a Secret or ConfigMap."""
    if len(value) > 253 or not _CONFIG_KEY_RE.match(value):
        return "a Secret key holds only letters, digits, `-`, `_` and `.` (at most 253)"
    return None


def template_problem(text: str, *, before_ref: bool = False) -> bool:
    """Would Argo read ``text`` (or ``text`` then a lowered reference) as a template?"""
    return "{{" in text or (before_ref and text.endswith("{"))


Loc = tuple[Any, ...]


def template_texts(pipeline: Pipeline) -> Iterator[tuple[Loc, str, bool]]:
    """Every string of the model with its source-map location and whether a reference follows
    it: dict keys too (at ``(*loc, key, KEY)``).  Stage and param names are included although
    their own rules already forbid braces; walking everything is what keeps new fields in."""
    yield from _walk(pipeline, ())


def _walk(value: object, loc: Loc) -> Iterator[tuple[Loc, str, bool]]:
    if isinstance(value, str):
        yield loc, value, False
    elif isinstance(value, Ref):
        return
    elif isinstance(value, Interp):
        parts = value.parts
        for index, part in enumerate(parts):
            if isinstance(part, str):
                follows = index + 1 < len(parts) and isinstance(parts[index + 1], Ref)
                yield loc, part, follows
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _walk(getattr(value, f.name), (*loc, f.name))
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                yield (*loc, key, KEY), key, False
            yield from _walk(item, (*loc, key))
    elif isinstance(value, tuple):
        for index, item in enumerate(value):
            yield from _walk(item, (*loc, index))


# -- tolerations and pod_patch (cluster settings) ------------------------------------------


@dataclass(frozen=True)
class Toleration:
    key: str
    value: str | None
    effect: str | None

    def to_json(self) -> dict[str, str]:
        out = {"key": self.key, "operator": "Equal" if self.value is not None else "Exists"}
        if self.value is not None:
            out["value"] = self.value
        if self.effect is not None:
            out["effect"] = self.effect
        return out


def parse_toleration(text: str) -> Toleration | str:
    """``key[=value][:Effect]``, as ``kubectl taint`` writes a taint; a problem text if not."""
    body, colon, effect = text.partition(":")
    if colon and effect not in TAINT_EFFECTS:
        return f"the effect is not one of {', '.join(TAINT_EFFECTS)}"
    key, eq, value = body.partition("=")
    problem = qualified_name_problem(key)
    if problem is None and eq:
        problem = label_value_problem(value)
    if problem is not None:
        return problem
    return Toleration(key, value if eq else None, effect if colon else None)


# -- pod_patch -----------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _schema() -> dict[str, Any]:
    text = resources.files("durapipe.dsl").joinpath("podspec.json").read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@dataclass(frozen=True)
class PatchProblem:
    #: Keys and list indexes from the patch's top to the bad node.
    path: tuple[str | int, ...]
    message: str


def _types(schema: dict[str, Any]) -> tuple[str, ...]:
    if schema.get("x-kubernetes-int-or-string"):
        return ("integer", "string")
    kind = schema.get("type")
    return (kind,) if isinstance(kind, str) else ()


def _type_ok(value: object, kinds: tuple[str, ...]) -> bool:
    for kind in kinds:
        if kind == "string" and isinstance(value, str):
            return True
        if kind == "boolean" and isinstance(value, bool):
            return True
        if kind == "integer" and isinstance(value, int) and not isinstance(value, bool):
            return True
        if kind == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if kind == "object" and isinstance(value, dict):
            return True
        if kind == "array" and isinstance(value, list):
            return True
    return False


def _walk_patch(value: object, schema: dict[str, Any], path: tuple[str | int, ...],
          out: list[PatchProblem]) -> None:
    if "$ref" in schema:
        schema = _schema()["definitions"][schema["$ref"]]
    if value is None:
        return  # a strategic-merge patch deletes a field with null
    kinds = _types(schema)
    if kinds and not _type_ok(value, kinds):
        out.append(PatchProblem(path, f"expected {' or '.join(kinds)}"))
        return
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if key.startswith("$"):
                continue  # strategic-merge directives: $patch, $retainKeys, $setElementOrder
            if props is not None and key in props:
                _walk_patch(item, props[key], (*path, key), out)
            elif isinstance(extra, dict):
                _walk_patch(item, extra, (*path, key), out)
            elif props is not None or extra is False:
                out.append(PatchProblem((*path, key), "not a field of the Pod spec here"))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _walk_patch(item, schema["items"], (*path, i), out)


def patch_problems(text: str) -> list[PatchProblem]:
    """What in ``text`` (a JSON strategic-merge patch of a PodSpec) the API server rejects."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return [PatchProblem((), f"not JSON: {exc}")]
    if not isinstance(value, dict):
        return [PatchProblem((), "not a JSON object")]
    out: list[PatchProblem] = []
    _walk_patch(value, _schema()["PodSpec"], (), out)
    return out
