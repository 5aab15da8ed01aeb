"""The validated pipeline model: what a ``.pipe`` file and the Python builder both produce.

Every model is a frozen dataclass built only through ``typecheck.build`` (which rejects unknown
fields and checks the annotations below), so two sources that mean the same pipeline build
*equal* models (the builder-twin tests rely on that).  Quantities are canonical integers
(bytes, millicores, seconds); source positions are kept apart, in a ``SourceMap`` keyed like
the model's field paths, so they never affect equality.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, ClassVar, Literal, Union

from durapipe.dsl import units
from durapipe.dsl.typecheck import Bounds, Convert, MinItems

#: Memory and storage sizes, in bytes.
Bytes = Annotated[int, Convert(units.parse_bytes), Bounds(ge=0)]
#: CPU amounts, in millicores.
MilliCpu = Annotated[int, Convert(units.parse_millicpu), Bounds(gt=0)]
#: Durations, in whole seconds.
Seconds = Annotated[int, Convert(units.parse_seconds), Bounds(ge=0)]

#: Every model class is immutable, compared by value and built with keywords only.  Counts
#: and flags are plain ``int`` and ``bool``, which ``typecheck`` takes exactly:
#: `attempts = "3"` or `interruptible = "yes"` is a mistake to report, not a value to convert.


# -- values -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Ref:
    """A reference: ``params.epochs``, ``prep.outputs.data`` or a bare stage name ``train``."""

    described_as: ClassVar[str] = "a reference such as `prep.outputs.data`"

    path: tuple[str, ...]

    @property
    def is_param(self) -> bool:
        return len(self.path) == 2 and self.path[0] == "params"

    @property
    def is_output(self) -> bool:
        return len(self.path) == 3 and self.path[1] == "outputs"

    @property
    def stage(self) -> str | None:
        """The stage this reference depends on, if any."""
        if self.is_param:
            return None
        return self.path[0]

    def __str__(self) -> str:
        return ".".join(self.path)


@dataclass(frozen=True, kw_only=True)
class Interp:
    """A string with ``${...}`` interpolations: literal text and references, in order."""

    parts: tuple[str | Ref, ...]

    def __str__(self) -> str:
        return "".join(p if isinstance(p, str) else "${" + str(p) + "}" for p in self.parts)


@dataclass(frozen=True, kw_only=True)
class Secret:
    """``secret("name", "key")``: a Kubernetes Secret key, never an inline value."""

    described_as: ClassVar[str] = 'a `secret("name", "key")` call'

    name: str
    key: str


@dataclass(frozen=True, kw_only=True)
class ConfigMapKey(Secret):
    """``config_map("name", "key")``: a ConfigMap key.  A kind of :class:`Secret` reference, so
    every place that keeps a key reference out of the pod's literal env treats both alike."""

    described_as: ClassVar[str] = 'a `config_map("name", "key")` call'


#: A command argument or string value that may refer to params and outputs.
Text = Union[str, Ref, Interp]
#: An environment value: text, a secret or a ConfigMap key.
EnvValue = Union[str, Ref, Interp, ConfigMapKey, Secret]


def simplify_text(parts: list[str | Ref]) -> Text:
    """Canonical form of interpolated text: merged literals; one bare ref stays a ``Ref``."""
    merged: list[str | Ref] = []
    for part in parts:
        if isinstance(part, str) and merged and isinstance(merged[-1], str):
            merged[-1] = merged[-1] + part
        elif part != "":
            merged.append(part)
    if not merged:
        return ""
    if len(merged) == 1:
        return merged[0]
    return Interp(parts=tuple(merged))


# -- params -----------------------------------------------------------------------------------

ParamType = Literal["str", "int", "float", "bool"]
ParamValue = Union[bool, int, float, str]


@dataclass(frozen=True, kw_only=True)
class Param:
    """A typed pipeline parameter, overridable at submit time."""

    name: str
    type: ParamType
    default: ParamValue | None = None
    description: str | None = None


# -- stage settings ---------------------------------------------------------------------------

#: GPUs for one pod, so on one node: the largest nodes have 8 or 16 (more with time-slicing);
#: the bound catches a typo before the cluster does.
GpuCount = Annotated[int, Bounds(ge=1, le=1024)]


@dataclass(frozen=True, kw_only=True)
class GpuChoice:
    """One GPU type in the fallback order, with the count to request on it."""

    type: str
    count: GpuCount


@dataclass(frozen=True, kw_only=True)
class Gpu:
    """GPU request: a count and an ordered list of acceptable types."""

    #: GPUs per pod, for every type that does not give its own count.
    count: GpuCount = 1
    #: In order of preference.  Entries may override the count (``"A100:16"``).
    types: tuple[GpuChoice, ...] = ()
    #: Longest time to wait for capacity of one type before falling back to the next.
    fallback_after: Seconds | None = None


