"""Strict validation of Argo Workflows objects against Argo v4.1.2's full CRD schemas.

Argo's published CRD ``openAPIV3Schema`` never says ``additionalProperties: false``: the API
server prunes unknown fields (or rejects them under strict field validation), and ``argo lint``
rejects them by unmarshalling strictly.  This module converts each CRD schema into a JSON schema
(draft 7) that rejects unknown fields, and validates objects with it.

Conversion rules (``convert_schema``, ``strict_schema_for_crd``):

* an object schema with no ``additionalProperties`` and no
  ``x-kubernetes-preserve-unknown-fields: true`` rejects unknown keys, whether or not it has
  ``properties`` (an object with neither is an empty Go struct such as ``archive.none``, and the
  API server prunes every key of it);
* ``x-kubernetes-preserve-unknown-fields: true`` keeps the node open (``withItems``, ``plugin``,
  ``status.storedTemplates``), except that ``inline`` templates of DAG tasks and steps are
  validated as Templates through ``#/definitions/template``, as ``argo lint`` does;
* ``x-kubernetes-int-or-string: true`` becomes ``type: [integer, string]`` (any ``pattern``, such as
  the Quantity pattern, constrains only the string form, exactly as in Kubernetes);
* ``nullable: true`` adds ``null`` to the type; without it ``null`` is rejected (the API server
  would silently prune it, but a ``null`` in compiled output is a compiler bug);
* ``format`` is checked for ``int32``, ``int64``, ``date-time`` and ``byte``; ``integer`` means a
  JSON integer (``True`` and ``3.0`` are not integers);
* ``x-kubernetes-list-type: map`` checks that the ``x-kubernetes-list-map-keys`` are unique
  (missing keys take their schema default, e.g. a port's ``protocol: TCP``), and ``set`` checks
  that items are unique, as the API server does;
* ``x-kubernetes-validations`` (CEL) are not evaluated; they are counted in ``ConversionStats``;
* the top level pins ``apiVersion`` and ``kind``, and ``metadata`` (``type: object`` in the CRD)
  is replaced by a strict ObjectMeta schema plus the API server's name, namespace, label and
  annotation syntax checks (``metadata_errors``), plus Argo's own name-length limits.

Two engines run the strict schema: ``compile_schema`` turns it into nested closures (the default,
about 5x faster) and python-jsonschema's Draft7Validator is the reference; the tests check that
both report the same (path, keyword) problems.

``hera_roundtrip_loss`` loads a document into hera 7.1.0's models and reports what the dump lost.

Other test modules import this as ``from argo_schema.strict import StrictValidator``.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import reprlib
import types
import typing
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import jsonschema
import jsonschema.validators
import yaml
from jsonschema import Draft7Validator, FormatChecker, ValidationError
from jsonschema.protocols import Validator

ARGO_API_VERSION: Final = "argoproj.io/v1alpha1"
CRD_FILES: Final[Mapping[str, str]] = {
    "Workflow": "argoproj.io_workflows.yaml",
    "WorkflowTemplate": "argoproj.io_workflowtemplates.yaml",
    "CronWorkflow": "argoproj.io_cronworkflows.yaml",
    "ClusterWorkflowTemplate": "argoproj.io_clusterworkflowtemplates.yaml",
}
SUPPORTED_KINDS: Final = frozenset(CRD_FILES)

# Argo's validator (workflow/validate) caps object names below the API server's 253: the name
# becomes a label value (<= 63), and a CronWorkflow's name gets an 11-character timestamp suffix.
ARGO_MAX_NAME_LENGTH: Final[Mapping[str, int]] = {
    "Workflow": 63,
    "WorkflowTemplate": 63,
    "ClusterWorkflowTemplate": 63,
    "CronWorkflow": 52,
}

QUANTITY_PATTERN: Final = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
LIST_MAP_KEYWORD: Final = "x-strict-list-map-keys"

_INT32_RANGE: Final = (-(2**31), 2**31 - 1)
_INT64_RANGE: Final = (-(2**63), 2**63 - 1)
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_BASE64 = re.compile(r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_QUALIFIED_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ANNOTATIONS_MAX_BYTES: Final = 256 * 1024

# Keys of a CRD schema node that carry no validation (documentation, server-side behaviour).
_DROPPED_KEYS: Final = frozenset(
    {
        "description",
        "default",
        "example",
        "externalDocs",
        "title",
        "x-kubernetes-map-type",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-embedded-resource",
        "x-kubernetes-validations",
        "x-kubernetes-int-or-string",
        "x-kubernetes-preserve-unknown-fields",
        "nullable",
    }
)
# Keys copied verbatim (draft 7 means the same thing as OpenAPI v3 for these).
_COPIED_KEYS: Final = frozenset(
    {
        "enum",
        "pattern",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minimum",
        "maximum",
        "multipleOf",
        "minProperties",
        "maxProperties",
        "uniqueItems",
        "format",
    }
)
_SCHEMA_LIST_KEYS: Final = ("anyOf", "allOf", "oneOf")
_HANDLED_KEYS: Final = (
    _DROPPED_KEYS
    | _COPIED_KEYS
    | frozenset(_SCHEMA_LIST_KEYS)
    | {
        "type",
        "properties",
        "additionalProperties",
        "items",
        "required",
        "not",
        "exclusiveMinimum",
        "exclusiveMaximum",
    }
)

Json = Any
"""A JSON-compatible value as loaded from YAML or produced by the compiler."""


@dataclass
class ConversionStats:
    """What ``convert_schema`` did to one CRD schema."""

    strict_objects: int = 0
    """Object schemas that now reject unknown keys."""
    open_objects: int = 0
    """Nodes left open by ``x-kubernetes-preserve-unknown-fields`` or ``additionalProperties``."""
    int_or_string: int = 0
    nullable: int = 0
    list_maps: int = 0
    list_sets: int = 0
    cel_rules_skipped: int = 0
    """``x-kubernetes-validations`` rules, which are not evaluated."""
    inline_templates_linked: int = 0
    """``inline`` (DAG task, step) nodes now validated as Templates (see _link_inline_templates)."""
    formats: Counter[str] = field(default_factory=Counter)


# --------------------------------------------------------------------------------------------
# Loading YAML the way Kubernetes does.


class KubernetesYamlLoader(yaml.SafeLoader):
    """A SafeLoader that, like sigs.k8s.io/yaml, leaves timestamps as strings."""


KubernetesYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_yaml_documents(text: str) -> list[Json]:
    """Every non-empty document of a multi-document YAML stream."""
    return [doc for doc in yaml.load_all(text, Loader=KubernetesYamlLoader) if doc is not None]


def _load_crd(path: Path) -> Mapping[str, Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 0.7 s instead of 10 s
    with path.open("rb") as stream:
        crd = yaml.load(stream, Loader=loader)
    if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
        raise ValueError(f"{path} is not a CustomResourceDefinition")
    return crd


def crd_open_api_schema(crd: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ``openAPIV3Schema`` of the CRD's storage version."""
    versions = crd["spec"]["versions"]
    storage = [v for v in versions if v.get("storage")] or list(versions)
    schema: Mapping[str, Any] = storage[0]["schema"]["openAPIV3Schema"]
    return schema


