"""Syntax tree -> plain data for the model, plus a source map; defaults are merged here.

The block vocabulary is closed and written out below as tables, one per block, so that an
unknown name gets a did-you-mean against exactly the names allowed at that place.  Values are
converted to Python but their types are checked against the model by ``typecheck``, whose
problem locations are mapped back to spans through the source map.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from durapipe.dsl import syntax as st
from durapipe.dsl.diagnostics import Diagnostic, Label, Subject, closest, did_you_mean, error
from durapipe.dsl.model import ConfigMapKey, Ref, Secret, simplify_text
from durapipe.dsl.source import KEY, SourceMap, Span
from durapipe.dsl.typecheck import Loc


@dataclass(frozen=True)
class Attr:
    """An attribute; ``convert`` adapts the plain value before the model sees it."""

    convert: Callable[[Any, st.Value, TreeData, Loc], Any] | None = None
    #: The field name in the model, when it differs from the attribute name.
    target: tuple[str, ...] | None = None


@dataclass(frozen=True)
class BlockSchema:
    """A nested block with its own vocabulary; ``flag`` also accepts ``name = true|false``."""

    schema: dict[str, Kind]
    flag: bool = False
    target: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Map:
    """A block whose members are free-form ``key = value`` pairs (env, labels, outputs)."""

    target: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Blocks:
    """A block whose members are blocks named freely, each with ``schema`` (volumes)."""

    schema: dict[str, Kind]
    target: tuple[str, ...] | None = None


Kind = Attr | BlockSchema | Map | Blocks


def _needs(value: Any, node: st.Value, result: TreeData, loc: Loc) -> Any:
    if not isinstance(node, st.ListValue):
        return value
    names = []
    for item, item_node in zip(value, node.items):
        if isinstance(item, Ref) and len(item.path) == 1:
            names.append(item.path[0])
        else:
            text = item if isinstance(item, str) else None
            result.diagnostics.append(error(
                "P0203", "`needs` lists stage names, written bare", item_node.span,
                "not a bare stage name",
                help=f"write `{text}` without quotes" if text else "write `needs = [prep]`"))
    return names


def _gpu_types(value: Any, node: st.Value, result: TreeData, loc: Loc) -> Any:
    if not isinstance(value, list):
        return value
    out: list[Any] = []
    for item, item_node in zip(value, node.items if isinstance(node, st.ListValue) else []):
        if isinstance(item, str):
            name, sep, count = item.partition(":")
            if sep and not count.isdigit():
                result.diagnostics.append(error(
                    "P0203", f"`{item}` is not `TYPE` or `TYPE:COUNT`", item_node.span,
                    "expected e.g. \"A100:16\""))
                continue
            out.append({"type": name.strip(), "count": int(count) if sep else None})
        else:
            out.append(item)
    return out


def _schedules(value: Any, node: st.Value, result: TreeData, loc: Loc) -> Any:
    """One string or a list of them (schedules, tolerations, image pull secrets)."""
    return value if isinstance(value, list) else [value]


RETRY = BlockSchema({
    "attempts": Attr(), "preemptions": Attr(), "backoff": Attr(), "backoff_factor": Attr(),
    "max_backoff": Attr(), "gpu_oom": Attr(),
    "on_oom": BlockSchema({"memory": Attr()}),
})
RESOURCES = BlockSchema({
    "cpu": Attr(), "memory": Attr(), "ephemeral_storage": Attr(), "shm": Attr(),
    "gpu": BlockSchema({"count": Attr(), "types": Attr(_gpu_types), "fallback_after": Attr()}),
})
LIMITS = BlockSchema({"max_wall": Attr(), "max_gpu_hours": Attr(), "max_cost": Attr()})
STAGE_SCHEMA: dict[str, Kind] = {
    "image": Attr(), "command": Attr(), "script": Attr(), "args": Attr(), "workdir": Attr(),
    "env": Map(), "inputs": Map(), "outputs": Map(), "needs": Attr(_needs),
    "resources": RESOURCES,
    "interruptible": Attr(), "last_attempt_on_demand": Attr(),
    "retry": RETRY,
    "cache": BlockSchema({"version": Attr(), "max_age": Attr()}, flag=True),
    "checkpoint": BlockSchema({"path": Attr(), "keep": Attr(), "scope": Attr()}, flag=True),
    "timeout": Attr(),
    "distributed": BlockSchema({"replicas": Attr(), "procs_per_node": Attr(), "launcher": Attr(),
                        "max_restarts": Attr(), "restart_on_maintenance": Attr()}),
    "labels": Map(), "annotations": Map(),
    "service_account": Attr(), "priority_class": Attr(), "queue": Attr(), "node_selector": Map(),
    "tolerations": Attr(_schedules),
    "affinity": BlockSchema({"required": Map(), "preferred": Map()}),
    "volumes": Blocks({"claim": Attr(), "secret": Attr(), "config_map": Attr(), "path": Attr(),
                       "read_only": Attr()}),
    "pod_patch": Attr(),
    "limits": LIMITS,
}
#: Per-stage graph structure cannot come from ``defaults``.
NOT_IN_DEFAULTS = ("needs", "inputs", "outputs")
PIPELINE_SCHEMA: dict[str, Kind] = {
    "namespace": Attr(), "storage": Attr(), "storage_secret": Attr(), "queue": Attr(),
    "service_account": Attr(), "schedule": Attr(_schedules, target=("schedules",)),
    "image_pull_secrets": Attr(_schedules),
    "timezone": Attr(), "kind": Attr(), "labels": Map(), "annotations": Map(),
    "profile": Attr(target=("cluster", "profile")),
    "cluster": BlockSchema({"gpu_resource": Attr(), "gpu_label": Attr(), "gpu_products": Map(),
                    "spot_selector": Map(), "on_demand_selector": Map()}),
    "limits": LIMITS,
    "prices": BlockSchema({"gpu": Map(), "cpu_hour": Attr(), "memory_gib_hour": Attr()}),
    "checkpoint_gc": BlockSchema({"schedule": Attr(), "max_age": Attr(), "image": Attr()}),
}


@dataclass
class TreeData:
    """The result: data for ``typecheck.build(Pipeline, ...)``, its source map, diagnostics."""

    data: dict[str, Any] = field(default_factory=dict)
    source_map: SourceMap = field(default_factory=dict)
    diagnostics: list[Diagnostic] = field(default_factory=list)

    # -- values ---------------------------------------------------------------------------

    def value(self, node: st.Value, loc: Loc) -> Any:
        self.source_map[loc] = node.span
        if isinstance(node, st.StrValue):
            if node.heredoc:
                return node.parts[0] if node.parts else ""
            parts: list[str | Ref] = [
                p if isinstance(p, str) else Ref(path=p.path) for p in node.parts
            ]
            for i, part in enumerate(node.parts):
                if isinstance(part, st.RefValue):
                    self.source_map[(*loc, "<ref>", i)] = part.span
            return simplify_text(parts)
        if isinstance(node, st.NumberValue):
            return node.value
        if isinstance(node, st.UnitValue):
            return node.raw
        if isinstance(node, st.BoolValue):
            return node.value
        if isinstance(node, st.RefValue):
            return Ref(path=node.path)
        if isinstance(node, st.ListValue):
            return [self.value(item, (*loc, i)) for i, item in enumerate(node.items)]
        if isinstance(node, st.CallValue):
            return self.call(node, loc)
        raise TypeError(node)  # pragma: no cover - Value is closed

    def call(self, node: st.CallValue, loc: Loc) -> Any:
        if node.name not in FUNCTIONS:
            self.diagnostics.append(error(
                "P0208", f"unknown function `{node.name}`", node.name_span, "not a function",
                help=did_you_mean(node.name, list(FUNCTIONS))
                or "the functions are `secret` and `config_map`"))
            return None
        args = [a for a in node.args]
        if len(args) != 2 or not all(isinstance(a, st.StrValue) and not a.heredoc
                                     and all(isinstance(p, str) for p in a.parts) for a in args):
            what = "Secret" if node.name == "secret" else "ConfigMap"
            self.diagnostics.append(error(
                "P0203", f"`{node.name}` takes two strings: the {what}'s name and the key",
                node.span, f"expected {node.name}(\"name\", \"key\")"))
            return None
        name, key = (a.text for a in args if isinstance(a, st.StrValue))
        return FUNCTIONS[node.name](name=name, key=key)

    # -- blocks ---------------------------------------------------------------------------

    def members(self, block: st.Block, schema: dict[str, Kind], loc: Loc,
                forbidden: tuple[str, ...] = ()) -> dict[str, Any]:
        out: dict[str, Any] = {}
        seen: dict[str, st.Attribute | st.Block] = {}
        for member in block.members:
            name = member.key if isinstance(member, st.Attribute) else member.name
            name_span = member.key_span if isinstance(member, st.Attribute) else member.name_span
            if name in seen:
                first = seen[name]
                first_span = first.key_span if isinstance(first, st.Attribute) else first.name_span
                self.diagnostics.append(error(
                    "P0109", f"`{name}` is set twice", name_span, "set again here",
                    extra=(Label(first_span, "first set here"),), help="keep one of them"))
                continue
            seen[name] = member
            kind = schema.get(name)
            if kind is None or name in forbidden:
                self._unknown(name, name_span, block, schema, forbidden)
                continue
            target = kind.target or (name,)
            sub_loc = (*loc, *target)
            self.source_map[(*sub_loc, KEY)] = name_span
            value = self.member(member, kind, sub_loc)
            if value is _INVALID:
                continue
            _set_path(out, target, value)
        return out

    def member(self, member: st.Attribute | st.Block, kind: Kind, loc: Loc) -> Any:
        name_span = member.key_span if isinstance(member, st.Attribute) else member.name_span
        if isinstance(kind, Attr):
            if isinstance(member, st.Block):
                self.diagnostics.append(error(
                    "P0203", f"`{member.name}` is an attribute, not a block", member.name_span,
                    "expected `=` and a value", help=f"write `{member.name} = ...`"))
                return _INVALID
            value = self.value(member.value, loc)
            return kind.convert(value, member.value, self, loc) if kind.convert else value
        if isinstance(member, st.Attribute):
            if isinstance(kind, BlockSchema) and kind.flag and isinstance(member.value, st.BoolValue):
                self.source_map[loc] = member.value.span
                return {} if member.value.value else None
            what = ("block" if isinstance(kind, BlockSchema) else "block of named blocks"
                    if isinstance(kind, Blocks) else "block of `key = value` pairs")
            self.diagnostics.append(error(
                "P0203", f"`{member.key}` is a {what}", member.value.span,
                "expected `{ ... }`",
                help=f"write `{member.key} {{ ... }}`"
                + (f" or `{member.key} = true`" if isinstance(kind, BlockSchema) and kind.flag else "")))
            return _INVALID
        self.source_map[loc] = name_span
        if isinstance(kind, BlockSchema):
            return self.members(member, kind.schema, loc)
        if isinstance(kind, Blocks):
            named: dict[str, Any] = {}
            for entry in member.members:
                if isinstance(entry, st.Attribute):
                    self.diagnostics.append(error(
                        "P0203", f"`{member.name}` holds named blocks", entry.key_span,
                        "not a block", help=f"write `{entry.key} {{ ... }}`"))
                    continue
                if entry.name in named:
                    self.diagnostics.append(error(
                        "P0109", f"`{entry.name}` is set twice in `{member.name}`",
                        entry.name_span, "set again here", help="keep one of them"))
                    continue
                self.source_map[(*loc, entry.name, KEY)] = entry.name_span
                self.source_map[(*loc, entry.name)] = entry.name_span
                named[entry.name] = self.members(entry, kind.schema, (*loc, entry.name))
            return named
        entries: dict[str, Any] = {}
        for entry in member.members:
            if isinstance(entry, st.Block):
                self.diagnostics.append(error(
                    "P0203", f"`{member.name}` holds `key = value` pairs, not blocks",
                    entry.name_span, "a nested block", help=f"write `{entry.name} = ...`"))
                continue
            if entry.key in entries:
                self.diagnostics.append(error(
                    "P0109", f"`{entry.key}` is set twice in `{member.name}`", entry.key_span,
                    "set again here", help="keep one of them"))
                continue
            self.source_map[(*loc, entry.key, KEY)] = entry.key_span
            entries[entry.key] = self.value(entry.value, (*loc, entry.key))
        return entries

    def _unknown(self, name: str, span: Span, block: st.Block,
                 schema: dict[str, Kind], forbidden: tuple[str, ...]) -> None:
        if name in forbidden:
            self.diagnostics.append(error(
                "P0209", f"`{name}` cannot be set in `defaults`", span, "per-stage only",
                help=f"move `{name}` into the stages that need it"))
            return
        where = f"`{block.name}`" + (f' "{block.label.text}"' if block.label else "")
        choices = [k for k in schema if k not in forbidden]
        self.diagnostics.append(error(
            "P0201", f"unknown attribute `{name}` in {where}", span, "unknown here",
            help=did_you_mean(name, choices) or f"allowed here: {', '.join(sorted(choices))}",
            about=Subject("attribute", name), suggestion=closest(name, choices)))


_INVALID = object()

#: The functions of the language: both name a key of a Kubernetes object, for env values.
FUNCTIONS: dict[str, type[Secret]] = {"secret": Secret, "config_map": ConfigMapKey}


def _set_path(target: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        target = target.setdefault(key, {})
    target[path[-1]] = value


def copy_containers(value: Any) -> Any:
    """A copy of the dicts and lists of converted data; the values inside are shared.

    Not ``copy.deepcopy``: the values are immutable or, from the builder, anything at all (a
    generator passed by mistake cannot be copied, and must still get its diagnostic)."""
    if isinstance(value, dict):
        return {k: copy_containers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy_containers(v) for v in value]
    return value


def merge_defaults(defaults: dict[str, Any], stage: dict[str, Any]) -> dict[str, Any]:
    """The one merge rule: blocks and maps merge key by key, recursively; any other value
    (scalar or list) set in the stage replaces the default."""
    merged: dict[str, Any] = copy_containers(defaults)
    for key, value in stage.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_defaults(merged[key], value)
        else:
            merged[key] = value
    return merged


def _fill_gpu_counts(stage: dict[str, Any]) -> None:
    gpu = stage.get("resources", {}).get("gpu") if isinstance(stage.get("resources"), dict) \
        else None
    if not isinstance(gpu, dict) or not isinstance(gpu.get("types"), list):
        return
    count = gpu.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        count = 1  # the invalid count itself is reported once, at `count`
    for choice in gpu["types"]:
        if isinstance(choice, dict) and choice.get("count") is None:
            choice["count"] = count


def _canonical_patch(stage: dict[str, Any]) -> None:
    """``pod_patch`` as compact, key-sorted JSON, so that a heredoc and a builder dict meaning
    the same patch build equal models; text that is not a JSON object is left for the checks."""
    text = stage.get("pod_patch")
    if not isinstance(text, str):
        return
    try:
        value = json.loads(text)
    except ValueError:
        return
    if isinstance(value, dict):
        stage["pod_patch"] = json.dumps(value, sort_keys=True, separators=(",", ":"))


def finish_stage(stage: dict[str, Any]) -> dict[str, Any]:
    """Normalisations shared by the text front end and the builder, after the merge."""
    _fill_gpu_counts(stage)
    _canonical_patch(stage)
    return stage


def tree_to_data(file: st.File) -> TreeData:
    low = TreeData()
    source = file.source
    pipelines = [i for i in file.items if isinstance(i, st.Block) and i.name == "pipeline"]
    params_blocks = [i for i in file.items if isinstance(i, st.ParamsBlock)]
    defaults_blocks = [i for i in file.items if isinstance(i, st.Block) and i.name == "defaults"]
    stages = [i for i in file.items if isinstance(i, st.Block) and i.name == "stage"]

    for extra in pipelines[1:] + defaults_blocks[1:]:
        low.diagnostics.append(error(
            "P0207", f"a file has one `{extra.name}` block", extra.name_span, "a second one",
            help="merge it into the first"))
    for extra_params in params_blocks[1:]:
        low.diagnostics.append(error(
            "P0207", "a file has one `params` block", extra_params.name_span, "a second one",
            help="merge it into the first"))

    data = low.data
    if not pipelines:
        low.diagnostics.append(error(
            "P0202", "missing the `pipeline \"name\" { }` block", Span(source, 0, 0),
            "expected a pipeline block", help='start the file with `pipeline "my-pipeline" { }`',
            about=Subject("block", "pipeline")))
        data["name"] = "unnamed"
    else:
        pipe = pipelines[0]
        data["name"] = pipe.label.text if pipe.label else ""
        if pipe.label:
            low.source_map[("name",)] = pipe.label.span
        low.source_map[()] = pipe.name_span
        data.update(low.members(pipe, PIPELINE_SCHEMA, ()))

    params: list[dict[str, Any]] = []
    for params_block in params_blocks[:1]:
        for i, decl in enumerate(params_block.params):
            loc: Loc = ("params", i)
            low.source_map[loc] = decl.name_span
            low.source_map[(*loc, "name")] = decl.name_span
            low.source_map[(*loc, "type")] = decl.type_span
            entry: dict[str, Any] = {"name": decl.name, "type": decl.type}
            if decl.default is not None:
                entry["default"] = low.value(decl.default, (*loc, "default"))
            params.append(entry)
    data["params"] = params

    defaults: dict[str, Any] = {}
    defaults_map: SourceMap = {}
    if defaults_blocks:
        sub = TreeData(diagnostics=low.diagnostics)
        defaults = sub.members(defaults_blocks[0], STAGE_SCHEMA, (), forbidden=NOT_IN_DEFAULTS)
        defaults_map = sub.source_map

    stage_data = []
    for i, block in enumerate(stages):
        loc = ("stages", i)
        low.source_map[loc] = block.label.span if block.label else block.name_span
        low.source_map[(*loc, "name")] = low.source_map[loc]
        own = low.members(block, STAGE_SCHEMA, loc)
        for key, span in defaults_map.items():
            low.source_map.setdefault((*loc, *key), span)
        merged = merge_defaults(defaults, own)
        merged["name"] = block.label.text if block.label else ""
        stage_data.append(finish_stage(merged))
    data["stages"] = stage_data
    return low
