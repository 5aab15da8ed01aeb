"""The Python builder: the same pipelines as ``.pipe`` files, written in Python.

Blocks map to classes (``resources { gpu { ... } }`` -> ``Resources(gpu=Gpu(...))``), attributes
to keyword arguments, labelled blocks to a first positional argument.  Strings follow the
``.pipe`` rules, including ``${params.lr}`` interpolation (``f"--lr={lr}"`` produces it, since a
param handle prints as ``${params.lr}``).  The builder produces plain data and hands it to the
same conversion and checks as the text front end, so twin files build equal models; mistakes
raise one :class:`PipelineError` whose diagnostics point at the caller's lines.

    from durapipe.dsl.builder import Pipeline, Resources

    p = Pipeline("demo", storage="s3://bucket/demo")
    epochs = p.param("epochs", int, default=3)
    p.stage("train", image="python:3.12", command=["python", "train.py", f"--epochs={epochs}"],
            resources=Resources(cpu=4, memory="16Gi"))
    pipeline = p
"""

from __future__ import annotations

import importlib.util
import json
import linecache
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from durapipe.dsl import diagnostics as dg
from durapipe.dsl import tree_to_data as td
from durapipe.dsl.result import LoadResult, finish
from durapipe.dsl.model import Pipeline as PipelineModel
from durapipe.dsl.model import ConfigMapKey, Ref, Secret, simplify_text
from durapipe.dsl.source import KEY, Source, SourceMap, Span

__all__ = [
    "Affinity", "Cache", "Checkpoint", "CheckpointGc", "Cluster", "Distributed", "Gpu", "Limits",
    "OnOom",
    "Pipeline", "Prices", "Resources", "Retry", "Volume", "config_map", "secret",
]

_INTERP_RE = re.compile(r"\$\$\{|\$\{([^}]*)\}")
_REF_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*")
_THIS_FILE = os.path.abspath(__file__)


class _CallSite:
    """Where in the user's Python file a builder call was made."""

    _sources: dict[str, Source] = {}

    def __init__(self) -> None:
        frame = sys._getframe(1)
        while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename) == _THIS_FILE:
            frame = frame.f_back
        self.path = frame.f_code.co_filename
        self.line = frame.f_lineno

    def span(self) -> Span | None:
        source = self._sources.get(self.path)
        if source is None:
            lines = linecache.getlines(self.path)
            if not lines:
                return None
            source = Source(_display_path(self.path), "".join(lines))
            self._sources[self.path] = source
        return _line_span(source, self.line)


def _line_span(source: Source, line: int) -> Span | None:
    """The span of a whole line, without its indentation: where a builder mistake is shown."""
    if line > source.line_count:
        return None
    text = source.line_text(line)
    start = source.line_offset(line)
    indent = len(text) - len(text.lstrip())
    return Span(source, start + indent, start + len(text.rstrip()))


def _display_path(path: str) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return path


class ParamHandle:
    """A declared param; use it as a value, or inside an f-string."""

    def __init__(self, name: str):
        self.name = name
        self.ref = Ref(path=("params", name))

    def __str__(self) -> str:
        return "${params." + self.name + "}"


class OutputHandle:
    def __init__(self, stage: str, name: str):
        self.ref = Ref(path=(stage, "outputs", name))

    def __str__(self) -> str:
        return "${" + ".".join(self.ref.path) + "}"


class _Outputs:
    def __init__(self, stage: str):
        self._stage = stage

    def __getattr__(self, name: str) -> OutputHandle:
        if name.startswith("__"):
            raise AttributeError(name)
        return OutputHandle(self._stage, name)


class StageHandle:
    """What ``Pipeline.stage`` returns: usable in ``needs`` and for ``.outputs.NAME``."""

    def __init__(self, name: str):
        self.name = name
        self.outputs = _Outputs(name)


def secret(name: str, key: str) -> Secret:
    """``secret("name", "key")`` as in ``.pipe``: an env value read from a Kubernetes Secret."""
    return Secret(name=name, key=key)


def config_map(name: str, key: str) -> ConfigMapKey:
    """``config_map("name", "key")`` as in ``.pipe``: an env value read from a ConfigMap."""
    return ConfigMapKey(name=name, key=key)