@dataclass(frozen=True, kw_only=True)
class Resources:
    #: CPU request and limit, in cores.
    cpu: MilliCpu | None = None
    #: Memory request and limit (the first rung when `retry.on_oom` is set).
    memory: Bytes | None = None
    #: Local disk for the pod.
    ephemeral_storage: Bytes | None = None
    #: Size of `/dev/shm` (PyTorch data loaders need more than the default).
    shm: Bytes | None = None
    gpu: Gpu | None = None


@dataclass(frozen=True, kw_only=True)
class OnOom:
    """The OOM memory ladder: each out-of-memory kill moves to the next, larger size."""

    #: Memory sizes, smallest first: each OOM kill retries on the next.
    memory: Annotated[tuple[Bytes, ...], MinItems(1)]


@dataclass(frozen=True, kw_only=True)
class Retry:
    """Separate retry budgets: application failures, preemptions and the OOM ladder."""

    #: Retries after an application failure (non-zero exit that is not OOM or preemption).
    attempts: Annotated[int, Bounds(ge=0, le=100)] = 0
    #: Retries after a preemption (spot reclaim, node shutdown, eviction, pod deletion).
    preemptions: Annotated[int, Bounds(ge=0, le=100)] = 3
    #: Wait before the first application retry; each later wait is `backoff_factor` times
    #: longer (a preemption retries at once, an OOM climbs at once).
    backoff: Seconds | None = None
    #: Growth of the wait between retries.
    backoff_factor: Annotated[int, Bounds(ge=1, le=10)] = 2
    #: Longest wait between retries (10m, or `backoff` if larger, when unset).
    max_backoff: Seconds | None = None
    on_oom: OnOom | None = None
    #: CUDA out-of-memory: "fail" at once, or "retry" spending the application budget.
    gpu_oom: Literal["fail", "retry"] = "fail"


@dataclass(frozen=True, kw_only=True)
class Cache:
    """Result caching.  Off unless a ``cache`` block (or ``cache = true``) is present."""

    #: Salt: bump it to invalidate every cached result of the stage.
    version: str = ""
    #: Results older than this are recomputed.
    max_age: Seconds | None = None


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """Intra-task checkpointing through the runtime's store (``checkpoint = true`` or a block)."""

    #: Directory the training code saves checkpoints in; restored before each attempt.
    path: str = "/var/run/durapipe/checkpoint"
    #: Committed checkpoints kept in storage.
    keep: Annotated[int, Bounds(ge=1, le=1000)] = 3
    #: Which runs share the line. "inputs": every run whose stage has the same inputs (its
    #: cache key: params, upstream content hashes, image, command, env, cache version), so a
    #: resubmitted run resumes; "run": this run only; "pipeline": every run of the pipeline.
    scope: Literal["inputs", "run", "pipeline"] = "inputs"


@dataclass(frozen=True, kw_only=True)
class Distributed:
    """Multi-node training: ``replicas`` nodes x ``procs_per_node`` processes."""

    #: Nodes (pods) of the job.
    replicas: Annotated[int, Bounds(ge=1, le=10000)]
    #: Processes per node (usually one per GPU).
    procs_per_node: Annotated[int, Bounds(ge=1, le=64)] = 1
    #: How the processes are started.
    launcher: Literal["torchrun"] = "torchrun"
    #: Restarts of the whole job after a worker failure.
    max_restarts: Annotated[int, Bounds(ge=0, le=1000)] = 0
    #: Restarts caused by host maintenance or preemption do not spend ``max_restarts``.
    restart_on_maintenance: bool = True


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Ceilings on the worst case that `durapipe bound` computes: `check` and `compile` refuse
    a pipeline (or stage) whose worst case exceeds one."""

    #: Longest worst-case wall time (the pipeline's along its critical path).
    max_wall: Seconds | None = None
    #: Most worst-case GPU-hours, over every GPU type.
    max_gpu_hours: Annotated[float, Bounds(ge=0, le=10**12)] | None = None
    #: Highest worst-case cost, in US dollars, at the price table's prices.
    max_cost: Annotated[float, Bounds(ge=0, le=10**12)] | None = None


#: US dollars per hour: a price the bound multiplies by hours.
UsdPerHour = Annotated[float, Bounds(ge=0, le=10**6)]


@dataclass(frozen=True, kw_only=True)
class PriceTable:
    """The pipeline's own prices for `durapipe bound` and its `limits.max_cost`: each one
    replaces the catalog's default (a `--prices FILE` replaces these in turn)."""

    #: GPU type name to US dollars per GPU-hour.
    gpu: dict[str, UsdPerHour] = field(default_factory=dict)
    #: US dollars per vCPU-hour.
    cpu_hour: UsdPerHour | None = None
    #: US dollars per GiB-hour of memory.
    memory_gib_hour: UsdPerHour | None = None