# --------------------------------------------------------------------------------------------
# CRD schema -> strict JSON schema.


def _json_type(openapi_type: str | None, nullable: bool) -> str | list[str] | None:
    if openapi_type is None:
        return None
    return [openapi_type, "null"] if nullable else openapi_type


def convert_schema(
    node: Mapping[str, Any], stats: ConversionStats, path: str = "$"
) -> dict[str, Any]:
    """Convert one OpenAPI v3 (structural, Kubernetes-flavoured) schema node to strict draft 7."""
    unknown = set(node) - _HANDLED_KEYS
    if unknown:
        raise ValueError(f"{path}: unhandled schema keys {sorted(unknown)}")

    out: dict[str, Any] = {}
    nullable = bool(node.get("nullable"))
    stats.nullable += nullable
    stats.cel_rules_skipped += len(node.get("x-kubernetes-validations", ()))
    preserve_unknown = bool(node.get("x-kubernetes-preserve-unknown-fields"))

    if node.get("x-kubernetes-int-or-string"):
        stats.int_or_string += 1
        out["type"] = ["integer", "string", "null"] if nullable else ["integer", "string"]
    else:
        json_type = _json_type(node.get("type"), nullable)
        if json_type is not None:
            out["type"] = json_type
        for key in _SCHEMA_LIST_KEYS:
            if key in node:
                out[key] = [
                    convert_schema(sub, stats, f"{path}/{key}[{i}]")
                    for i, sub in enumerate(node[key])
                ]
        if "not" in node:
            out["not"] = convert_schema(node["not"], stats, f"{path}/not")

    for key in _COPIED_KEYS & node.keys():
        out[key] = node[key]
    # OpenAPI v3 (like draft 4) makes exclusiveMinimum/Maximum booleans qualifying minimum/maximum.
    for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if node.get(exclusive) and bound in out:
            out[exclusive] = out.pop(bound)
    if "format" in node:
        stats.formats[node["format"]] += 1

    if "properties" in node:
        out["properties"] = {
            name: convert_schema(sub, stats, f"{path}.{name}")
            for name, sub in node["properties"].items()
        }
    if "required" in node:
        out["required"] = list(node["required"])

    additional = node.get("additionalProperties")
    if isinstance(additional, Mapping):
        out["additionalProperties"] = convert_schema(additional, stats, f"{path}{{}}")
    elif additional is not None:
        out["additionalProperties"] = bool(additional)
        if additional:
            stats.open_objects += 1
    is_object = node.get("type") == "object" or "properties" in node
    if preserve_unknown:
        stats.open_objects += 1
    elif is_object and additional is None:
        out["additionalProperties"] = False
        stats.strict_objects += 1

    if "items" in node:
        items = node["items"]
        out["items"] = convert_schema(items, stats, f"{path}[]")
        list_type = node.get("x-kubernetes-list-type")
        if list_type == "map":
            stats.list_maps += 1
            keys = list(node.get("x-kubernetes-list-map-keys", ()))
            item_props = items.get("properties", {})
            defaults = {
                k: item_props[k]["default"] for k in keys if "default" in item_props.get(k, {})
            }
            out[LIST_MAP_KEYWORD] = {"keys": keys, "defaults": defaults}
        elif list_type == "set":
            stats.list_sets += 1
            out["uniqueItems"] = True
    return out


def _string_map() -> dict[str, Any]:
    return {"type": "object", "additionalProperties": {"type": "string"}}


