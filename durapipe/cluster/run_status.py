"""A running or finished Workflow read back as durapipe stages (``durapipe status``).

Argo's node tree names tasks, retries and DAGs; a user asked for stages.  ``interpret`` turns
a Workflow object (as the API server returns it, a plain JSON mapping) into one report per
stage: its outcome, each attempt with the memory rung and GPU type it ran on and the verdict
it ended with, the budgets those attempts used, and whether a cache hit skipped it.

Everything is read from the object itself, so a run can be explained without its source:
each pod template carries the runtime contract's environment (``DURAPIPE_STAGE``,
``DURAPIPE_RUNG``, ``DURAPIPE_GPU_TYPE``, ``DURAPIPE_ATTEMPT``, often templated on the task's
input parameters, which every node records resolved), and the verdict the wrapper wrote is the
pod's termination message, which Argo copies into the node's message.  Pure: no I/O, no
Kubernetes client.

The object comes from an API server, so it is checked once, on the way in, against the shape of
everything ``interpret`` reads (``_WORKFLOW``): a part that should be an object, a list or a
plain value and is something else raises ``MalformedWorkflow`` naming where, and the reading
code below can trust the shape.  Its text is the workload's (a pod's termination message is
whatever the user's program wrote), so the human rendering makes every control character
visible (``for_terminal``) instead of letting the terminal obey it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, TypeVar, cast

import yaml

from durapipe.compiler import memo, naming
from durapipe.compiler.argo_retry import OOM_MARKERS, PREEMPTION_MARKERS
from durapipe.compiler.argo_pod import LABEL_PIPELINE, LABEL_STAGE, RESUMED_FROM_OUTPUT
from durapipe.runtime import contract, resume_report

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Json = Mapping[str, Any]

#: Verdicts beyond the runtime's own: what the controller, not the wrapper, decided.
PENDING_TIMEOUT = "pending_timeout"
ERROR = "error"
RUNNING = "running"
#: A pod that reached a node and cannot start its containers: Argo keeps such a node Pending
#: (with the container's waiting reason as its message) and never fails it.
STUCK = "cannot_start"
#: Container waiting reasons (the kubelet's) that no amount of waiting mends: the cause and
#: what to do.  ``ImagePullBackOff`` is in: a pull that failed once is retried with back-off,
#: but an image that does not exist never arrives.
STUCK_REASONS: dict[str, str] = {
    "ErrImageNeverPull": "the image is not on the node, and its pull policy Never forbids a "
                         "pull: load it onto the nodes, or change the stage's image",
    "ErrImagePull": "the image cannot be pulled: check its name and tag, the registry, and "
                    "the pipeline's image_pull_secrets",
    "ImagePullBackOff": "the image cannot be pulled: check its name and tag, the registry, "
                        "and the pipeline's image_pull_secrets",
    "InvalidImageName": "the image's name is not a valid reference: fix the stage's image",
    "CreateContainerConfigError": "a Secret or ConfigMap the container reads is missing: "
                                  "create it (durapipe doctor checks the pipeline's)",
    "CreateContainerError": "the runtime could not create the container: see the pod's events",
}
#: Node phases that end a node.
DONE_PHASES = frozenset({"Succeeded", "Failed", "Error", "Skipped", "Omitted"})
# Counts and limits are bounded in digits: ``int()`` refuses a 4,300-digit string (and a
# sum of such numbers cannot be printed), and no real count comes near 10**9.
_RETRY_SUFFIX = re.compile(r"^(.*)\((\d{1,9})\)$")
_APP_SUFFIX = re.compile(r"-app-(\d{1,9})$")
_PARAM = re.compile(r"\{\{\s*inputs\.parameters\.([-A-Za-z0-9_]+)\s*\}\}")
_RETRIES = re.compile(r"\{\{\s*retries\s*\}\}")
_AS_INT_SUM = re.compile(r"\{\{=(.*)\}\}", re.DOTALL)
_AS_INT = re.compile(r"^asInt\((.*)\)$")
#: ``inputs.parameters['preempted-before']``: a name expr cannot write after a dot.
_QUOTED_PARAM = re.compile(r"^inputs\.parameters\['([-A-Za-z0-9_]+)'\]$")


@dataclass(frozen=True)
class AttemptReport:
    """One pod the stage ran."""

    node: str
    attempt: int | None
    rung: int | None
    memory: str
    gpu_type: str
    phase: str
    verdict: str
    exit_code: str
    message: str
    reason: str
    started_at: str
    finished_at: str
    #: What its first restore found: ``#12 (step 8)``, ``""`` for a fresh line or no report.
    resumed_from: str = ""
    #: The checkpoint line it restored from, as the runtime reported it.
    checkpoint_line: str = ""
    #: The node its pod was placed on (``""``: never scheduled).
    host_node: str = ""
    #: A multi-node attempt: its JobSet, and the JobSet's restarts (each re-creates every
    #: pod), all of them and those that count toward ``maxRestarts``; ``None``: not read.
    jobset: str = ""
    restarts: int | None = None
    restarts_counted: int | None = None


@dataclass(frozen=True)
class BudgetUse:
    """How much of one retry budget a stage used; ``limit`` is what the compiled object
    allows (for the whole stage), ``None`` where it does not say."""

    used: int
    limit: int | None


@dataclass
class StageReport:
    stage: str
    phase: str
    cache_hit: bool
    attempts: list[AttemptReport] = field(default_factory=list)
    preemptions: BudgetUse = BudgetUse(0, None)
    failures: BudgetUse = BudgetUse(0, None)
    #: OOM kills, and the rungs of the ladder (``limit``: how many there are).
    oom: BudgetUse = BudgetUse(0, None)
    rungs: int = 1
    #: The rung, memory and GPU type of the attempt that succeeded (or ran last).
    rung: int | None = None
    memory: str = ""
    gpu_type: str = ""
    message: str = ""
    #: Where the stage's first attempt started from: the line and commit it restored (a run
    #: resubmitted with the same inputs resumes its predecessor's line), ``""`` if fresh.
    resumed_from: str = ""
    checkpoint_line: str = ""
    #: A multi-node stage: its JobSets' restarts, all and counted toward ``maxRestarts``
    #: (the rest are preemptions, which JobSet ignores), and ``maxRestarts`` itself.
    multinode: bool = False
    restarts: int = 0
    restarts_counted: int = 0
    max_restarts: int | None = None
    #: A memoized stage that missed: which component of its key changed against the newest
    #: entry of the stage in its cache (``memo.explain_miss``); ``""`` if not known.
    cache_miss: str = ""


@dataclass
class RunReport:
    name: str
    namespace: str
    phase: str
    message: str
    started_at: str
    finished_at: str
    progress: str
    stages: list[StageReport]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def done(self) -> bool:
        return self.phase in ("Succeeded", "Failed", "Error")


# -- the shape of what is read ----------------------------------------------------------------


class MalformedWorkflow(ValueError):
    """The object is not shaped like a Workflow where ``interpret`` reads it."""


class _Shape:
    """What one part of the object must be; ``None`` for a key passes (Argo leaves parts out,
    and the reading code takes ``null`` for absent)."""

    expected = "anything"
    #: Whether ``null`` may stand in a list or keyed object where this is expected.
    nullable = True

    def check(self, value: object, path: str) -> None:
        pass

    def refuse(self, value: object, path: str) -> MalformedWorkflow:
        return MalformedWorkflow(
            f"{path or 'the Workflow'}: expected {self.expected}, got {_json_kind(value)}")


class _Plain(_Shape):
    """A JSON scalar: text, a number, a boolean (read with ``str()``, or compared)."""

    expected = "a plain value"

    def check(self, value: object, path: str) -> None:
        if isinstance(value, (Mapping, list)):
            raise self.refuse(value, path)


@dataclass(frozen=True)
class _Object(_Shape):
    """A JSON object; of its keys, those listed are checked and the rest ignored."""

    keys: Mapping[str, _Shape]
    expected = "an object"
    nullable = False

    def check(self, value: object, path: str) -> None:
        if not isinstance(value, Mapping):
            raise self.refuse(value, path)
        for key, shape in self.keys.items():
            part = value.get(key)
            if part is not None:
                shape.check(part, f"{path}.{key}" if path else key)


@dataclass(frozen=True)
class _List(_Shape):
    item: _Shape
    expected = "a list"
    nullable = False

    def check(self, value: object, path: str) -> None:
        if not isinstance(value, list):
            raise self.refuse(value, path)
        for i, item in enumerate(value):
            _present(self.item, item, f"{path}[{i}]")


@dataclass(frozen=True)
class _ObjectOf(_Shape):
    """A JSON object keyed by names (``status.nodes``), every value of one shape."""

    value: _Shape
    expected = "an object"
    nullable = False

    def check(self, value: object, path: str) -> None:
        if not isinstance(value, Mapping):
            raise self.refuse(value, path)
        for key, item in value.items():
            _present(self.value, item, f"{path}[{_short_key(key)}]")


def _present(shape: _Shape, value: object, path: str) -> None:
    """An element of a list or keyed object, or the whole: there ``null`` is not absent."""
    if value is None and not shape.nullable:
        raise shape.refuse(value, path)
    shape.check(value, path)


def _json_kind(value: object) -> str:
    kinds = ((bool, "a boolean"), (str, "a string"), (int, "a number"), (float, "a number"),
             (list, "a list"), (Mapping, "an object"))
    return next((name for kind, name in kinds if isinstance(value, kind)),
                "null" if value is None else type(value).__name__)


def _short_key(key: object) -> str:
    text = repr(key)  # repr() shows control characters as escapes
    return text if len(text) <= 80 else text[:77] + "..."


_PLAIN = _Plain()
_PARAMETERS = _List(_Object({"name": _PLAIN, "value": _PLAIN}))
_TEMPLATE_REF = _Object({"name": _PLAIN, "template": _PLAIN})
#: Every part of a template that this module reads.
_TEMPLATE = _Object({
    "name": _PLAIN, "pendingTimeout": _PLAIN, "resource": _Shape(),
    "container": _Object({"env": _List(_Object({"name": _PLAIN, "value": _PLAIN})),
                          "resources": _Object({"limits": _Object({"memory": _PLAIN})})}),
    "metadata": _Object({"labels": _Object({"durapipe.dev/stage": _PLAIN})}),
    "retryStrategy": _Object({"limit": _PLAIN}),
    "dag": _Object({"tasks": _List(_Object({
        "name": _PLAIN, "template": _PLAIN, "templateRef": _TEMPLATE_REF,
        "arguments": _Object({"parameters": _PARAMETERS})}))}),
})
_NODE = _Object({
    "id": _PLAIN, "name": _PLAIN, "displayName": _PLAIN, "type": _PLAIN, "phase": _PLAIN,
    "message": _PLAIN, "startedAt": _PLAIN, "finishedAt": _PLAIN, "templateName": _PLAIN,
    "hostNodeName": _PLAIN,
    "templateScope": _PLAIN, "templateRef": _TEMPLATE_REF,
    "inputs": _Object({"parameters": _PARAMETERS}), "outputs": _Object({"exitCode": _PLAIN}),
    "memoizationStatus": _Object({"hit": _PLAIN, "key": _PLAIN, "cacheName": _PLAIN}),
})
#: Every part of a Workflow object that ``interpret`` (and ``durapipe watch``) reads.
_WORKFLOW = _Object({
    "metadata": _Object({"name": _PLAIN, "namespace": _PLAIN, "resourceVersion": _PLAIN}),
    "spec": _Object({"workflowTemplateRef": _Object({"name": _PLAIN}),
                     "templates": _List(_TEMPLATE)}),
    "status": _Object({
        "phase": _PLAIN, "message": _PLAIN, "startedAt": _PLAIN, "finishedAt": _PLAIN,
        "progress": _PLAIN, "nodes": _ObjectOf(_NODE), "storedTemplates": _ObjectOf(_TEMPLATE),
        "storedWorkflowTemplateSpec": _Object({"templates": _List(_TEMPLATE)}),
    }),
})


def check_shape(wf: object) -> Json:
    """``wf`` if it is shaped like a Workflow wherever this module reads it; otherwise
    ``MalformedWorkflow`` naming the first part that is not (``status.nodes['x'].inputs:
    expected an object, got a list``)."""
    _present(_WORKFLOW, wf, "")
    return cast(Json, wf)


# -- templates --------------------------------------------------------------------------------


class _Templates:
    """Every template the Workflow can run, by (WorkflowTemplate name or "", template)."""

    def __init__(self, wf: Json) -> None:
        spec, status = wf.get("spec") or {}, wf.get("status") or {}
        self.by_key: dict[tuple[str, str], Json] = {}
        self.by_name: dict[str, Json] = {}
        ref = (spec.get("workflowTemplateRef") or {}).get("name", "")
        stored_spec = status.get("storedWorkflowTemplateSpec") or {}
        for owner, templates in (("", spec.get("templates")), (ref, stored_spec.get("templates")),
                                 ("", stored_spec.get("templates"))):
            for tmpl in templates or ():
                self._add(owner, tmpl)
        for key, tmpl in sorted((status.get("storedTemplates") or {}).items()):
            parts = key.split("/")
            self._add(parts[1] if len(parts) == 3 else "", tmpl)
        self.ordered = list(dict.fromkeys(id(t) for t in self.by_key.values()))

    def _add(self, owner: str, tmpl: Json) -> None:
        name = str(tmpl.get("name", ""))
        self.by_key.setdefault((owner, name), tmpl)
        self.by_name.setdefault(name, tmpl)

    def of_node(self, node: Json) -> Json | None:
        ref = node.get("templateRef") or {}
        if ref:
            return self.by_key.get((ref.get("name", ""), ref.get("template", ""))) \
                or self.by_name.get(ref.get("template", ""))
        name = node.get("templateName", "")
        scope = str(node.get("templateScope", ""))
        owner = scope.split("/", 1)[1] if "/" in scope else ""
        return self.by_key.get((owner, name)) or self.by_name.get(name)

    def all(self) -> Iterable[tuple[tuple[str, str], Json]]:
        return self.by_key.items()


class _NoAliases(yaml.SafeLoader):  # type: ignore[misc]
    """A YAML loader that refuses anchors: a manifest from the API server is text anyone
    with `create workflows` wrote, and aliases let a few bytes expand without bound."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.YAMLError("an alias in a JobSet manifest")
        return super().compose_node(parent, index)