@dataclass(frozen=True, kw_only=True)
class Volume:
    """A volume mounted into the main container: exactly one of ``claim``, ``secret`` and
    ``config_map`` names its source."""

    #: A PersistentVolumeClaim, by name.
    claim: str | None = None
    #: A Secret, by name (mounted read-only: one file per key).
    secret: str | None = None
    #: A ConfigMap, by name (mounted read-only: one file per key).
    config_map: str | None = None
    #: Absolute path in the main container.
    path: str
    #: Mount read-only (always so for a Secret or ConfigMap).
    read_only: bool = False


@dataclass(frozen=True, kw_only=True)
class Affinity:
    """Node affinity on node labels: each key lists the values a node may carry."""

    #: Nodes must carry one of the values of every key.
    required: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: Nodes carrying one of the values are preferred.
    preferred: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Stage:
    name: str
    #: Container image the stage runs in.
    image: str
    #: The command and its arguments; may use `params.x` and `stage.outputs.y`.
    command: tuple[Text, ...] | None = None
    #: A script run by the image's shell, instead of `command` (a heredoc).
    script: str | None = None
    #: Arguments appended to `command`.
    args: tuple[Text, ...] = ()
    #: Environment variables: text, references or `secret("name", "key")`.
    env: dict[str, EnvValue] = field(default_factory=dict)
    #: Working directory of the command.
    workdir: str | None = None
    #: Named inputs: references to upstream outputs, mounted as files.
    inputs: dict[str, Ref] = field(default_factory=dict)
    #: Named outputs: paths the stage writes, passed to the stages that read them.
    outputs: dict[str, str] = field(default_factory=dict)
    #: Stages that must finish first, without passing data (bare stage names).
    needs: tuple[str, ...] = ()
    resources: Resources = Resources()
    #: May run on spot/preemptible capacity; preemptions spend `retry.preemptions`.
    interruptible: bool = False
    #: Run the last attempt on on-demand capacity (only with ``interruptible``).
    last_attempt_on_demand: bool = False
    retry: Retry = Retry()
    cache: Cache | None = None
    checkpoint: Checkpoint | None = None
    #: Longest runtime of one attempt.
    timeout: Seconds | None = None
    distributed: Distributed | None = None
    #: Ceilings on this stage's worst case (``durapipe bound``).
    limits: Limits | None = None
    #: Kubernetes labels on the stage's pods.
    labels: dict[str, str] = field(default_factory=dict)
    #: Kubernetes annotations on the stage's pods.
    annotations: dict[str, str] = field(default_factory=dict)
    #: Service account the stage's pods run as, instead of the pipeline's.
    service_account: str | None = None
    #: Volumes by name (a DNS-1123 label), mounted into the main container.
    volumes: dict[str, Volume] = field(default_factory=dict)
    #: Node labels the stage's nodes must carry, besides the GPU and spot ones.
    node_selector: dict[str, str] = field(default_factory=dict)
    #: Taints the pods tolerate: `"key"`, `"key:Effect"`, `"key=value"` or `"key=value:Effect"`.
    tolerations: tuple[str, ...] = ()
    affinity: Affinity | None = None
    #: PriorityClass of the stage's pods.
    priority_class: str | None = None
    #: Kueue LocalQueue the stage's pods (a multi-node stage: its JobSet) are admitted through;
    #: without it, the pipeline's ``queue``.
    queue: str | None = None
    #: A strategic-merge patch of the pod spec, as JSON, checked against the Pod schema.
    pod_patch: str | None = None

    def references(self) -> list[Ref]:
        """Every reference the stage makes, in a stable order."""
        found: list[Ref] = []

        def visit(value: object) -> None:
            if isinstance(value, Ref):
                found.append(value)
            elif isinstance(value, Interp):
                found.extend(p for p in value.parts if isinstance(p, Ref))

        for item in (*(self.command or ()), *self.args, *self.env.values(), *self.inputs.values()):
            visit(item)
        return found

    def upstream(self) -> tuple[str, ...]:
        """Stages this one depends on: data edges first, then ``needs``, without repeats."""
        names: list[str] = []
        for ref in self.references():
            if ref.stage is not None and ref.stage not in names:
                names.append(ref.stage)
        for name in self.needs:
            if name not in names:
                names.append(name)
        return tuple(names)


