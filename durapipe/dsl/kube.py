"""Kubernetes value syntax, checked as the API server would: names, label keys and values,
tolerations, and ``pod_patch`` against the Pod spec schema.

Each check returns a short problem text (lower case, for a diagnostic label) or ``None``.
The rules are apimachinery's ``validation.IsDNS1123Label``, ``IsDNS1123Subdomain``,
``IsQualifiedName`` and ``IsValidLabelValue``.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
#: Where the compiled pod mounts the runtime and the shared memory volume (the compiler's
#: ``plan.RUNTIME_ROOT``; a test keeps the two equal): a user volume may not cover them.
RUNTIME_ROOT = "/var/run/durapipe"
RESERVED_MOUNTS = (RUNTIME_ROOT, "/dev/shm")


def _syntax_problem(value: str, limit: int, pattern: re.Pattern[str], rule: str) -> str | None:
    if len(value) > limit:
        return f"longer than {limit} characters"
    return None if pattern.match(value) else rule


def dns_label_problem(value: str) -> str | None:
    """A DNS-1123 label: volume names (at most 63 characters)."""
    return _syntax_problem(value, 63, _DNS1123_LABEL, "not lower-case letters, digits and "
                           "`-`, starting and ending alphanumeric")


def dns_subdomain_problem(value: str) -> str | None:
    """A DNS-1123 subdomain: most object names (ServiceAccount, Secret, ConfigMap, PVC,
    PriorityClass), at most 253 characters."""
    return _syntax_problem(value, 253, _DNS1123_SUBDOMAIN, "not lower-case letters, digits, "
                           "`-` and `.`, starting and ending alphanumeric")


def label_key_problem(key: str) -> str | None:
    """A qualified name: ``[prefix/]name``, the prefix a DNS subdomain, the name 63 characters."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or dns_subdomain_problem(prefix)):
        return "the prefix before `/` is not a DNS subdomain"
    if not name:
        return "empty name"
    problem = _syntax_problem(name, 63, _QUALIFIED, _QUALIFIED_RULE)
    return f"the name is {problem}" if problem and problem.startswith("longer") else problem


_QUALIFIED_RULE = "not letters, digits, `-`, `_` and `.`, starting and ending alphanumeric"


def label_value_problem(value: str) -> str | None:
    """A label value: empty, or a qualified name's syntax of at most 63 characters."""
    return None if value == "" else _syntax_problem(value, 63, _QUALIFIED, _QUALIFIED_RULE)


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
    problem = label_key_problem(key)
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


def _walk(value: object, schema: dict[str, Any], path: tuple[str | int, ...],
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
                _walk(item, props[key], (*path, key), out)
            elif isinstance(extra, dict):
                _walk(item, extra, (*path, key), out)
            elif props is not None or extra is False:
                out.append(PatchProblem((*path, key), "not a field of the Pod spec here"))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _walk(item, schema["items"], (*path, i), out)


def patch_problems(text: str) -> list[PatchProblem]:
    """What in ``text`` (a JSON strategic-merge patch of a PodSpec) the API server rejects."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return [PatchProblem((), f"not JSON: {exc}")]
    if not isinstance(value, dict):
        return [PatchProblem((), "not a JSON object")]
    out: list[PatchProblem] = []
    _walk(value, _schema()["PodSpec"], (), out)
    return out