OBJECT_META_SCHEMA: Final[Mapping[str, Any]] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "generateName": {"type": "string"},
        "namespace": {"type": "string"},
        "uid": {"type": "string"},
        "resourceVersion": {"type": "string"},
        "selfLink": {"type": "string"},
        "generation": {"type": "integer", "format": "int64"},
        # `kubectl create --dry-run -o yaml` writes `creationTimestamp: null`.
        "creationTimestamp": {"type": ["string", "null"], "format": "date-time"},
        "deletionTimestamp": {"type": "string", "format": "date-time"},
        "deletionGracePeriodSeconds": {"type": "integer", "format": "int64"},
        "labels": _string_map(),
        "annotations": _string_map(),
        "finalizers": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "ownerReferences": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["apiVersion", "kind", "name", "uid"],
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "name": {"type": "string"},
                    "uid": {"type": "string"},
                    "controller": {"type": "boolean"},
                    "blockOwnerDeletion": {"type": "boolean"},
                },
            },
        },
        "managedFields": {"type": "array", "items": {"type": "object"}},
    },
}


def strict_schema_for_crd(crd: Mapping[str, Any]) -> tuple[dict[str, Any], ConversionStats]:
    """The strict draft-7 schema of a CRD's objects, and what the conversion did."""
    stats = ConversionStats()
    schema = convert_schema(crd_open_api_schema(crd), stats)
    kind = crd["spec"]["names"]["kind"]
    schema["properties"]["apiVersion"] = {"const": ARGO_API_VERSION}
    schema["properties"]["kind"] = {"const": kind}
    schema["properties"]["metadata"] = copy.deepcopy(dict(OBJECT_META_SCHEMA))
    schema["required"] = sorted({"apiVersion", "kind", *schema.get("required", ())})
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    _link_inline_templates(schema, stats)
    return schema, stats


def _find_template_schema(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The item schema of the first ``templates`` array, breadth first (Argo's Template)."""
    queue: list[Mapping[str, Any]] = [node]
    while queue:
        current = queue.pop(0)
        properties = current.get("properties", {})
        templates = properties.get("templates", {})
        if templates.get("type") == "array" and "items" in templates:
            items: Mapping[str, Any] = templates["items"]
            return items
        queue.extend(v for v in properties.values() if isinstance(v, Mapping))
    return None


def _link_inline_templates(schema: dict[str, Any], stats: ConversionStats) -> None:
    """Validate ``inline`` templates of DAG tasks and steps as Templates.

    The CRD marks them ``x-kubernetes-preserve-unknown-fields`` (a recursive type cannot be
    inlined), so the API server accepts anything there; ``argo lint`` unmarshals them strictly
    as Templates, and so does this schema, through ``#/definitions/template``.
    """
    template = _find_template_schema(schema["properties"]["spec"])
    if template is None:
        return
    schema["definitions"] = {"template": template}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            properties = node.get("properties")
            if (
                isinstance(properties, dict)
                and properties.get("inline") == {}
                and "templateRef" in properties
            ):
                properties["inline"] = {"$ref": "#/definitions/template"}
                stats.inline_templates_linked += 1
            for key, value in node.items():
                if key != "definitions":
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)


# --------------------------------------------------------------------------------------------
# Two engines for the strict schema: a compiled one (closures, ~10x faster, used by default) and
# python-jsonschema (draft 7, the reference; tests check that both find the same problems).

ErrorPath = list[str | int]
Problem = tuple[ErrorPath, str, str]
"""(path, JSON-schema keyword or 'metadata', message)."""

_SHORT = reprlib.Repr()
_SHORT.maxstring = 80
_SHORT.maxother = 80
_SHORT.maxlist = _SHORT.maxdict = 4
_SHORT.maxlevel = 2


def short_repr(value: object) -> str:
    """A repr bounded in size, for messages about possibly huge instances."""
    return _SHORT.repr(value)


def _is_json_integer(instance: object) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


def _is_json_number(instance: object) -> bool:
    return isinstance(instance, (int, float)) and not isinstance(instance, bool)


_TYPE_PREDICATES: Final[Mapping[str, typing.Callable[[object], bool]]] = {
    "string": lambda x: isinstance(x, str),
    "integer": _is_json_integer,
    "number": _is_json_number,
    "boolean": lambda x: isinstance(x, bool),
    "object": lambda x: isinstance(x, dict),
    "array": lambda x: isinstance(x, list),
    "null": lambda x: x is None,
}


def _in_range(bounds: tuple[int, int]) -> typing.Callable[[object], bool]:
    def check(instance: object) -> bool:
        return (
            not _is_json_integer(instance) or bounds[0] <= typing.cast(int, instance) <= bounds[1]
        )

    return check


def _is_rfc3339(instance: object) -> bool:
    return not isinstance(instance, str) or _RFC3339.match(instance) is not None


def _is_base64(instance: object) -> bool:
    return not isinstance(instance, str) or _BASE64.match(instance) is not None


FORMAT_CHECKS: Final[Mapping[str, typing.Callable[[object], bool]]] = {
    "int32": _in_range(_INT32_RANGE),
    "int64": _in_range(_INT64_RANGE),
    "date-time": _is_rfc3339,
    "byte": _is_base64,
}
"""The formats Kubernetes checks in CRD schemas that Argo's CRDs use; others are ignored."""


def _list_map_duplicates(spec: Mapping[str, Any], instance: list[Any]) -> Iterator[tuple[int, str]]:
    """``x-kubernetes-list-type: map``: (index, message) for each repeated key tuple."""
    keys: Sequence[str] = spec["keys"]
    defaults: Mapping[str, object] = spec["defaults"]
    first_index: dict[str, int] = {}
    for index, item in enumerate(instance):
        if not isinstance(item, dict):
            continue
        values = [item.get(k, defaults.get(k)) for k in keys]
        key = repr(values)
        if key in first_index:
            fields = ", ".join(f"{k}={v!r}" for k, v in zip(keys, values))
            yield index, f"duplicate entry ({fields}); first at index {first_index[key]}"
        else:
            first_index[key] = index


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, default=repr)


