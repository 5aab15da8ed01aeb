"""Text that Kubernetes, the kubelet or Argo read specially, checked before it reaches them.

The rules are the API server's own (``k8s.io/apimachinery/pkg/util/validation``): a label value
is empty or at most 63 characters of ``[A-Za-z0-9._-]`` starting and ending alphanumeric; a
label or annotation key is a qualified name, ``[prefix/]name`` with a DNS-1123 subdomain prefix
of at most 253 characters and a name like a label value (non-empty).  Argo substitutes
``{{...}}`` in every string of a workflow, with no escape, so user text holding ``{{`` (or a
``{`` right before a ``${...}`` reference, which lowers to ``{{...}}``) is refused wherever it
is written: :func:`template_texts` walks *every* string of the model, so a field added later
is covered without being listed here.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

from durapipe.dsl.model import Interp, Pipeline, Ref
from durapipe.dsl.source import KEY

_NAME_PART_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS1123_SUBDOMAIN_RE = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_CONFIG_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")


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