class _Section:
    """A nested block; subclasses name the ``.pipe`` block and its vocabulary."""

    block: str = ""
    schema: Mapping[str, td.Kind] = {}

    def __init__(self, **attributes: Any):
        self.attributes = attributes
        self.site = _CallSite()


class Resources(_Section):
    block = "resources"
    schema = td.RESOURCES.schema


class Gpu(_Section):
    block = "gpu"
    schema = _sub = td.RESOURCES.schema["gpu"].schema  # type: ignore[union-attr]


class Retry(_Section):
    block = "retry"
    schema = td.RETRY.schema


class OnOom(_Section):
    block = "on_oom"
    schema = td.RETRY.schema["on_oom"].schema  # type: ignore[union-attr]


class Cache(_Section):
    block = "cache"
    schema = td.STAGE_SCHEMA["cache"].schema  # type: ignore[union-attr]


class Checkpoint(_Section):
    block = "checkpoint"
    schema = td.STAGE_SCHEMA["checkpoint"].schema  # type: ignore[union-attr]


class Distributed(_Section):
    block = "distributed"
    schema = td.STAGE_SCHEMA["distributed"].schema  # type: ignore[union-attr]


class Volume(_Section):
    block = "volumes"
    schema = td.STAGE_SCHEMA["volumes"].schema  # type: ignore[union-attr]


class Affinity(_Section):
    block = "affinity"
    schema = td.STAGE_SCHEMA["affinity"].schema  # type: ignore[union-attr]


class Limits(_Section):
    """``limits { ... }`` of a stage or the pipeline."""

    block = "limits"
    schema = td.LIMITS.schema


class Prices(_Section):
    """``prices { ... }`` of the pipeline: its own prices for the bound."""

    block = "prices"
    schema = td.PIPELINE_SCHEMA["prices"].schema  # type: ignore[union-attr]


class Cluster(_Section):
    block = "cluster"
    schema = td.PIPELINE_SCHEMA["cluster"].schema  # type: ignore[union-attr]


class CheckpointGc(_Section):
    """``checkpoint_gc { ... }`` of the pipeline."""

    block = "checkpoint_gc"
    schema = td.PIPELINE_SCHEMA["checkpoint_gc"].schema  # type: ignore[union-attr]


_PARAM_TYPES: dict[object, str] = {str: "str", int: "int", float: "float", bool: "bool",
                                   "str": "str", "int": "int", "float": "float", "bool": "bool"}


class Pipeline:
    """Build a pipeline in Python; ``build()`` validates it like a ``.pipe`` file."""

    def __init__(self, name: str, **attributes: Any):
        self._site = _CallSite()
        self._name = name
        self._attributes = attributes
        self._params: list[tuple[dict[str, Any], _CallSite]] = []
        self._defaults: tuple[dict[str, Any], _CallSite] | None = None
        self._stages: list[tuple[str, dict[str, Any], _CallSite]] = []

    def param(self, name: str, type: object, default: Any = None) -> ParamHandle:
        entry: dict[str, Any] = {"name": name, "type": _PARAM_TYPES.get(type, str(type))}
        if default is not None:
            entry["default"] = default
        self._params.append((entry, _CallSite()))
        return ParamHandle(name)

    def defaults(self, **attributes: Any) -> None:
        self._defaults = (attributes, _CallSite())

    def stage(self, name: str, **attributes: Any) -> StageHandle:
        self._stages.append((name, attributes, _CallSite()))
        return StageHandle(name)

    # -- building -------------------------------------------------------------------------

    def result(self) -> LoadResult:
        """The model and diagnostics, exactly as ``load_path`` reports them."""
        conv = _Converter()
        fallback = self._site.span()
        data: dict[str, Any] = {"name": self._name}
        conv.map_site(("name",), self._site)
        conv.map_site((), self._site)
        data.update(conv.section(self._attributes, td.PIPELINE_SCHEMA, (), self._site,
                                 "pipeline"))
        data["params"] = []
        for i, (entry, site) in enumerate(self._params):
            conv.map_site(("params", i), site)
            data["params"].append(entry)
        defaults: dict[str, Any] = {}
        defaults_map: SourceMap = {}
        if self._defaults is not None:
            sub = _Converter(conv.diagnostics)
            defaults = sub.section(self._defaults[0], td.STAGE_SCHEMA, (), self._defaults[1],
                                   "defaults", forbidden=td.NOT_IN_DEFAULTS)
            defaults_map = sub.source_map
        stages = []
        for i, (name, attributes, site) in enumerate(self._stages):
            loc = ("stages", i)
            conv.map_site(loc, site)
            own = conv.section(attributes, td.STAGE_SCHEMA, loc, site, f'stage "{name}"')
            for key, span in defaults_map.items():
                conv.source_map.setdefault((*loc, *key), span)
            merged = td.merge_defaults(defaults, own)
            merged["name"] = name
            stages.append(td.finish_stage(merged))
        data["stages"] = stages
        return finish(data, conv.source_map, fallback, conv.diagnostics)

    def build(self) -> PipelineModel:
        """The validated model; raises :class:`PipelineError` carrying every diagnostic."""
        result = self.result()
        if result.pipeline is None:
            raise dg.PipelineError(result.diagnostics)
        return result.pipeline