def _too_many(instance: Sized, maximum: int, what: str) -> str:
    return f"has {len(instance)} {what}, more than the {maximum} allowed"


def _too_few(instance: Sized, minimum: int, what: str) -> str:
    return f"has {len(instance)} {what}, fewer than the {minimum} required"


def _keyword_message(keyword: str, value: Any, instance: Any) -> str:
    """The message for a failed ``keyword`` (shared by both engines)."""
    if keyword == "type":
        types = [value] if isinstance(value, str) else list(value)
        return f"{short_repr(instance)} is not of type {' or '.join(types)}"
    if keyword == "enum":
        return f"{short_repr(instance)} is not one of {value!r}"
    if keyword == "const":
        return f"must be {value!r}, not {short_repr(instance)}"
    if keyword == "pattern":
        if value == QUANTITY_PATTERN:
            return f"{short_repr(instance)} is not a Kubernetes quantity"
        return f"{short_repr(instance)} does not match {value!r}"
    if keyword == "format":
        return f"{short_repr(instance)} is not a valid {value}"
    if keyword == "minLength":
        return f"{short_repr(instance)} is shorter than {value} characters"
    if keyword == "maxLength":
        return f"{short_repr(instance)} is longer than {value} characters"
    if keyword == "minItems":
        return _too_few(instance, value, "items")
    if keyword == "maxItems":
        return _too_many(instance, value, "items")
    if keyword == "minProperties":
        return _too_few(instance, value, "properties")
    if keyword == "maxProperties":
        return _too_many(instance, value, "properties")
    if keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        relation = {
            "minimum": "less than",
            "maximum": "greater than",
            "exclusiveMinimum": "less than or equal to",
            "exclusiveMaximum": "greater than or equal to",
        }[keyword]
        return f"{instance!r} is {relation} {value!r}"
    if keyword == "multipleOf":
        return f"{instance!r} is not a multiple of {value!r}"
    if keyword == "uniqueItems":
        return "has repeated items"
    return f"{short_repr(instance)} fails {keyword}"


Check = typing.Callable[[Any, "PathLink", list[tuple["PathLink", str, str]]], None]
PathLink = tuple[Any, str | int] | None
"""A path as a linked list (parent, key): cheap to extend, unwound only for errors."""


def _unwind(link: PathLink) -> ErrorPath:
    parts: ErrorPath = []
    while link is not None:
        link, key = link
        parts.append(key)
    parts.reverse()
    return parts


def _accept(_instance: Any, _path: PathLink, _errors: list[tuple[PathLink, str, str]]) -> None:
    return None


def _scalar_check(keyword: str, value: Any) -> Check | None:
    """A check for one keyword that does not descend into the instance."""
    message = _keyword_message

    def failing(predicate: typing.Callable[[Any], bool]) -> Check:
        def check(instance: Any, path: PathLink, errors: list[tuple[PathLink, str, str]]) -> None:
            if predicate(instance):
                errors.append((path, keyword, message(keyword, value, instance)))

        return check

    if keyword == "enum":
        options = list(value)
        return failing(lambda x: not any(x == o and type(x) is type(o) for o in options))
    if keyword == "const":
        return failing(lambda x: not (x == value and type(x) is type(value)))
    if keyword == "pattern":
        regex = re.compile(value)
        return failing(lambda x: isinstance(x, str) and regex.search(x) is None)
    if keyword == "format":
        format_ok = FORMAT_CHECKS.get(value)
        return None if format_ok is None else failing(lambda x: not format_ok(x))
    if keyword == "minLength":
        return failing(lambda x: isinstance(x, str) and len(x) < value)
    if keyword == "maxLength":
        return failing(lambda x: isinstance(x, str) and len(x) > value)
    if keyword == "minItems":
        return failing(lambda x: isinstance(x, list) and len(x) < value)
    if keyword == "maxItems":
        return failing(lambda x: isinstance(x, list) and len(x) > value)
    if keyword == "minProperties":
        return failing(lambda x: isinstance(x, dict) and len(x) < value)
    if keyword == "maxProperties":
        return failing(lambda x: isinstance(x, dict) and len(x) > value)
    if keyword == "minimum":
        return failing(lambda x: _is_json_number(x) and x < value)
    if keyword == "maximum":
        return failing(lambda x: _is_json_number(x) and x > value)
    if keyword == "exclusiveMinimum":
        return failing(lambda x: _is_json_number(x) and x <= value)
    if keyword == "exclusiveMaximum":
        return failing(lambda x: _is_json_number(x) and x >= value)
    if keyword == "multipleOf":
        return failing(lambda x: _is_json_number(x) and (x / value) != int(x / value))
    if keyword == "uniqueItems":
        if not value:
            return None
        return failing(lambda x: isinstance(x, list) and len({_canonical(i) for i in x}) != len(x))
    if keyword == LIST_MAP_KEYWORD:

        def list_map(
            instance: Any, path: PathLink, errors: list[tuple[PathLink, str, str]]
        ) -> None:
            if isinstance(instance, list):
                for index, problem in _list_map_duplicates(value, instance):
                    errors.append(((path, index), keyword, problem))

        return list_map
    return None


_STRUCTURAL_KEYWORDS: Final = frozenset(
    {
        "$schema",
        "$ref",
        "definitions",
        "type",
        "properties",
        "additionalProperties",
        "required",
        "items",
        "anyOf",
        "allOf",
        "oneOf",
        "not",
    }
)


