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

:class:`KubeChecks` turns these rules into the diagnostics (P0321, P0342-P0344, P0404) that
``validate`` reports with the language's own.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any

from durapipe.dsl.diagnostics import Diagnostic, error
from durapipe.dsl.model import Interp, Pipeline, Ref, Secret, Stage
from durapipe.dsl.source import KEY, Span

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


# -- the checks ---------------------------------------------------------------------------------


class KubeChecks:
    """What the API server (or Argo) would refuse in a pipeline, as diagnostics: ``at`` places
    a location of the model, ``add`` reports (both the validator's)."""

    def __init__(self, pipeline: Pipeline, at: Callable[..., Span | None],
                 add: Callable[[Diagnostic], None]) -> None:
        self.p = pipeline
        self.at = at
        self.add = add

    def templates(self) -> None:
        """P0404 for every string that would reach Argo holding `{{`: found here, not by the
        compiler, so `check`, `compile` and `run` refuse the same file with one diagnostic."""
        for loc, text, before_ref in template_texts(self.p):
            if template_problem(text, before_ref=before_ref):
                self.add(error(
                    "P0404", f"{text[:60]!r} contains `{{{{`, which Argo would treat as a "
                    "template" if "{{" in text else
                    f"{text[-60:]!r} ends in `{{` before a `${{...}}` reference, which Argo "
                    "would read as `{{`", self.at(*loc), "Argo would substitute this",
                    help="Argo has no escape for `{{`; build this text inside the command at "
                         "run time, or keep it in a file in the image"))

    def kubernetes_text(self) -> None:
        """Names and labels the API server would refuse (P0321)."""
        def bad(loc: tuple[Any, ...], what: str, text: str,
                rule: Callable[[str], str | None]) -> None:
            # Text holding `{{` is P0404's already: one mistake, one diagnostic.
            problem = None if "{{" in text else rule(text)
            if problem:
                self.add(error("P0321", f'{what} "{text}" is not valid for Kubernetes',
                               self.at(*loc), problem))

        p = self.p
        if p.namespace is not None:
            bad(("namespace",), "namespace", p.namespace, dns_label_problem)
        if p.queue is not None:
            bad(("queue",), "queue", p.queue, dns_label_problem)
        for name in ("storage_secret", "service_account"):
            value = getattr(p, name, None)
            if isinstance(value, str):
                bad((name,), f"`{name}`", value, dns_subdomain_problem)
        blocks: list[tuple[tuple[Any, ...], dict[str, str], bool]] = [
            (("labels",), p.labels, True), (("annotations",), p.annotations, False)]
        for i, stage in enumerate(p.stages):
            blocks.append((("stages", i, "labels"), stage.labels, True))
            blocks.append((("stages", i, "annotations"), stage.annotations, False))
            for key, value in stage.env.items():
                if isinstance(value, Secret):
                    loc = ("stages", i, "env", key)
                    bad(loc, "secret name", value.name, dns_subdomain_problem)
                    bad(loc, "secret key", value.key, config_key_problem)
        for loc, mapping, is_label in blocks:
            kind = "label" if is_label else "annotation"
            for key, value in mapping.items():
                bad((*loc, key, KEY), f"{kind} key", key, qualified_name_problem)
                if is_label:
                    bad((*loc, key), "label value", value, label_value_problem)

    # -- cluster settings ---------------------------------------------------------------------

    def k8s_name(self, what: str, value: str, loc: tuple[Any, ...], *,
                 label: bool = False) -> None:
        problem = None if "{{" in value else (
            dns_label_problem if label else dns_subdomain_problem)(value)
        if problem:
            self.add(error("P0321", f'{what} "{value}" is not a valid Kubernetes name',
                           self.at(*loc), problem,
                           help="use lower-case letters, digits and `-`"
                           + ("" if label else " (and `.`)")))

    def node_labels(self, what: str, labels: dict[str, Any], loc: tuple[Any, ...]) -> None:
        for key, value in labels.items():
            problem = None if "{{" in key else qualified_name_problem(key)
            where = (*loc, key, KEY)
            if problem is None:
                values = value if isinstance(value, tuple) else (value,)
                for j, item in enumerate(values):
                    problem = None if "{{" in item else label_value_problem(item)
                    if problem:
                        where = (*loc, key, j) if isinstance(value, tuple) else (*loc, key)
                        self.add(error("P0321", f'{what} value "{item}" of `{key}` is not a '
                                       "valid label value", self.at(*where), problem,
                                       help="at most 63 letters, digits, `-`, `_` and `.`"))
                continue
            self.add(error("P0321", f'{what} key "{key}" is not a valid label key',
                           self.at(*where), problem, help='e.g. "example.com/pool" or "pool"'))

    def cluster_settings(self, i: int, stage: Stage) -> None:
        base = ("stages", i)
        if stage.service_account is not None:
            self.k8s_name("service account", stage.service_account, (*base, "service_account"))
        if stage.priority_class is not None:
            self.k8s_name("priority class", stage.priority_class, (*base, "priority_class"))
        if stage.queue is not None:
            # A LocalQueue's name, carried as a label value: a DNS-1123 label fits both.
            self.k8s_name("queue", stage.queue, (*base, "queue"), label=True)
        self.node_labels("node selector", stage.node_selector, (*base, "node_selector"))
        if stage.affinity is not None:
            for part in ("required", "preferred"):
                self.node_labels("affinity", getattr(stage.affinity, part),
                                 (*base, "affinity", part))
        for j, text in enumerate(stage.tolerations):
            parsed = parse_toleration(text)
            if isinstance(parsed, str):
                self.add(error("P0342", f'toleration "{text}" is not `key[=value][:Effect]`',
                               self.at(*base, "tolerations", j), parsed,
                               help='e.g. "nvidia.com/gpu:NoSchedule" or "dedicated=ml"'))
        self.volumes(i, stage)
        if stage.pod_patch is not None:
            self.pod_patch(i, stage.pod_patch)

    def volumes(self, i: int, stage: Stage) -> None:
        base = ("stages", i, "volumes")
        paths: dict[str, str] = {}
        reserved = [*RESERVED_MOUNTS]
        if stage.checkpoint is not None:
            reserved.append(stage.checkpoint.path)
        for name, volume in stage.volumes.items():
            self.k8s_name("volume", name, (*base, name), label=True)
            sources = [(k, v) for k, v in (("claim", volume.claim), ("secret", volume.secret),
                                           ("config_map", volume.config_map)) if v is not None]
            if len(sources) != 1:
                self.add(error("P0343", f"volume `{name}` needs exactly one of `claim`, `secret` "
                               f"and `config_map`, not {len(sources)}", self.at(*base, name),
                               "one source per volume",
                               help='e.g. `claim = "datasets"` for a PersistentVolumeClaim'))
            for key, value in sources:
                self.k8s_name(key.replace("_", " "), value, (*base, name, key))
            path = volume.path.rstrip("/") or "/"
            problem = None
            if not path.startswith("/"):
                problem = "not an absolute path"
            elif path == "/":
                problem = "the root directory"
            elif path in paths:
                problem = f"also the path of volume `{paths[path]}`"
            else:
                for other in reserved:
                    if path == other or path.startswith(other + "/") or \
                            other.startswith(path + "/"):
                        problem = f"overlaps {other}, which the pod mounts itself"
                        break
            if problem:
                self.add(error("P0343", f"volume `{name}` cannot be mounted at "
                               f'"{volume.path}"', self.at(*base, name, "path"), problem,
                               help='choose another absolute path, e.g. "/data"'))
            paths.setdefault(path, name)

    def pod_patch(self, i: int, text: str) -> None:
        loc = ("stages", i, "pod_patch")
        for problem in patch_problems(text)[:5]:
            shown = ".".join(str(p) for p in problem.path) or "the patch"
            span = self._key_span(self.at(*loc), problem.path)
            self.add(error("P0344", f"`pod_patch`: {shown}: {problem.message}", span,
                           problem.message,
                           help="see `kubectl explain pod.spec`; the patch is JSON, merged "
                                "into the pod spec as `kubectl patch --type strategic` would"))

    @staticmethod
    def _key_span(span: Span | None, path: tuple[str | int, ...]) -> Span | None:
        """The bad key's own text inside the patch, when the patch is written in this file."""
        keys = [p for p in path if isinstance(p, str)]
        if span is None or not keys:
            return span
        text = span.source.text[span.start:span.end]
        pos = 0
        for key in keys:  # each key after the one before it: the right `name` of several
            found = text.find(json.dumps(key), pos)
            if found < 0:
                return span
            pos = found
        return Span(span.source, span.start + pos, span.start + pos + len(json.dumps(keys[-1])))