#: Manifests durapipe writes are a few KB; a longer one is not read for the report.
_MANIFEST_LIMIT = 256 * 1024


@dataclass(frozen=True)
class _JobSetPlan:
    """What a multi-node stage's JobSet manifest (a resource template's) says its pods run."""

    gpu_type: str
    memory: str
    max_restarts: int | None
    #: Its ``durapipe.dev/pipeline`` label, which selects the run's JobSets.
    pipeline: str = ""


def _jobset_plan(tmpl: Json | None) -> _JobSetPlan | None:
    manifest = ((tmpl or {}).get("resource") or {}).get("manifest") if tmpl else None
    if not isinstance(manifest, str) or len(manifest) > _MANIFEST_LIMIT:
        return None
    try:
        doc = yaml.load(manifest, Loader=_NoAliases)  # noqa: S506 (a safe loader, no aliases)
    except (yaml.YAMLError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("kind") != "JobSet":
        return None
    max_restarts = _dig(doc, "spec", "failurePolicy", "maxRestarts")
    if max_restarts is None and isinstance(_dig(doc, "spec"), dict):
        max_restarts = 0  # JobSet's default
    env: dict[str, str] = {}
    memory = ""
    for job in _list(_dig(doc, "spec", "replicatedJobs")):
        pod = _dig(job, "template", "spec", "template", "spec")
        for container in _list(_dig(pod, "containers")):
            if isinstance(container, dict) and container.get("name") == "main":
                env = {str(e.get("name")): str(e.get("value")) for e in
                       _list(container.get("env")) if isinstance(e, dict) and "value" in e}
                limit = _dig(container, "resources", "limits", "memory")
                memory = str(limit) if isinstance(limit, (str, int)) else ""
                break
        if env:
            break
    pipeline = _dig(doc, "metadata", "labels", LABEL_PIPELINE)
    return _JobSetPlan(
        gpu_type=env.get(contract.ENV_GPU_TYPE, ""), memory=memory,
        max_restarts=_count(max_restarts),
        pipeline=pipeline if isinstance(pipeline, str) else "")


def _dig(value: object, *path: str) -> object:
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _count(value: object) -> int | None:
    return value if type(value) is int and 0 <= value < 10**9 else None


def _components(text: object) -> dict[str, object] | None:
    if not isinstance(text, str) or len(text) > _MANIFEST_LIMIT:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _own_components(node: Json) -> dict[str, object] | None:
    return _components(_params(node).get(memo.COMPONENTS_PARAM))


def _missed_caches(nodes: Iterable[Json]) -> frozenset[str]:
    """The memoization ConfigMaps whose entries explain this run's misses: those of its
    memoized nodes that missed and recorded their key's components."""
    return frozenset(name for n in nodes
                     if isinstance(m := n.get("memoizationStatus"), dict) and not m.get("hit")
                     and m.get("cacheName") and _own_components(n) is not None
                     for name in naming.cache_siblings(str(m["cacheName"])))


def _cache_miss(node: Json, caches: Mapping[str, object]) -> str:
    """Why ``node`` (a memoized stage node) missed, from its cache's entries."""
    status = node.get("memoizationStatus") or {}
    current = _own_components(node)
    if not status or status.get("hit") or current is None:
        return ""
    # The stage's earlier entries have other keys, so they lie in any shard of its cache.
    shards = [caches.get(name) for name in naming.cache_siblings(str(status.get("cacheName", "")))]
    if not all(isinstance(data, dict) for data in shards):
        return "its cache could not be read"
    entries: list[tuple[str, Mapping[str, object]]] = []
    for key, text in (kv for data in shards if isinstance(data, dict) for kv in data.items()):
        if key == status.get("key"):
            continue  # the entry this run wrote itself once the stage succeeded
        entry = _components(text)
        outputs = entry.get("outputs") if entry else None
        params = outputs.get("parameters") if isinstance(outputs, dict) else None
        for param in params if isinstance(params, list) else ():
            if isinstance(param, dict) and param.get("name") == memo.COMPONENTS_PARAM:
                record = _components(param.get("value"))
                if record is not None:
                    entries.append((str((entry or {}).get("creationTimestamp", "")), record))
    return memo.explain_miss(current, entries)


def _jobset_selector(templates: _Templates) -> str:
    """The label selector of the run's JobSets (``durapipe.dev/pipeline=<name>``, from its
    multi-node stages' manifests), ``""`` where it has none.  Read from the manifests, not the
    Workflow's labels: a Workflow submitted from a WorkflowTemplate carries only Argo's."""
    pipelines = sorted({plan.pipeline for _key, tmpl in templates.all()
                        if (plan := _jobset_plan(tmpl)) is not None and plan.pipeline})
    return f"{LABEL_PIPELINE}={pipelines[0]}" if pipelines else ""


def _jobset_for(node: Json, stage: str, jobsets: Sequence[Json],
                taken: set[str]) -> Json | None:
    """The JobSet an attempt created: the one its ``jobset-name`` output names, else the
    oldest not yet matched that is labelled with the stage (the output is written only when
    the resource template ends)."""
    outputs = {str(p.get("name")): str(p.get("value", "")) for p in
               (node.get("outputs") or {}).get("parameters") or () if isinstance(p, dict)}
    named = outputs.get("jobset-name", "")
    for js in jobsets:
        name = str(_dig(js, "metadata", "name") or "")
        if named and name == named:
            return js
    if named:
        return None
    for js in jobsets:
        name = str(_dig(js, "metadata", "name") or "")
        if name not in taken and _dig(js, "metadata", "labels", LABEL_STAGE) == stage:
            return js
    return None


def _env(tmpl: Json) -> dict[str, str]:
    container = tmpl.get("container") or {}
    return {str(e.get("name")): str(e.get("value", "")) for e in container.get("env") or ()
            if "value" in e}


def _labelled_stage(tmpl: Json | None) -> str | None:
    labels = ((tmpl or {}).get("metadata") or {}).get("labels") or {}
    found = labels.get("durapipe.dev/stage")
    return str(found) if found else None


def _stage_of(tmpl: Json | None) -> str | None:
    """The stage whose attempts the template runs: a pod through the runtime wrapper (its
    contract environment) or a multi-node stage's JobSet (a resource template)."""
    if tmpl is None:
        return None
    stage = _env(tmpl).get(contract.ENV_STAGE)
    if stage:
        return stage
    return _labelled_stage(tmpl) if "resource" in tmpl else None


def _resolve(value: str, params: Mapping[str, str], retries: int) -> str:
    """A contract variable's value for one node: its input parameters and retry index
    substituted, and the compiler's one expression form (a sum of ``asInt``) evaluated."""
    text = _PARAM.sub(lambda m: params.get(m[1], m[0]), value)
    text = _RETRIES.sub(str(retries), text)
    m = _AS_INT_SUM.fullmatch(text)
    if m is None:
        return text
    total = 0
    for term in m[1].strip().split("+"):
        inner = _AS_INT.match(term.strip())
        raw = (inner[1] if inner else term).strip()
        quoted = _QUOTED_PARAM.match(raw)
        if quoted:
            raw = params.get(quoted[1], "")
        elif raw.startswith("inputs.parameters."):
            raw = params.get(raw[len("inputs.parameters."):], "")
        elif raw == "retries":
            raw = str(retries)
        if len(raw) > 18:  # no count is that large; see _RETRY_SUFFIX
            return text
        try:
            total += int(raw)
        except ValueError:
            return text
    return str(total)


def _int(text: str | None) -> int | None:
    try:
        return int(str(text))
    except (TypeError, ValueError):
        return None


def _memory(env: Mapping[str, str], params: Mapping[str, str], tmpl: Json) -> str:
    from durapipe.dsl import units

    if params.get("memory"):
        return params["memory"]
    limit = _int(env.get(contract.ENV_MEMORY_LIMIT))
    if limit:
        return units.format_bytes(limit)
    limits = ((tmpl.get("container") or {}).get("resources") or {}).get("limits") or {}
    return str(limits.get("memory", ""))


# -- verdicts ---------------------------------------------------------------------------------


def verdict_of(phase: str, message: str, exit_code: str) -> tuple[str, str]:
    """(verdict, reason) of one finished pod node: the wrapper's verdict line where the
    message holds one, otherwise what the exit code and the controller's message say."""
    at = message.find(contract.VERDICT_TAG)
    if at >= 0:
        rest = message[at + len(contract.VERDICT_TAG):]
        verdict, _, details = rest.partition(" ")
        reason = ""
        try:
            parsed = json.loads(details) if details.strip() else {}
            if isinstance(parsed, dict):
                reason = str(parsed.get("reason") or parsed.get("exception") or "")
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            reason = details.strip()
        if verdict in contract.VERDICTS:
            return verdict, reason
    if phase == "Succeeded":
        return contract.VERDICT_SUCCESS, ""
    if phase not in ("Failed", "Error"):
        return RUNNING, ""
    if exit_code == str(contract.EXIT_HOST_OOM) and "OOMKilled" in message or any(
            m in message for m in OOM_MARKERS):
        return contract.VERDICT_HOST_OOM, message
    if exit_code == str(contract.EXIT_PREEMPTED) or any(m in message for m in PREEMPTION_MARKERS):
        return contract.VERDICT_PREEMPTED, message
    if exit_code == str(contract.EXIT_GPU_OOM):
        return contract.VERDICT_GPU_OOM, message
    if exit_code not in ("", "-1"):
        return contract.VERDICT_APP_FAILURE, message
    return ERROR, message


# -- the report -------------------------------------------------------------------------------


def _params(node: Json) -> dict[str, str]:
    return {str(p.get("name")): str(p.get("value", ""))
            for p in (node.get("inputs") or {}).get("parameters") or ()}


def _attempt(node: Json, tmpl: Json, kubelet: str = "") -> AttemptReport:
    """One attempt's report; ``kubelet``: the stuck waiting reason its pod shows
    (``pod_waiting_message``), given only where Argo's node message names no cause."""
    display = str(node.get("displayName") or node.get("name") or "")
    m = _RETRY_SUFFIX.match(display)
    retries = int(m[2]) if m else 0
    params = _params(node)
    env = {k: _resolve(v, params, retries) for k, v in _env(tmpl).items()}
    phase = str(node.get("phase", ""))
    message = str(node.get("message", ""))
    exit_code = str((node.get("outputs") or {}).get("exitCode", ""))
    verdict, reason = verdict_of(phase, message, exit_code)
    host_node = str(node.get("hostNodeName") or "")
    if verdict == ERROR and message == "timeout" and tmpl.get("pendingTimeout"):
        # The controller failed the pod while it was Pending (and deleted it). Unscheduled,
        # the GPU type gave way to the next one; on a node, the attempt goes on on this type
        # (docs/lowering.md, "GPU fallback").
        verdict, reason = PENDING_TIMEOUT, (
            f"on node {host_node} but not started within {tmpl['pendingTimeout']}; the stage "
            "stays on this GPU type, one preemption spent" if host_node else
            f"no capacity within {tmpl['pendingTimeout']}")
    elif stuck := stuck_reason(cause := kubelet or message):
        if phase == "Pending":
            verdict, reason, message = STUCK, stuck, cause
        elif verdict == ERROR:  # it ended, by its deadline or a deletion, without starting
            reason = f"{message} ({stuck})"
    outputs = {str(p.get("name")): str(p.get("value", "")) for p in
               (node.get("outputs") or {}).get("parameters") or () if isinstance(p, dict)}
    restore = resume_report.parse(outputs.get(RESUMED_FROM_OUTPUT, ""))
    return AttemptReport(
        resumed_from=resume_report.describe(restore),
        checkpoint_line=str(restore["line"]) if restore is not None else "",
        node=display, attempt=_int(env.get(contract.ENV_ATTEMPT)),
        rung=_int(env.get(contract.ENV_RUNG)), memory=_memory(env, params, tmpl),
        gpu_type=env.get(contract.ENV_GPU_TYPE, ""), phase=phase, verdict=verdict,
        exit_code=exit_code, message=message, reason=reason,
        started_at=str(node.get("startedAt") or ""), finished_at=str(node.get("finishedAt") or ""),
        host_node=host_node)


def stuck_reason(message: str) -> str:
    """What a Pending pod's message (Argo's pending reason: the first waiting container's
    ``Reason: message``) says about a start that will not happen by waiting, ``""`` if it
    does not; also reads Argo's ``Pod failed before main container starts due to ...``."""
    head = message.removeprefix("Pod failed before ")
    if head is not message:
        _, _, head = head.partition(" due to ")
    reason = head.partition(":")[0].strip()
    return STUCK_REASONS.get(reason, "")


#: Argo's annotations on a pod naming the node it runs.
ANNOTATION_NODE_ID = "workflows.argoproj.io/node-id"
ANNOTATION_NODE_NAME = "workflows.argoproj.io/node-name"
#: The longest waiting message kept from a pod (the kubelet's text, quoted in the report).
_WAITING_MESSAGE_LIMIT = 1000


def find_pod(node: Mapping[str, Any],
             pods: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The pod that ran ``node``: Argo names pods ``<run>-<template>-<hash>`` and records the
    node on each pod's annotations; older pod names are the node's id."""
    pods = list(pods)
    for pod in pods:
        notes = (pod.get("metadata") or {}).get("annotations") or {}
        if notes.get(ANNOTATION_NODE_ID) == node.get("id") or (
                notes.get(ANNOTATION_NODE_NAME) and
                notes.get(ANNOTATION_NODE_NAME) == node.get("name")):
            return pod
    return next((pod for pod in pods
                 if (pod.get("metadata") or {}).get("name") == node.get("id")), None)


def pod_of(node: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> str | None:
    """The name of the pod that ran ``node`` (``find_pod``)."""
    pod = find_pod(node, pods)
    return None if pod is None else str((pod.get("metadata") or {}).get("name"))


def pod_waiting_message(pod: object) -> str:
    """The kubelet's ``Reason: message`` for a container of ``pod`` that waits for what
    waiting does not mend (``stuck_reason``), init containers first; ``""`` if none does.

    Argo's pending message reads only the main containers, which wait as ``PodInitializing``
    while an init container cannot start; durapipe's preflight init container runs in the
    stage's image, so a missing image shows only here."""
    status = _dig(pod, "status")
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in _list(_dig(status, key)):
            waiting = _dig(container, "state", "waiting")
            reason = _dig(waiting, "reason")
            if not isinstance(reason, str):
                continue
            message = _dig(waiting, "message")
            text = f"{reason}: {message}" if isinstance(message, str) and message else reason
            if stuck_reason(text):
                return text[:_WAITING_MESSAGE_LIMIT]
    return ""


#: What Argo's node says of a pod whose main containers wait behind its init containers.
_INITIALIZING = frozenset({"", "PodInitializing"})


def _never_started(node: Json) -> bool:
    """A pod node on a node whose main container has not run, and whose message does not
    say why: Pending behind its init containers, or ended with no exit code."""
    if node.get("type") != "Pod" or not node.get("hostNodeName"):
        return False
    message = str(node.get("message", ""))
    if node.get("phase") == "Pending":
        return message in _INITIALIZING
    return (node.get("phase") in ("Error", "Failed") and not stuck_reason(message)
            and not str((node.get("outputs") or {}).get("exitCode", "")))


#: What Argo's node says of an attempt whose pod was deleted under it.
POD_DELETED = "pod deleted"
#: The reason of the Event Kueue records on a pod it stops (v0.17 ``jobframework.ReasonStopped``:
#: a preemption, an eviction), whose message says why; the pod itself is then deleted.
KUEUE_STOPPED = "Stopped"
#: Argo v4's longest pod-name prefix (``util.maxPrefixLength - 1``).
_POD_PREFIX_LIMIT = 253 - 10 - 1


def pod_name(workflow: str, node: Mapping[str, Any]) -> str:
    """The name Argo v4 gave the pod of ``node`` (``util.GeneratePodName``, names v2): the
    Workflow's name and the template's, then the FNV-1a hash of the node's name."""
    name = str(node.get("name") or "")
    template = str(node.get("templateName") or
                   (node.get("templateRef") or {}).get("template") or "")
    prefix = f"{workflow}-{template}" if template else workflow
    digest = 0x811C9DC5
    for byte in name.encode():
        digest = ((digest ^ byte) * 0x01000193) & 0xFFFFFFFF
    return f"{prefix[:_POD_PREFIX_LIMIT]}-{digest}"


def _deleted(node: Json) -> bool:
    return node.get("type") == "Pod" and str(node.get("message", "")) == POD_DELETED


@dataclass(frozen=True)
class Reads:
    """What ``interpret`` would use besides the Workflow, to be read from the cluster."""

    #: The label selector of the run's JobSets (its multi-node stages), ``""``: none.
    jobset_selector: str = ""
    #: Whether the run's pods say more (``pod_waiting_message``): an attempt whose main
    #: container never ran on the node it reached, and Argo does not say why.
    pods: bool = False
    #: The memoization ConfigMaps whose entries explain its cache misses.
    caches: frozenset[str] = frozenset()
    #: Pods deleted under an attempt, which Kueue may have stopped (its ``Stopped`` events).
    deleted_pods: frozenset[str] = frozenset()


def reads_for(wf: Mapping[str, Any]) -> Reads:
    """What else to read for ``interpret``, from one shape check (it costs ~20 ms at 2,000
    nodes, and `watch` asks on every event); nothing for a Workflow it cannot read."""
    try:
        checked = check_shape(wf)
    except MalformedWorkflow:
        return Reads()
    nodes = list(((checked.get("status") or {}).get("nodes") or {}).values())
    workflow = str((checked.get("metadata") or {}).get("name") or "")
    return Reads(jobset_selector=_jobset_selector(_Templates(checked)),
                 pods=any(_never_started(n) for n in nodes), caches=_missed_caches(nodes),
                 deleted_pods=frozenset(pod_name(workflow, n) for n in nodes if _deleted(n)))


@dataclass
class _Planned:
    """What the compiled templates say a stage may do."""

    preemption_limit: int | None = None
    attempts_limit: int = 0
    rungs: set[str] = field(default_factory=set)
    pod_templates: set[str] = field(default_factory=set)


#: A counted task's limit: what is left of the stage's budget (``argo_retry.preemption_limit``).
_LEFT_OF_BUDGET = re.compile(r"\{\{=(\d{1,9}) - ")


def _budget_of(limit: object) -> int | None:
    """The stage's preemption budget from a task's ``retryStrategy.limit``."""
    found = _LEFT_OF_BUDGET.match(limit) if isinstance(limit, str) else None
    return int(found.group(1)) if found else _int(None if limit is None else str(limit))


def _planned(templates: _Templates) -> dict[str, _Planned]:
    """Per stage, in the order the compiled object lists them: its budgets and rungs."""
    plans: dict[str, _Planned] = {}
    pod_stage: dict[str, str] = {}
    for (_owner, name), tmpl in templates.all():
        stage = _stage_of(tmpl)
        if stage is None:
            continue
        plan = plans.setdefault(stage, _Planned())
        pod_stage[name] = stage
        plan.pod_templates.add(name)
        limit = _budget_of((tmpl.get("retryStrategy") or {}).get("limit"))
        if limit is not None:
            plan.preemption_limit = max(plan.preemption_limit or 0, limit)
        rung = _env(tmpl).get(contract.ENV_RUNG, "")
        if rung and "{{" not in rung:
            plan.rungs.add(rung)
    for _key, tmpl in templates.all():
        for task in (tmpl.get("dag") or {}).get("tasks") or ():
            ref = task.get("templateRef") or {}
            stage = pod_stage.get(str(ref.get("template") or task.get("template", "")))
            if stage is None:
                continue
            plan = plans[stage]
            m = _APP_SUFFIX.search(str(task.get("name", "")))
            if m:
                plan.attempts_limit = max(plan.attempts_limit, int(m[1]))
            args = {str(p.get("name")): str(p.get("value", ""))
                    for p in (task.get("arguments") or {}).get("parameters") or ()}
            if "rung" in args:
                plan.rungs.add(args["rung"])
    return plans


def _stage_node(nodes: Iterable[Json], stage: str) -> Json | None:
    """The node of the stage's own task: the DAG of its grid, or its single leaf."""
    task = naming.task_name(stage)
    found = [n for n in nodes if n.get("displayName") == task and n.get("type") != "Pod"]
    if not found:
        found = [n for n in nodes if n.get("displayName") == task]
    return found[0] if found else None


def stage_pods(wf: object) -> dict[str, list[Json]]:
    """Each stage's pod nodes (its attempts, in the order ``interpret`` numbers them: by
    start time), for finding an attempt's pod (``durapipe logs``)."""
    checked = check_shape(wf)
    templates = _Templates(checked)
    nodes = list(((checked.get("status") or {}).get("nodes") or {}).values())
    nodes.sort(key=lambda n: (str(n.get("startedAt") or "~"), str(n.get("id", ""))))
    found: dict[str, list[Json]] = {s: [] for s in _planned(templates)}
    for node in nodes:
        if node.get("type") != "Pod":
            continue
        stage = _stage_of(templates.of_node(node))
        if stage is not None:
            found.setdefault(stage, []).append(node)
    return found


def workflow_parameters(wf: Json) -> dict[str, str]:
    """The run's workflow parameters as Argo used them: a WorkflowTemplate's defaults (the
    stored spec), then the Workflow's own arguments."""
    values: dict[str, str] = {}
    stored = (wf.get("status") or {}).get("storedWorkflowTemplateSpec") or {}
    for spec in (stored, wf.get("spec") or {}):
        for param in ((spec.get("arguments") or {}).get("parameters") or ()):
            if isinstance(param, dict) and "value" in param:
                values[str(param.get("name"))] = str(param["value"])
    return values


def checkpoint_lines(wf: object) -> dict[str, str]:
    """The checkpoint line each stage of the run used, by stage (``durapipe submit
    --resume-from``): its pods' ``DURAPIPE_CHECKPOINT_URI`` as Argo resolved it, from the
    node's inputs, the run's name and parameters, and the compiler's key expression
    (``memo.evaluate_keys_in``).  A stage whose pods never ran, or whose line cannot be told
    (a multi-node stage's pods are a JobSet's), is left out."""
    checked = check_shape(wf)
    templates = _Templates(checked)
    params = workflow_parameters(checked)
    run = str((checked.get("metadata") or {}).get("name", ""))
    lines: dict[str, str] = {}
    for stage, nodes in stage_pods(checked).items():
        for node in nodes:
            tmpl = templates.of_node(node)
            uri = _env(tmpl).get(contract.ENV_CHECKPOINT_URI, "") if tmpl else ""
            inputs = _params(node)
            uri = memo.evaluate_keys_in(uri.replace("{{workflow.name}}", run), params, inputs)
            uri = _PARAM.sub(lambda m: inputs.get(m[1], m[0]), uri)
            if uri and "{{" not in uri:
                lines[stage] = uri
                break
    return lines


def interpret(wf: object, jobsets: Iterable[object] = (),
              caches: Mapping[str, object] | None = None,
              pods: Iterable[object] = (), stopped: Mapping[str, str] | None = None) -> RunReport:
    """The stage report of one Workflow object (any phase, any point of its run), as the API
    server returned it; ``MalformedWorkflow`` where it is not shaped like one (``check_shape``).

    ``jobsets``: the JobSets of the run's multi-node stages (``reads_for``), whose restarts
    the Workflow does not record; other objects in it are ignored.  ``caches``: the data of
    the memoization ConfigMaps it uses (``reads_for``), which say why a stage missed.
    ``pods``: the run's pods (``reads_for``), whose containers say why one cannot start.
    ``stopped``: of its deleted pods (``reads_for``), those Kueue stopped, with its words."""
    checked = check_shape(wf)
    run_pods = [p for p in pods if isinstance(p, dict)]
    own_uid = (checked.get("metadata") or {}).get("uid")
    owned = sorted((js for js in jobsets if isinstance(js, dict) and (
        own_uid is None or any(isinstance(ref, dict) and ref.get("uid") == own_uid
                               for ref in _list(_dig(js, "metadata", "ownerReferences"))))),
        key=lambda js: (str(_dig(js, "metadata", "creationTimestamp") or ""),
                        str(_dig(js, "metadata", "name") or "")))
    taken: set[str] = set()
    meta, status = checked.get("metadata") or {}, checked.get("status") or {}
    templates = _Templates(checked)
    plans = _planned(templates)
    nodes = list((status.get("nodes") or {}).values())
    nodes.sort(key=lambda n: (str(n.get("startedAt") or "~"), str(n.get("id", ""))))
    by_stage: dict[str, list[AttemptReport]] = {s: [] for s in plans}
    notes: dict[str, str] = {}
    multinode: dict[str, _JobSetPlan] = {}
    for node in nodes:
        if node.get("type") != "Pod":
            continue
        tmpl = templates.of_node(node)
        stage = _stage_of(tmpl)
        if stage is None or tmpl is None:
            # A pod of the stage that is no attempt (the OOM ladder's exhausted marker): its
            # message says why the stage ended.
            labelled = _labelled_stage(tmpl)
            if labelled is not None and node.get("message"):
                notes[labelled] = str(node["message"])
            continue
        pod = find_pod(node, run_pods) if run_pods and _never_started(node) else None
        attempt = _attempt(node, tmpl, pod_waiting_message(pod) if pod is not None else "")
        kueue = (stopped or {}).get(pod_name(str(meta.get("name") or ""), node)) \
            if _deleted(node) else None
        if kueue is not None:
            attempt = replace(attempt, reason=f"preempted by Kueue: {kueue}")
        js_plan = _jobset_plan(tmpl)
        if js_plan is not None:
            js = _jobset_for(node, stage, owned, taken)
            name = str(_dig(js, "metadata", "name") or "") if js is not None else ""
            taken.add(name)
            attempt = replace(
                attempt, memory=js_plan.memory, gpu_type=js_plan.gpu_type, jobset=name,
                restarts=_count(_dig(js, "status", "restarts") or 0) if js else None,
                restarts_counted=_count(_dig(js, "status", "restartsCountTowardsMax") or 0)
                if js else None)
            multinode[stage] = js_plan
        by_stage.setdefault(stage, []).append(attempt)
    stages = []
    for stage, attempts in by_stage.items():
        plan = plans.get(stage, _Planned())
        own = _stage_node(nodes, stage)
        stage_nodes = [own] if own is not None else []
        hit = any(((n.get("memoizationStatus") or {}).get("hit")) for n in stage_nodes) or any(
            ((n.get("memoizationStatus") or {}).get("hit")) and _stage_of(templates.of_node(n))
            == stage for n in nodes)
        phase = str(own.get("phase", "")) if own is not None else ""
        if phase in ("", "Pending") and any(a.phase == "Running" for a in attempts):
            phase = "Running"
        elif not phase:
            phase = "Pending" if not attempts else attempts[-1].phase
        verdicts = [a.verdict for a in attempts]
        ran = next((a for a in reversed(attempts) if a.verdict == contract.VERDICT_SUCCESS),
                   attempts[-1] if attempts else None)
        first = next((a for a in attempts if a.checkpoint_line), None)
        restarts = sum(a.restarts or 0 for a in attempts)
        counted = min(sum(a.restarts_counted or 0 for a in attempts), restarts)
        jobset_plan = multinode.get(stage)
        stages.append(StageReport(
            multinode=jobset_plan is not None, restarts=restarts, restarts_counted=counted,
            max_restarts=jobset_plan.max_restarts if jobset_plan else None,
            stage=stage, phase=phase, cache_hit=bool(hit), attempts=attempts,
            # A probe that gave way on a node lost its pod there: its type's `-retry` task
            # starts with one preemption spent (docs/lowering.md, "GPU fallback").
            preemptions=BudgetUse(verdicts.count(contract.VERDICT_PREEMPTED) + sum(
                a.verdict == PENDING_TIMEOUT and bool(a.host_node) for a in attempts),
                plan.preemption_limit) if jobset_plan is None else
            # JobSet restarts the pods after a disruption without counting it (and without
            # a limit: RestartJobSetAndIgnoreMaxRestarts).
            BudgetUse(restarts - counted, None),
            # Application attempts that failed, of the 1 + ``retry.attempts`` the stage has;
            # of a JobSet, its counted restarts, and its end if it failed, of 1 + maxRestarts.
            failures=BudgetUse(verdicts.count(contract.VERDICT_APP_FAILURE)
                               + verdicts.count(contract.VERDICT_GPU_OOM), plan.attempts_limit + 1)
            if jobset_plan is None else BudgetUse(
                counted + sum(a.phase in ("Failed", "Error") for a in attempts[-1:]),
                None if jobset_plan.max_restarts is None else jobset_plan.max_restarts + 1),
            oom=BudgetUse(verdicts.count(contract.VERDICT_HOST_OOM),
                          max(len(plan.rungs) - 1, 0)),
            rungs=max(len(plan.rungs), 1),
            rung=ran.rung if ran else None, memory=ran.memory if ran else "",
            gpu_type=ran.gpu_type if ran else "",
            message=notes.get(stage) or (str(own.get("message", "")) if own is not None else ""),
            resumed_from=first.resumed_from if first else "",
            checkpoint_line=first.checkpoint_line if first else "",
            cache_miss=_cache_miss(own, caches) if own is not None and caches is not None
            and not hit else "",
        ))
    return RunReport(
        name=str(meta.get("name", "")), namespace=str(meta.get("namespace", "")),
        phase=str(status.get("phase") or "Pending"), message=str(status.get("message", "")),
        started_at=str(status.get("startedAt") or ""),
        finished_at=str(status.get("finishedAt") or ""),
        progress=str(status.get("progress", "")), stages=stages)


# -- rendering --------------------------------------------------------------------------------

#: What a terminal would obey instead of print: C0 controls (ESC, BEL, CR, LF, ...), DEL, C1
#: controls (U+009B is a one-character CSI), and Unicode's bidirectional and line controls,
#: which reorder or break a line.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_D = TypeVar("_D", bound="DataclassInstance")


def printable(text: str) -> str:
    """``text`` with each control character written as its Python escape (``\\x1b``,
    ``\\n``, ``\\u202e``), so that text from the cluster shows on one line, as it is."""
    return _CONTROL.sub(lambda m: _NAMED_ESCAPES.get(m[0]) or (
        f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}"), text)


def _printable_fields(item: _D) -> _D:
    return replace(item, **{f.name: printable(v) for f in fields(item)
                            if isinstance(v := getattr(item, f.name), str)})


def for_terminal(report: RunReport) -> RunReport:
    """The report with every text in it ``printable``: names, phases, messages and reasons
    come from the API server and the workload (``--json`` escapes them its own way)."""
    return replace(_printable_fields(report), stages=[
        replace(_printable_fields(s), attempts=[_printable_fields(a) for a in s.attempts])
        for s in report.stages])



def _budget(b: BudgetUse) -> str:
    return f"{b.used}/{b.limit}" if b.limit is not None else str(b.used)


def table(report: RunReport) -> list[str]:
    """One line per stage, columns aligned: what `status` prints and `watch` redraws."""
    report = for_terminal(report)
    head = ("STAGE", "PHASE", "ATTEMPTS", "PREEMPT", "FAILED", "OOM", "MEMORY", "GPU", "CACHE")
    rows = [head]
    for s in report.stages:
        rows.append((
            s.stage, s.phase, str(len(s.attempts) + s.restarts),
            _budget(s.preemptions),
            _budget(s.failures), f"{s.oom.used} (rung {(s.rung or 0) + 1}/{s.rungs})"
            if s.rungs > 1 else str(s.oom.used),
            s.memory or "-", s.gpu_type or "-", "hit" if s.cache_hit else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def render(report: RunReport) -> str:
    """The human report: the run, the stage table, then each failed attempt's verdict."""
    report = for_terminal(report)
    lines = [f"{report.namespace}/{report.name}: {report.phase}"
             + (f" ({report.progress})" if report.progress else "")
             + (f": {report.message}" if report.message else ""), ""]
    lines += table(report)
    ended = [s for s in report.stages if s.phase in ("Failed", "Error") and s.message]
    if ended:
        lines += [""] + [f"{s.stage}: {s.message}" for s in ended]
    multinode = [s for s in report.stages if s.multinode and s.attempts]
    if multinode:
        lines += ["", "Multi-node stages (JobSet restarts re-create every pod):"]
        for s in multinode:
            names = ", ".join(a.jobset or "(not found)" for a in s.attempts)
            limit = f" of maxRestarts {s.max_restarts}" if s.max_restarts is not None else ""
            lines.append(f"  {s.stage}: {names}: {s.restarts} restart(s), {s.restarts_counted}"
                         f" counted{limit}, {s.restarts - s.restarts_counted} not counted "
                         "(disruptions: preemptions, node maintenance)"
                         if any(a.restarts is not None for a in s.attempts) else
                         f"  {s.stage}: {names}: restarts not known (its JobSet was not read)")
    missed = [s for s in report.stages if s.cache_miss]
    if missed:
        lines += ["", "Cache misses (what changed against the newest entry of the stage):"]
        lines += [f"  {s.stage}: {s.cache_miss}" for s in missed]
    resumed = [s for s in report.stages if s.resumed_from]
    if resumed:
        lines += ["", "Resumed from checkpoints:"]
        lines += [f"  {s.stage}: {s.resumed_from} of {s.checkpoint_line}" for s in resumed]
    stuck = [(s.stage, a) for s in report.stages for a in s.attempts if a.verdict == STUCK]
    if stuck:
        lines += ["", "Cannot start (Argo keeps such a pod Pending and never fails it: the "
                  "attempt waits for its timeout, if the stage has one, or for durapipe stop):"]
        for stage, a in stuck:
            where = ", ".join(x for x in (f"attempt {a.attempt}" if a.attempt is not None else "",
                                          a.gpu_type, f"node {a.host_node}" if a.host_node
                                          else "") if x)
            lines.append(f"  {stage} {a.node} [{where}]: {a.reason}")
            lines.append(f"    {a.message}")
    failed = [(s.stage, a) for s in report.stages for a in s.attempts
              if a.verdict not in (contract.VERDICT_SUCCESS, RUNNING, STUCK)]
    if failed:
        lines += ["", "Failed attempts:"]
        for stage, a in failed:
            where = ", ".join(x for x in (f"attempt {a.attempt}" if a.attempt is not None else "",
                                          a.memory, a.gpu_type) if x)
            detail = a.reason or a.message
            lines.append(f"  {stage} {a.node} [{where}]: {a.verdict}"
                         + (f" (exit {a.exit_code})" if a.exit_code else "")
                         + (f": {detail}" if detail else ""))
    return "\n".join(lines) + "\n"


#: `durapipe watch`'s exit code per end phase.
EXIT_CODES = {"Succeeded": 0, "Failed": 1, "Error": 2}


__all__ = ["AttemptReport", "BudgetUse", "MalformedWorkflow", "RunReport", "StageReport",
           "check_shape", "checkpoint_lines", "workflow_parameters", "for_terminal", "interpret", "printable", "render", "stage_pods", "table",
           "Reads", "reads_for", "stuck_reason", "verdict_of", "STUCK", "STUCK_REASONS",
           "EXIT_CODES"]