def compile_schema(schema: Mapping[str, Any] | bool) -> Check:
    """Compile a strict schema (the subset of draft 7 that ``convert_schema`` emits) to a check.

    ``$ref`` may point at ``#/definitions/<name>`` of this (root) schema, recursively.
    """
    compiler = _SchemaCompiler(schema)
    check = compiler.compile(schema)
    compiler.compile_definitions()
    return check


class _SchemaCompiler:
    _EXTRA_KEYWORDS: Final = frozenset(
        {"const", "exclusiveMinimum", "exclusiveMaximum", "$ref", "definitions", LIST_MAP_KEYWORD}
    )

    def __init__(self, root: Mapping[str, Any] | bool) -> None:
        self.definitions: Mapping[str, Any] = (
            root.get("definitions", {}) if isinstance(root, Mapping) else {}
        )
        self.compiled_definitions: dict[str, Check] = {}
        self._memo: dict[int, Check] = {}  # the same schema object compiles once

    def compile_definitions(self) -> None:
        for name, definition in self.definitions.items():
            self.compiled_definitions[name] = self.compile(definition)

    def compile(self, schema: Mapping[str, Any] | bool) -> Check:
        if schema is True or schema == {}:
            return _accept
        if id(schema) not in self._memo:
            self._memo[id(schema)] = self._compile(schema)
        return self._memo[id(schema)]

    def _reference(self, ref: str) -> Check:
        prefix = "#/definitions/"
        name = ref[len(prefix) :]
        if not ref.startswith(prefix) or name not in self.definitions:
            raise ValueError(f"compile_schema cannot resolve $ref {ref!r}")
        compiled = self.compiled_definitions

        def check(instance: Any, path: PathLink, errors: list[tuple[PathLink, str, str]]) -> None:
            compiled[name](instance, path, errors)

        return check

    def _compile(self, schema: Mapping[str, Any] | bool) -> Check:
        if schema is False:

            def reject(
                instance: Any, path: PathLink, errors: list[tuple[PathLink, str, str]]
            ) -> None:
                errors.append((path, "false", "no value is allowed here"))

            return reject
        assert isinstance(schema, Mapping)
        unknown = set(schema) - _STRUCTURAL_KEYWORDS - _COPIED_KEYS - self._EXTRA_KEYWORDS
        if unknown:
            raise ValueError(f"compile_schema cannot handle {sorted(unknown)}")
        if "$ref" in schema:  # draft 7 ignores the siblings of $ref
            return self._reference(schema["$ref"])

        declared = schema.get("type")
        type_names = (
            None
            if declared is None
            else ([declared] if isinstance(declared, str) else list(declared))
        )
        predicates = [] if type_names is None else [_TYPE_PREDICATES[t] for t in type_names]
        properties = {k: self.compile(v) for k, v in schema.get("properties", {}).items()}
        required = tuple(schema.get("required", ()))
        additional = schema.get("additionalProperties")
        reject_unknown = additional is False
        additional_check = self.compile(additional) if isinstance(additional, Mapping) else None
        walks_objects = bool(properties) or reject_unknown or additional_check is not None
        items_check = self.compile(schema["items"]) if "items" in schema else None
        others = [
            keyword_check
            for keyword in sorted(set(schema) - _STRUCTURAL_KEYWORDS)
            if (keyword_check := _scalar_check(keyword, schema[keyword])) is not None
        ]
        others.extend(self._combinator_checks(schema))

        def check(instance: Any, path: PathLink, errors: list[tuple[PathLink, str, str]]) -> None:
            if predicates and not any(p(instance) for p in predicates):
                errors.append((path, "type", _keyword_message("type", declared, instance)))
            if isinstance(instance, dict):
                if walks_objects:
                    for key, value in instance.items():
                        sub = properties.get(key)
                        if sub is not None:
                            sub(value, (path, key), errors)
                        elif reject_unknown:
                            errors.append(
                                ((path, key), "additionalProperties", f"unknown field {key!r}")
                            )
                        elif additional_check is not None:
                            additional_check(value, (path, key), errors)
                for name in required:
                    if name not in instance:
                        errors.append((path, "required", f"missing required field {name!r}"))
            elif items_check is not None and isinstance(instance, list):
                for index, item in enumerate(instance):
                    items_check(item, (path, index), errors)
            for other in others:
                other(instance, path, errors)

        return check

    def _combinator_checks(self, schema: Mapping[str, Any]) -> list[Check]:
        """anyOf/allOf/oneOf/not (``convert_schema`` emits none for Argo's CRDs)."""
        checks: list[Check] = []
        for keyword in ("anyOf", "allOf", "oneOf"):
            if keyword not in schema:
                continue
            subs = [self.compile(s) for s in schema[keyword]]

            def combined(
                instance: Any,
                path: PathLink,
                errors: list[tuple[PathLink, str, str]],
                keyword: str = keyword,
                subs: list[Check] = subs,
            ) -> None:
                results = []
                for sub in subs:
                    found: list[tuple[PathLink, str, str]] = []
                    sub(instance, path, found)
                    results.append(found)
                passing = sum(not r for r in results)
                if keyword == "allOf":
                    for found in results:
                        errors.extend(found)
                elif (keyword == "anyOf" and passing == 0) or (keyword == "oneOf" and passing != 1):
                    errors.append(
                        (path, keyword, f"{short_repr(instance)} matches {passing} of {keyword}")
                    )

            checks.append(combined)
        if "not" in schema:
            negated = self.compile(schema["not"])

            def negation(
                instance: Any, path: PathLink, errors: list[tuple[PathLink, str, str]]
            ) -> None:
                found: list[tuple[PathLink, str, str]] = []
                negated(instance, path, found)
                if not found:
                    errors.append((path, "not", f"{short_repr(instance)} must not match"))

            checks.append(negation)
        return checks