class _Converter:
    def __init__(self, diagnostics: list[dg.Diagnostic] | None = None):
        self.source_map: SourceMap = {}
        self.diagnostics = diagnostics if diagnostics is not None else []

    def map_site(self, loc: tuple[Any, ...], site: _CallSite) -> None:
        span = site.span()
        if span is not None:
            self.source_map[loc] = span

    def section(self, attributes: Mapping[str, Any], schema: Mapping[str, td.Kind],
                loc: tuple[Any, ...], site: _CallSite, where: str,
                forbidden: tuple[str, ...] = ()) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in attributes.items():
            name = str(key)  # a dict given for a block may have any keys
            kind = schema.get(name)
            if kind is None or name in forbidden:
                if name in forbidden:
                    diag = dg.error("P0209", f"`{name}` cannot be set in `defaults`",
                                    site.span(), "per-stage only",
                                    help=f"move `{name}` into the stages that need it")
                else:
                    choices = [k for k in schema if k not in forbidden]
                    diag = dg.error(
                        "P0201", f"unknown attribute `{name}` in {where}", site.span(),
                        "unknown keyword argument",
                        help=dg.did_you_mean(name, choices)
                        or f"allowed here: {', '.join(sorted(choices))}",
                        about=dg.Subject("attribute", name),
                        suggestion=dg.closest(name, choices))
                self.diagnostics.append(diag)
                continue
            target = kind.target or (name,)
            sub_loc = (*loc, *target)
            self.map_site(sub_loc, site)
            self.map_site((*sub_loc, KEY), site)
            converted = self.member(name, value, kind, sub_loc, site)
            node: dict[str, Any] = out
            for key in target[:-1]:
                node = node.setdefault(key, {})
            node[target[-1]] = converted
        return out

    def member(self, name: str, value: Any, kind: td.Kind,
               loc: tuple[Any, ...], site: _CallSite) -> Any:
        if isinstance(kind, td.BlockSchema):
            if kind.flag and isinstance(value, bool):
                return {} if value else None
            if isinstance(value, _Section):
                if value.schema != kind.schema:
                    self.diagnostics.append(dg.error(
                        "P0203", f"`{name}` takes a {type(value).__name__} where a "
                        f"`{name}` block is expected", value.site.span(), "wrong block"))
                    return None
                self.map_site(loc, value.site)
                return self.section(value.attributes, kind.schema, loc, value.site,
                                    f"`{value.block}`")
            if isinstance(value, Mapping):
                return self.section(value, kind.schema, loc, site, f"`{name}`")
            return self.plain(value, loc)
        if isinstance(kind, td.Map):
            if isinstance(value, Mapping):
                return {str(k): self.plain(v, (*loc, str(k))) for k, v in value.items()}
            return self.plain(value, loc)
        if isinstance(kind, td.Blocks):
            if not isinstance(value, Mapping):
                return self.plain(value, loc)
            return {str(k): self.member(str(k), v, td.BlockSchema(kind.schema),
                                        (*loc, str(k)), site) for k, v in value.items()}
        if name == "pod_patch" and isinstance(value, Mapping):
            try:  # the text front end's JSON; finish_stage canonicalises it
                return json.dumps(value, allow_nan=False)
            except (TypeError, ValueError, RecursionError):
                return self.plain(value, loc)  # not JSON: typecheck reports the type
        if name == "script" and isinstance(value, str):
            return value  # verbatim, like a heredoc: shell `${VAR}` must survive
        plain = self.plain(value, loc)
        if kind.convert is td._needs:
            return [n.name if isinstance(n, StageHandle) else
                    n.path[0] if isinstance(n, Ref) and len(n.path) == 1 else n
                    for n in (value if isinstance(value, (list, tuple)) else [value])]
        if kind.convert is td._gpu_types and isinstance(plain, list):
            return [{"type": t.partition(":")[0].strip(),
                     "count": int(t.partition(":")[2]) if t.partition(":")[2].isdigit() else None}
                    if isinstance(t, str) else t for t in plain]
        if kind.convert is td._schedules:
            return plain if isinstance(plain, list) else [plain]
        return plain

    def plain(self, value: Any, loc: tuple[Any, ...]) -> Any:
        if isinstance(value, (ParamHandle, OutputHandle)):
            return value.ref
        if isinstance(value, StageHandle):
            return Ref(path=(value.name,))
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, (list, tuple)):
            return [self.plain(v, (*loc, i)) for i, v in enumerate(value)]
        if isinstance(value, Mapping):
            return {str(k): self.plain(v, (*loc, str(k))) for k, v in value.items()}
        return value

    def text(self, value: str) -> Any:
        """Split ``${ref}`` interpolations exactly as the ``.pipe`` front end does."""
        parts: list[str | Ref] = []
        pos = 0
        for match in _INTERP_RE.finditer(value):
            parts.append(value[pos:match.start()])
            if match.group(0) == "$${":
                parts.append("${")
            else:
                body = match.group(1).strip()
                if _REF_RE.fullmatch(body):
                    parts.append(Ref(path=tuple(body.split("."))))
                else:
                    parts.append(match.group(0))
            pos = match.end()
        parts.append(value[pos:])
        return simplify_text(parts)