OutputKind = Literal["workflow", "template", "cron"]
Profile = Literal["generic", "gke", "eks", "karpenter", "aks"]


@dataclass(frozen=True, kw_only=True)
class CheckpointGc:
    """A CronWorkflow that collects the pipeline's checkpoint lines no run needs any more
    (``durapipe checkpoints gc`` on a schedule; docs/runtime.md, "Collecting lines")."""

    #: When the collector runs (a cron schedule, in the pipeline's ``timezone``).
    schedule: str = "0 3 * * *"
    #: Lines whose newest commit is older than this are removed (at least a minute).
    max_age: Annotated[int, Convert(units.parse_seconds), Bounds(ge=60)] = 14 * 86400
    #: The image the collector runs in (Python >= 3.10, like every stage's); without it, the
    #: first checkpointing stage's.
    image: str | None = None


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """How this cluster labels spot capacity and GPU types; presets come from ``profile``."""

    #: The kind of cluster: how it labels GPU types and spot capacity.
    profile: Profile = "generic"
    #: The extended resource name for GPUs.
    gpu_resource: str = "nvidia.com/gpu"
    #: Node label that carries the GPU type; defaults to the profile's.
    gpu_label: str | None = None
    #: GPU type -> label value, overriding or extending the profile's catalogue.
    gpu_products: dict[str, str] = field(default_factory=dict)
    #: Node labels that select spot capacity, overriding the profile's.
    spot_selector: dict[str, str] = field(default_factory=dict)
    #: Node labels that select on-demand capacity, overriding the profile's.
    on_demand_selector: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Pipeline:
    name: str
    #: Kubernetes namespace the workflow is submitted to (the cluster's default without it).
    namespace: str | None = None
    #: Root URI for checkpoints and cache data (``s3://bucket/prefix``, ``file:///...``).
    storage: str | None = None
    #: Secret holding store credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY style keys).
    storage_secret: str | None = None
    #: Service account every pod of the workflow runs as.
    service_account: str | None = None
    #: Kueue LocalQueue of every stage that names none (``kueue.x-k8s.io/queue-name``).
    queue: str | None = None
    #: Secrets with registry credentials for pulling the stages' images.
    image_pull_secrets: tuple[str, ...] = ()
    #: Cron schedules (`schedule = "0 3 * * *"` or a list); with `kind = "cron"` a CronWorkflow.
    schedules: tuple[str, ...] = ()
    #: IANA time zone of the schedules (`Europe/Berlin`); UTC without it.
    timezone: str | None = None
    #: What to compile to: a Workflow, a WorkflowTemplate or a CronWorkflow; without it a
    #: CronWorkflow when `schedule` is set, else a Workflow.
    kind: OutputKind | None = None
    #: Kubernetes labels on the compiled object and its pods.
    labels: dict[str, str] = field(default_factory=dict)
    #: Kubernetes annotations on the compiled object.
    annotations: dict[str, str] = field(default_factory=dict)
    cluster: Cluster = Cluster()
    params: tuple[Param, ...] = ()
    #: Ceilings on the pipeline's worst case (``durapipe bound``).
    limits: Limits | None = None
    #: Prices the worst case's cost is reckoned at, over the catalog's defaults.
    prices: PriceTable | None = None
    #: A scheduled collection of the pipeline's old checkpoint lines.
    checkpoint_gc: CheckpointGc | None = None
    stages: tuple[Stage, ...] = ()

    @property
    def output_kind(self) -> OutputKind:
        """The kind asked for, or the one the settings imply."""
        if self.kind is not None:
            return self.kind
        return "cron" if self.schedules else "workflow"

    def queue_of(self, stage: Stage) -> str | None:
        """The Kueue LocalQueue ``stage``'s pods go through (its own, else the pipeline's)."""
        return stage.queue if stage.queue is not None else self.queue

    def stage(self, name: str) -> Stage:
        """The stage called ``name`` (``KeyError`` if none), by index: the compiler looks up
        every reference, so a scan would make compiling quadratic."""
        return self._stage_index[name]

    @property
    def stage_names(self) -> Mapping[str, Stage]:
        """Stages by name (the first of equally named ones)."""
        return self._stage_index

    @cached_property
    def _stage_index(self) -> dict[str, Stage]:
        # The first of equally named stages wins, as a scan would find it (the validator
        # reports the duplicate).  cached_property writes the instance dict directly, so it
        # works on a frozen dataclass and stays out of equality.
        index: dict[str, Stage] = {}
        for stage in self.stages:
            index.setdefault(stage.name, stage)
        return index

    def param(self, name: str) -> Param:
        for param in self.params:
            if param.name == name:
                return param
        raise KeyError(name)