def _jsonschema_list_map_keys(
    validator: Validator, spec: Mapping[str, Any], instance: object, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if isinstance(instance, list):
        for index, problem in _list_map_duplicates(spec, instance):
            yield ValidationError(problem, path=(index,))


def _jsonschema_format_checker() -> FormatChecker:
    checker = FormatChecker(formats=())
    for name, predicate in FORMAT_CHECKS.items():
        checker.checks(name)(predicate)
    return checker


JsonSchemaStrictValidator = jsonschema.validators.extend(
    Draft7Validator,
    validators={LIST_MAP_KEYWORD: _jsonschema_list_map_keys},
    type_checker=Draft7Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, instance: _is_json_integer(instance)
    ),
)
"""python-jsonschema's draft 7 with JSON integers and the list-map keyword: the reference engine."""


def _jsonschema_problems(error: ValidationError) -> Iterator[Problem]:
    """Problems from one python-jsonschema error, in the compiled engine's terms."""
    path: ErrorPath = list(error.absolute_path)
    keyword = str(error.validator)
    if keyword == "additionalProperties" and error.validator_value is False:
        instance = error.instance if isinstance(error.instance, dict) else {}
        known = error.schema.get("properties", {})
        for key in (k for k in instance if k not in known):
            yield [*path, key], keyword, f"unknown field {key!r}"
    elif keyword == "required":
        missing = re.match(r"^'(.*)' is a required property$", error.message)
        name = missing.group(1) if missing else error.message
        yield path, keyword, f"missing required field {name!r}"
    elif keyword == LIST_MAP_KEYWORD:
        yield path, keyword, error.message
    else:
        yield path, keyword, _keyword_message(keyword, error.validator_value, error.instance)


def format_json_path(path: Sequence[str | int]) -> str:
    """``$.spec.templates[0].container.resources.limits['nvidia.com/gpu']``."""
    parts = ["$"]
    for part in path:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        elif _PLAIN_KEY.match(part):
            parts.append(f".{part}")
        else:
            parts.append(f"[{part!r}]")
    return "".join(parts)


# --------------------------------------------------------------------------------------------
# metadata, as the API server checks it (k8s.io/apimachinery/pkg/api/validation/objectmeta.go).


def _dns1123_subdomain_errors(value: str) -> list[str]:
    errors = []
    if len(value) > 253:
        errors.append("must be no more than 253 characters")
    if not _DNS1123_SUBDOMAIN.match(value):
        errors.append(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters,"
            " '-' or '.', and must start and end with an alphanumeric character"
        )
    return errors


def _is_dns1123_label(value: str) -> bool:
    return len(value) <= 63 and _DNS1123_LABEL.match(value) is not None


def _qualified_name_errors(value: str) -> list[str]:
    parts = value.split("/")
    if len(parts) > 2:
        return ["a qualified name must be a name with an optional DNS subdomain prefix and '/'"]
    name = parts[-1]
    errors = []
    if len(parts) == 2:
        if not parts[0]:
            errors.append("prefix part must be non-empty")
        else:
            errors.extend(f"prefix part {e}" for e in _dns1123_subdomain_errors(parts[0]))
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part must be no more than 63 characters")
    elif not _QUALIFIED_NAME_PART.match(name):
        errors.append(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start"
            " and end with an alphanumeric character"
        )
    return errors


def metadata_errors(kind: str, metadata: object) -> list[tuple[ErrorPath, str]]:
    """The API server's syntax checks of ObjectMeta, plus Argo's name-length limit."""
    if not isinstance(metadata, dict):
        return []  # the schema reports the type
    errors: list[tuple[ErrorPath, str]] = []
    name, generate_name = metadata.get("name"), metadata.get("generateName")
    if not name and not generate_name:
        errors.append((["metadata"], "name or generateName is required"))
    if isinstance(name, str) and name:
        errors.extend((["metadata", "name"], e) for e in _dns1123_subdomain_errors(name))
        limit = ARGO_MAX_NAME_LENGTH.get(kind)
        if limit is not None and len(name) > limit:
            errors.append(
                (["metadata", "name"], f"Argo limits a {kind} name to {limit} characters")
            )
    if isinstance(generate_name, str) and generate_name:
        # NameIsDNSSubdomain(prefix=true) masks one trailing '-' before checking.
        masked = generate_name[:-1] + "a" if generate_name.endswith("-") else generate_name
        errors.extend((["metadata", "generateName"], e) for e in _dns1123_subdomain_errors(masked))
    namespace = metadata.get("namespace")
    if isinstance(namespace, str) and namespace and not _is_dns1123_label(namespace):
        errors.append(
            (["metadata", "namespace"], "must be an RFC 1123 label of at most 63 characters")
        )
    labels = metadata.get("labels")
    if isinstance(labels, dict):
        for key, value in labels.items():
            where: ErrorPath = ["metadata", "labels", str(key)]
            errors.extend((where, f"key {key!r}: {e}") for e in _qualified_name_errors(str(key)))
            if isinstance(value, str) and (len(value) > 63 or not _LABEL_VALUE.match(value)):
                errors.append(
                    (
                        where,
                        (
                            f"invalid label value {value!r}: must be at most 63 characters,"
                            " and empty or start and end with an alphanumeric character"
                            " (with '-', '_', '.' between)"
                        ),
                    )
                )
    annotations = metadata.get("annotations")
    if isinstance(annotations, dict):
        total = 0
        for key, value in annotations.items():
            where = ["metadata", "annotations", str(key)]
            errors.extend(
                (where, f"key {key!r}: {e}") for e in _qualified_name_errors(str(key).lower())
            )
            total += len(str(key).encode()) + (len(value.encode()) if isinstance(value, str) else 0)
        if total > _ANNOTATIONS_MAX_BYTES:
            errors.append(
                (
                    ["metadata", "annotations"],
                    f"total size {total} exceeds {_ANNOTATIONS_MAX_BYTES} bytes",
                )
            )
    return errors