def load_module(path: str | os.PathLike[str]) -> LoadResult:
    """Import a builder module and build its module-level ``pipeline``."""
    shown = _display_path(str(path))
    if not Path(path).is_file():
        return LoadResult(None, [dg.Diagnostic("P0001", f"cannot read {shown}: no such file",
                                               location=shown)])
    module_name = "_durapipe_builder_" + re.sub(r"\W", "_", Path(path).stem)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        return LoadResult(None, [dg.Diagnostic("P0004", f"cannot import {shown}",
                                               location=shown)])
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except dg.PipelineError as exc:
        return LoadResult(None, exc.diagnostics)
    except Exception as exc:  # the user's module is arbitrary code: report, never crash
        tb = exc.__traceback__
        line = None
        while tb is not None:
            if os.path.abspath(tb.tb_frame.f_code.co_filename) == os.path.abspath(str(path)):
                line = tb.tb_lineno
            tb = tb.tb_next
        try:
            module_source: Source | None = Source(shown, Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            module_source = None
        span = _line_span(module_source, line) if line and module_source else None
        return LoadResult(None, [dg.error(
            "P0004", f"{shown} raised {type(exc).__name__}: {exc}", span, "raised here",
            help="fix the module so that it runs; `python FILE` shows the traceback")
            if span is not None else dg.Diagnostic(
            "P0004", f"{shown} raised {type(exc).__name__}: {exc}", location=shown)])
    pipeline = getattr(module, "pipeline", None)
    if isinstance(pipeline, PipelineModel):
        return LoadResult(pipeline, [])
    if not isinstance(pipeline, Pipeline):
        return LoadResult(None, [dg.Diagnostic(
            "P0004", f"{shown} has no module-level `pipeline` built with "
            "durapipe.dsl.builder.Pipeline", location=shown,
            help="end the module with `pipeline = p`")])
    return pipeline.result()
