"""Compile options and the result type shared by the library API and the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from durapipe.plan.grace import CHECKPOINT_GRACE_SECONDS

if TYPE_CHECKING:  # importing the front end here would make `durapipe --help` pay for it
    from durapipe.dsl.diagnostics import Diagnostic
    from durapipe.dsl.source import SourceMap

ArgoVersion = Literal["4.1", "3.7"]
ARGO_VERSIONS: tuple[ArgoVersion, ...] = ("4.1", "3.7")

#: Where the zipapp sits inside a runtime image (``Containerfile.runtime``), for teams that
#: choose image delivery (``runtime_image``) over the default ConfigMap.
RUNTIME_IMAGE_ZIPAPP = "/opt/durapipe/durapipe-runtime.pyz"


@dataclass(frozen=True)
class CompileOptions:
    """What the caller chooses; everything else comes from the pipeline."""

    #: Overrides ``pipeline.kind`` (``--kind``).  With a kustomized output, a Workflow gets a
    #: fixed name instead of ``generateName``: see ``fixed_names``.
    kind: Literal["workflow", "template", "cron"] | None = None
    argo_version: ArgoVersion = "4.1"
    #: A Workflow named ``metadata.name`` rather than ``generateName`` (kustomize and Argo
    #: CD cannot apply an object without a name).
    fixed_names: bool = False
    #: ``None`` (the default): the runtime zipapp ships in the output as a ConfigMap and runs
    #: in the stage's own image.  An image name: an init container copies the zipapp out of
    #: that image (built from ``Containerfile.runtime``) and the upload agent runs in it.
    runtime_image: str | None = None
    #: The zipapp's bytes; ``None`` builds it from this installation.  Tests that snapshot the
    #: lowering pin it, so that an edit to the runtime does not rename every pod's volume.
    runtime_archive: bytes | None = None
    #: Seconds a checkpointing pod gets between SIGTERM and SIGKILL (final save + upload).
    checkpoint_grace_seconds: int = CHECKPOINT_GRACE_SECONDS
    #: Argo's per-object limits; lowered only by tests that exercise splitting.
    max_templates: int = 200
    max_tasks: int = 200
    #: The service account of pipelines that set none (`-o DIR/` names the one it emits).
    service_account: str | None = None
    #: Where the model came from, so diagnostics can point at source lines.
    source_map: SourceMap | None = None
    source_path: str | None = None


@dataclass
class CompileResult:
    documents: list[dict[str, Any]] = field(default_factory=list)
    #: Kubernetes objects the documents' pods need, kept apart from the Argo objects so that
    #: writers can place them once per namespace: the runtime's ConfigMap.
    runtime_objects: list[dict[str, Any]] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(d.is_error for d in self.diagnostics)