# --------------------------------------------------------------------------------------------
# The validator.


def object_label(obj: object) -> str:
    """``kind/name`` for error messages (``generateName`` when there is no name)."""
    if not isinstance(obj, Mapping):
        return f"<{type(obj).__name__}>"
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    name = metadata.get("name") or metadata.get("generateName") or "<unnamed>"
    return f"{obj.get('kind', '<no kind>')}/{name}"


Engine = typing.Literal["compiled", "jsonschema"]


class StrictValidator:
    """Validates Argo objects against strict versions of Argo v4.1.2's CRD schemas.

    The CRD of a kind is read from ``crd_dir`` (``../shared/argo/v4.1.2/crds``) on first use,
    converted, and compiled; all three are cached on the instance.  ``for_crd_dir`` shares one
    instance per directory across a test session.
    """

    def __init__(self, crd_dir: Path) -> None:
        self.crd_dir = Path(crd_dir)
        missing = [f for f in CRD_FILES.values() if not (self.crd_dir / f).is_file()]
        if missing:
            raise FileNotFoundError(f"{self.crd_dir} lacks {missing}")
        self._schemas: dict[str, tuple[dict[str, Any], ConversionStats]] = {}
        self._compiled: dict[str, Check] = {}
        self._reference: dict[str, Validator] = {}

    @classmethod
    def for_crd_dir(cls, crd_dir: Path) -> StrictValidator:
        """One shared instance per (resolved) directory."""
        return _shared_validator(Path(crd_dir).resolve())

    def schema(self, kind: str) -> dict[str, Any]:
        """The strict draft-7 JSON schema for ``kind`` (converted once, then cached)."""
        return self._converted(kind)[0]

    def stats(self, kind: str) -> ConversionStats:
        """What the conversion of ``kind``'s CRD schema did (e.g. CEL rules skipped)."""
        return self._converted(kind)[1]

    def _converted(self, kind: str) -> tuple[dict[str, Any], ConversionStats]:
        if kind not in CRD_FILES:
            raise KeyError(f"unsupported kind {kind!r}; expected one of {sorted(CRD_FILES)}")
        if kind not in self._schemas:
            crd = _load_crd(self.crd_dir / CRD_FILES[kind])
            defined = crd["spec"]["names"]["kind"]
            if defined != kind:
                raise ValueError(f"{CRD_FILES[kind]} defines {defined}, not {kind}")
            self._schemas[kind] = strict_schema_for_crd(crd)
        return self._schemas[kind]

    def _compiled_check(self, kind: str) -> Check:
        if kind not in self._compiled:
            self._compiled[kind] = compile_schema(self.schema(kind))
        return self._compiled[kind]

    def _reference_validator(self, kind: str) -> Validator:
        if kind not in self._reference:
            self._reference[kind] = JsonSchemaStrictValidator(
                self.schema(kind), format_checker=_jsonschema_format_checker()
            )
        return self._reference[kind]

    def warm(self, kinds: typing.Iterable[str] = SUPPORTED_KINDS) -> None:
        """Load, convert and compile ahead of time (e.g. before timing a validation)."""
        for kind in kinds:
            self._compiled_check(kind)

    def problems(self, obj: Mapping[str, Any], engine: Engine = "compiled") -> list[Problem]:
        """Every problem as (path, keyword, message); metadata checks use keyword 'metadata'."""
        if not isinstance(obj, Mapping):
            return [([], "type", f"expected an object, not {type(obj).__name__}")]
        kind = obj.get("kind")
        if not isinstance(kind, str) or kind not in CRD_FILES:
            return [
                (
                    ["kind"],
                    "kind",
                    f"unsupported kind {kind!r}; expected one of {sorted(CRD_FILES)}",
                )
            ]
        found: list[Problem] = []
        if engine == "compiled":
            raw: list[tuple[PathLink, str, str]] = []
            self._compiled_check(kind)(obj, None, raw)
            found.extend((_unwind(link), keyword, message) for link, keyword, message in raw)
        elif engine == "jsonschema":
            for error in self._reference_validator(kind).iter_errors(obj):
                found.extend(_jsonschema_problems(error))
        else:
            raise ValueError(f"unknown engine {engine!r}")
        found.extend(
            (path, "metadata", message)
            for path, message in metadata_errors(kind, obj.get("metadata"))
        )
        return found

    def validate(self, obj: Mapping[str, Any], engine: Engine = "compiled") -> list[str]:
        """Every problem, as ``'kind/name: $.json.path: message'``, sorted; [] when valid."""
        label = object_label(obj)
        unique = sorted({(format_json_path(p), m) for p, _, m in self.problems(obj, engine)})
        return [f"{label}: {path}: {message}" for path, message in unique]


@functools.cache
def _shared_validator(crd_dir: Path) -> StrictValidator:
    return StrictValidator(crd_dir)


# --------------------------------------------------------------------------------------------
# hera interoperability.

HERA_VERSION: Final = "7.1.0"


@dataclass
class HeraRoundtripReport:
    """What a load into hera's models and a dump back lost.

    ``lost_known``: paths whose field hera's models do have, yet the round trip lost (a real
    interoperability bug); ``lost_unknown``: paths hera's models (Argo 4.0.5) do not have, so
    pydantic ignores them (e.g. v4.1's ``pendingTimeout``); ``changed``: paths still present
    whose value differs; ``load_error``: hera refused the document.
    """

    lost_known: list[str] = field(default_factory=list)
    lost_unknown: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    load_error: str | None = None

    def lines(self) -> list[str]:
        out = [f"hera failed to load: {self.load_error}"] if self.load_error else []
        out += [f"lost (known to hera): {p}" for p in self.lost_known]
        out += [f"lost (not in hera {HERA_VERSION} models): {p}" for p in self.lost_unknown]
        out += [f"changed: {p}" for p in self.changed]
        return out


def _hera_model_for(kind: str) -> type[Any]:
    from hera.workflows import models  # imported lazily: hera takes ~1 s to import

    classes: dict[str, type[Any]] = {
        "Workflow": models.Workflow,
        "WorkflowTemplate": models.WorkflowTemplate,
        "CronWorkflow": models.CronWorkflow,
        "ClusterWorkflowTemplate": models.ClusterWorkflowTemplate,
    }
    if kind not in classes:
        raise KeyError(f"no hera model for kind {kind!r}")
    return classes[kind]


def _hera_child_types(annotation: Any, key: str | int) -> list[Any] | None:
    """The types of ``annotation[key]`` in hera's models; None if hera has no such field."""
    from pydantic import BaseModel, RootModel

    origin = typing.get_origin(annotation)
    if annotation is Any or annotation is object:
        return [Any]
    if origin in (typing.Union, types.UnionType):
        found: list[Any] = []
        for option in typing.get_args(annotation):
            if option is type(None):
                continue
            child = _hera_child_types(option, key)
            if child is not None:
                found.extend(child)
        return found or None
    if origin is typing.Annotated:
        return _hera_child_types(typing.get_args(annotation)[0], key)
    if isinstance(annotation, type) and issubclass(annotation, RootModel):
        return _hera_child_types(annotation.model_fields["root"].annotation, key)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if not isinstance(key, str):
            return None
        for name, info in annotation.model_fields.items():
            if key == (info.alias or name):
                return [info.annotation]
        return None
    if origin in (list, Sequence, typing.List) and isinstance(key, int):  # noqa: UP006
        return [typing.get_args(annotation)[0] if typing.get_args(annotation) else Any]
    if origin in (dict, Mapping, typing.Dict) and isinstance(key, str):  # noqa: UP006
        args = typing.get_args(annotation)
        return [args[1] if len(args) == 2 else Any]
    if annotation in (dict, list):
        return [Any]
    return None


def hera_knows_path(kind: str, path: Sequence[str | int]) -> bool:
    """Whether hera's model for ``kind`` has a field at ``path`` (keys and list indices)."""
    current: list[Any] = [_hera_model_for(kind)]
    for key in path:
        following: list[Any] = []
        for annotation in current:
            child = _hera_child_types(annotation, key)
            if child is not None:
                following.extend(child)
        if not following:
            return False
        if any(t is Any for t in following):
            return True
        current = following
    return True


def _diff(
    before: Json,
    after: Json,
    path: list[str | int],
    report_missing: typing.Callable[[list[str | int]], None],
    changed: list[str],
) -> None:
    if isinstance(before, dict) and isinstance(after, dict):
        for key, value in before.items():
            if value is None:
                continue  # an explicit null means "absent"; exclude_none drops it by design
            if key not in after:
                report_missing([*path, key])
            else:
                _diff(value, after[key], [*path, key], report_missing, changed)
    elif isinstance(before, list) and isinstance(after, list):
        for index, value in enumerate(before):
            if index >= len(after):
                report_missing([*path, index])
            else:
                _diff(value, after[index], [*path, index], report_missing, changed)
        if len(after) > len(before):
            changed.append(f"{format_json_path(path)}: {len(before)} items became {len(after)}")
    elif before != after or type(before) is not type(after):
        changed.append(f"{format_json_path(path)}: {before!r} became {after!r}")


def compare_roundtrip(
    kind: str, before: Mapping[str, Any], after: Mapping[str, Any]
) -> HeraRoundtripReport:
    """Classify what ``after`` (hera's dump) lost or changed relative to ``before``."""
    report = HeraRoundtripReport()

    def missing(path: list[str | int]) -> None:
        bucket = report.lost_known if hera_knows_path(kind, path) else report.lost_unknown
        bucket.append(format_json_path(path))

    _diff(dict(before), dict(after), [], missing, report.changed)
    return report


def hera_roundtrip_report(doc: Mapping[str, Any]) -> HeraRoundtripReport:
    """Load ``doc`` with hera's model for its kind, dump it back, and compare."""
    from pydantic import ValidationError as PydanticValidationError

    kind = str(doc.get("kind"))
    model = _hera_model_for(kind)
    try:
        loaded = model.model_validate(doc)
    except PydanticValidationError as error:
        return HeraRoundtripReport(load_error=str(error))
    dumped = loaded.model_dump(by_alias=True, exclude_none=True, mode="json")
    return compare_roundtrip(kind, doc, dumped)


def hera_roundtrip_loss(doc: Mapping[str, Any]) -> list[str]:
    """Every path of ``doc`` lost (or changed) by a hera 7.1.0 round trip, one line each.

    Lines start with ``lost (known to hera):``, ``lost (not in hera 7.1.0 models):``,
    ``changed:`` or ``hera failed to load:``; [] means the round trip is lossless.
    """
    return hera_roundtrip_report(doc).lines()
