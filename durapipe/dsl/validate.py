"""Plain data -> checked model: the model's type checks, then the language's own rules.

Type problems from ``typecheck`` are turned here into coded diagnostics placed through the
source map.  Semantic checks run on the model and collect every problem rather than stopping
at the first.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from durapipe.dsl import catalog, credentials, kube, schedule, typecheck
from durapipe.dsl.diagnostics import (
    Diagnostic,
    Label,
    Subject,
    closest,
    did_you_mean,
    error,
    warning,
)
from durapipe.dsl.tree_to_data import copy_containers
from durapipe.dsl.model import CheckpointGc, Interp, Pipeline, Ref, Stage
from durapipe.dsl.source import KEY, SourceMap, Span, lookup

STAGE_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,48}[a-z0-9])?$")
IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _describe_loc(loc: tuple[Any, ...]) -> str:
    names = [p for p in loc if isinstance(p, str) and p[:1].isalpha() and p[:1].islower()]
    return names[-1] if names else "value"


_PLACEHOLDERS = {"image": "<missing>", "name": "<missing>", "replicas": 1, "memory": ["1Mi"]}


def model_from_data(data: dict[str, Any], source_map: SourceMap,
                    fallback: Span | None) -> tuple[Pipeline | None, list[Diagnostic]]:
    """Check plain data and build the model, reporting every type problem.

    On problems, the model returned is a best-effort one built with the invalid values removed
    (defaults or placeholders in their place), so the semantic checks can still report the
    file's other mistakes in the same run; callers must not treat it as valid.
    """
    pipeline, problems = typecheck.build(Pipeline, data)
    if not problems:
        return pipeline, []
    diagnostics = translate_problems(problems, source_map, fallback)
    repaired = copy_containers(data)
    for _ in range(4):
        for problem in problems:
            _drop(repaired, problem.loc, problem.kind == "missing")
        pipeline, problems = typecheck.build(Pipeline, repaired)
        if not problems:
            return pipeline, diagnostics
    return None, diagnostics


def _drop(data: Any, loc: tuple[Any, ...], missing: bool) -> None:
    """Remove the value at ``loc`` (or the deepest existing prefix), or fill a placeholder."""
    node = data
    parents: list[tuple[Any, Any]] = []
    for part in loc:
        if isinstance(node, dict) and part in node:
            parents.append((node, part))
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            parents.append((node, part))
            node = node[part]
        else:
            break
    if missing:
        name = loc[-1]
        if isinstance(node, dict) and name in _PLACEHOLDERS:
            node[name] = _PLACEHOLDERS[name]
        return
    if parents:
        container, key = parents[-1]
        if isinstance(container, dict):
            del container[key]
        else:
            container.pop(key)


def translate_problems(problems: Iterable[typecheck.Problem], source_map: SourceMap,
                       fallback: Span | None) -> list[Diagnostic]:
    diagnostics: list[Diagnostic] = []
    seen: set[tuple[object, ...]] = set()
    for problem in problems:
        loc, kind = problem.loc, problem.kind
        field = _describe_loc(loc)
        if kind == "missing":
            span = lookup(source_map, loc[:-1]) or fallback
            what = f"`{field}`"
            hint = {"image": "set `image` in the stage or in `defaults`",
                    "replicas": "set `replicas` to the number of nodes"}.get(field)
            diag = error("P0202", f"missing required attribute {what}", span,
                         f"{what} is required here", help=hint or f"add `{field} = ...`",
                         about=Subject("attribute", field))
            key: tuple[object, ...] = (loc, "missing")
        else:
            span = lookup(source_map, loc) or fallback
            if isinstance(problem.value, (Ref, Interp)):
                code, message = "P0203", (f"`{field}` cannot hold a reference; only `command`, "
                                          "`args`, `env` and `inputs` refer to params and outputs")
            elif kind == "convert":
                code, message = "P0205", f"`{field}`: {problem.message}"
            elif kind == "range":
                code, message = "P0204", f"`{field}` {problem.message}"
            elif kind == "choice":
                code, message = "P0206", f"`{field}`: {problem.message}"
            else:
                code, message = "P0203", f"`{field}` has the wrong type: {problem.message}"
            hint = problem.help
            if kind == "choice" and isinstance(problem.value, str):
                hint = did_you_mean(problem.value, [c for c in problem.choices
                                                    if isinstance(c, str)])
            diag = error(code, message, span, "invalid value", help=hint)
            key = (span.sort_key() if span else loc, message)
        if key not in seen:
            seen.add(key)
            diagnostics.append(diag)
    return diagnostics


#: Earlier errors whose member is skipped whole (an unknown or misplaced name, a repeat): none
#: of it reaches the model, so no later error follows from it.  This matters for the builder,
#: whose spans are the caller's whole line: an unknown keyword must not hide a wrong type given
#: to another keyword of the same call.
_SKIPPED_WHOLE = {"P0109", "P0201", "P0207", "P0209"}


def drop_consequences(errors: list[Diagnostic], earlier: Iterable[Diagnostic]) -> list[Diagnostic]:
    """Type errors about a value that an earlier phase already reported inside (an unknown
    function, a bad ``needs`` entry): the value was dropped there, so say nothing more."""
    reported = [d.span for d in earlier if d.is_error and d.span is not None
                and d.code not in _SKIPPED_WHOLE]
    out = []
    for diag in errors:
        span = diag.span
        if diag.code != "P0202" and span is not None and any(
                r.source is span.source and span.start <= r.start and r.end <= span.end
                for r in reported):
            continue
        out.append(diag)
    return out


_LOSSY_SYNTAX = {"P0100", "P0103", "P0107"}


def drop_missing_after_mistakes(diagnostics: list[Diagnostic],
                                blocks: Iterable[tuple[str, str | None, Span]]
                                ) -> list[Diagnostic]:
    """Errors about something missing or unknown that an earlier mistake explains.

    ``blocks`` are the file's top-level blocks: kind (`pipeline`, `params`, `defaults`,
    `stage`), label, span.  A syntax error inside a block makes error recovery drop part of
    it, and a misspelt block or attribute name drops it all, so: a stage's missing `image` or
    `command` when its block or `defaults` has a syntax error; a missing `pipeline` block after
    any syntax error; unknown params when `params` has one; a missing `storage` when the
    pipeline block has one; references to a stage whose block has one; and whatever a typo
    named in an unknown-name error (``imag`` -> "did you mean `image`?") would have provided.
    """
    # Syntax errors after which recovery dropped tokens (the others are repaired in place).
    syntax = [d.span for d in diagnostics if d.code in _LOSSY_SYNTAX and d.span is not None]
    spans = [(kind, label, span) for kind, label, span in blocks]

    def has_syntax_error(span: Span) -> bool:
        return any(span.start <= e.start < span.end for e in syntax)

    broken = {kind for kind, _, span in spans if kind != "stage" and has_syntax_error(span)}
    broken_stages = {label for kind, label, span in spans
                     if kind == "stage" and label and has_syntax_error(span)}
    typos = {d.suggestion for d in diagnostics
             if d.code in ("P0201", "P0207") and d.suggestion is not None}

    def explained(diag: Diagnostic) -> bool:
        about, at = diag.about, diag.span
        if diag.code == "P0202" and about == Subject("block", "pipeline"):
            return bool(syntax) or "pipeline" in typos
        if diag.code in ("P0202", "P0306"):
            if about is not None and about.kind == "attribute" and about.name in typos:
                return True
            if "defaults" in broken or "defaults" in typos:
                return True
            return at is not None and any(kind == "stage" and span.start <= at.start < span.end
                                          and has_syntax_error(span)
                                          for kind, _, span in spans)
        if diag.code == "P0301" and about is not None:
            if about.kind == "param":
                return "params" in broken or "params" in typos
            return "stage" in typos or about.name in broken_stages
        if diag.code == "P0317":
            return "pipeline" in broken or "pipeline" in typos or "storage" in typos
        return False

    return [d for d in diagnostics if not explained(d)]


# -- semantic checks --------------------------------------------------------------------------


class _Checker:
    def __init__(self, pipeline: Pipeline, source_map: SourceMap, fallback: Span | None,
                 data: dict[str, Any]):
        self.p = pipeline
        self.sm = source_map
        self.fallback = fallback
        self.data = data
        self.diags: list[Diagnostic] = []
        #: The rules of what Kubernetes and Argo would refuse, reporting into this checker.
        self.kube = kube.KubeChecks(pipeline, self.at, self.add)
        self._ref_index: dict[tuple[Any, ...], list[tuple[Any, ...]]] | None = None

    def written(self, index: int, *path: str) -> set[str]:
        """What the stage (or ``defaults``) wrote in the block at ``path``, valid or not."""
        stages = self.data.get("stages")
        node = stages[index] if isinstance(stages, list) and index < len(stages) else None
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        return set(node) if isinstance(node, dict) else set()

    def at(self, *loc: Any) -> Span | None:
        return lookup(self.sm, loc) or self.fallback

    def add(self, diag: Diagnostic) -> None:
        self.diags.append(diag)

    def tagged_cached_images(self) -> None:
        """W0005, once per written image (a `defaults` image serves many stages)."""
        by_place: dict[object, tuple[Span | None, str, list[str]]] = {}
        for i, stage in enumerate(self.p.stages):
            if stage.cache is None or "@sha256:" in stage.image:
                continue
            span = lookup(self.sm, ("stages", i, "image")) or lookup(
                self.sm, ("defaults", "image")) or self.at("stages", i, "cache")
            place = (span.start, span.end) if span is not None else stage.name
            by_place.setdefault(place, (span, stage.image, []))[2].append(stage.name)
        for span, image, stages in by_place.values():
            named = ", ".join(f'"{s}"' for s in stages)
            self.add(warning(
                "W0005", f"cached stage{'s' * (len(stages) > 1)} {named} name"
                f"{'s' * (len(stages) == 1)} {'their' if len(stages) > 1 else 'its'} image by "
                "a tag", span, "a tag can move",
                help=f"pin it by digest (`{image}@sha256:...`): a tag pushed again after a "
                     "run reuses results built with the old image"))

    def priced_types(self) -> None:
        """W0006: a price for a GPU type nothing knows, which prices nothing (a typo leaves
        the type it meant at the default price)."""
        if self.p.prices is None:
            return
        known = catalog.known_gpu_types(self.p.cluster.profile, self.p.cluster.gpu_products)
        for name in self.p.prices.gpu:
            if name not in known:
                self.add(warning(
                    "W0006", f'a price for GPU type "{name}", which no stage can ask for',
                    lookup(self.sm, ("prices", "gpu", name, KEY)) or self.at("prices", "gpu"),
                    "not in the GPU catalogue",
                    help=did_you_mean(name, known) or "name a type of the catalogue ("
                         + ", ".join(known) + "), or add this one to "
                         "`cluster { gpu_products { ... } }`"))

    def run(self) -> list[Diagnostic]:
        self.names()
        self.params()
        stage_index = self.unique_stages()
        for i, stage in enumerate(self.p.stages):
            self.stage(i, stage, stage_index)
        self.cycles(stage_index)
        self.tagged_cached_images()
        self.priced_types()
        self.pipeline_settings()
        self.kube.templates()
        self.kube.kubernetes_text()
        self.literal_credentials()
        self.unused_params()
        return self.diags

    def literal_credentials(self) -> None:
        """W0003 for a credential written into an env value or the storage URI, which the
        compiled YAML (and the GitOps repository) would keep.  The value is never in the
        diagnostic: its source text is masked where the line is shown."""
        if self.p.storage is not None:
            kind = credentials.credential_kind(self.p.storage)
            if kind:
                self.add(warning(
                    "W0003", f"`storage` holds what looks like {kind}", self.at("storage"),
                    "a credential, not shown", masked=True,
                    help="drop it from the URI and name a Secret holding the store's "
                         'credentials: `storage_secret = "durapipe-store"`'))
        for i, stage in enumerate(self.p.stages):
            for name, value in stage.env.items():
                text = credentials.literal_text(value)
                kind = credentials.credential_kind(text, name) if text is not None else None
                if kind:
                    # No stage name: a value from `defaults` is one warning at `defaults`.
                    self.add(warning(
                        "W0003", f"env `{name}` holds what looks like {kind}",
                        self.at("stages", i, "env", name), "a credential, not shown",
                        masked=True,
                        help=f'keep it in a Kubernetes Secret and write `{name} = '
                             f'secret("secret-name", "key")`: the compiled YAML would hold '
                             "it as written"))

    def names(self) -> None:
        if not STAGE_NAME_RE.match(self.p.name):
            self.add(error("P0305", f'pipeline name "{self.p.name}" is not a valid name',
                           self.at("name"), "invalid name", help=_name_hint(self.p.name),
                           suggestion=_valid_name(self.p.name)))
        for i, stage in enumerate(self.p.stages):
            if not STAGE_NAME_RE.match(stage.name):
                self.add(error("P0305", f'stage name "{stage.name}" is not a valid name',
                               self.at("stages", i, "name"), "invalid name",
                               help=_name_hint(stage.name), suggestion=_valid_name(stage.name)))
            for out in stage.outputs:
                if not IDENT_RE.match(out):
                    self.add(error("P0305", f"output name `{out}` is not an identifier",
                                   self.at("stages", i, "outputs", out, KEY), "invalid name",
                                   help="use letters, digits and `_`"))

    def params(self) -> None:
        seen: dict[str, int] = {}
        for i, param in enumerate(self.p.params):
            if param.name in seen:
                self.add(error("P0304", f"param `{param.name}` is declared twice",
                               self.at("params", i), "declared again here",
                               extra=_labels(self.at("params", seen[param.name]),
                                             "first declared here")))
            seen.setdefault(param.name, i)
            default = param.default
            if default is None:
                continue
            ok = {
                "str": isinstance(default, str),
                "int": isinstance(default, int) and not isinstance(default, bool),
                "float": isinstance(default, (int, float)) and not isinstance(default, bool),
                "bool": isinstance(default, bool),
            }[param.type]
            if isinstance(default, float) and not math.isfinite(default):
                # A .pipe file cannot write NaN or infinity; the builder keeps to the same.
                self.add(error("P0307", f"default of `{param.name}` is not a finite number",
                               self.at("params", i, "default"), "NaN or infinity"))
            elif not ok:
                self.add(error("P0307", f"default of `{param.name}` is not {_article(param.type)}",
                               self.at("params", i, "default"), f"expected {_article(param.type)}"))

    def unique_stages(self) -> dict[str, int]:
        index: dict[str, int] = {}
        for i, stage in enumerate(self.p.stages):
            if stage.name in index:
                self.add(error("P0303", f'stage "{stage.name}" is defined twice',
                               self.at("stages", i, "name"), "defined again here",
                               extra=_labels(self.at("stages", index[stage.name], "name"),
                                             "first defined here"),
                               help="rename one of them"))
                continue
            index[stage.name] = i
        return index

    def ref(self, i: int, ref: Ref, loc: tuple[Any, ...], stage_index: dict[str, int]) -> None:
        span = self.at(*loc)
        stage = self.p.stages[i]
        if ref.path[0] == "params":
            names = [p.name for p in self.p.params]
            if len(ref.path) != 2 or ref.path[1] not in names:
                name = ref.path[1] if len(ref.path) > 1 else ""
                self.add(error("P0301", f"unknown param `{ref}`", span, "no such param",
                               help=did_you_mean(name, names)
                               or "declare it in `params { NAME: TYPE = DEFAULT }`",
                               about=Subject("param", name), suggestion=closest(name, names)))
            return
        target = ref.path[0]
        if target not in stage_index:
            self.add(error("P0301", f"unknown stage `{target}` in `{ref}`", span,
                           "no such stage",
                           help=did_you_mean(target, list(stage_index) + ["params"]),
                           about=Subject("stage", target)))
            return
        if target == stage.name:
            self.add(error("P0308", f'stage "{stage.name}" refers to its own outputs', span,
                           "self-reference"))
            return
        if len(ref.path) == 1:
            self.add(error("P0301", f"`{ref}` names a stage; use `{ref}.outputs.NAME`", span,
                           "a stage, not a value",
                           help="bare stage names belong in `needs = [...]`",
                           about=Subject("stage", target)))
            return
        outputs = list(self.p.stages[stage_index[target]].outputs)
        if len(ref.path) != 3 or ref.path[1] != "outputs" or ref.path[2] not in outputs:
            last = ref.path[-1]
            self.add(error("P0301", f"unknown output `{ref}`", span, "no such output",
                           help=did_you_mean(last, outputs)
                           or (f'stage "{target}" declares outputs: {", ".join(outputs)}'
                               if outputs else f'stage "{target}" declares no outputs'),
                           about=Subject("stage", target)))

    def references(self) -> list[Diagnostic]:
        """The rules about references and the stage graph (P0301-P0303, P0308), and the text
        that Argo would template (P0404), which a model built in code may break as well."""
        stage_index = self.unique_stages()
        for i, stage in enumerate(self.p.stages):
            self.stage_refs(i, stage, stage_index)
        self.cycles(stage_index)
        self.kube.templates()
        return self.diags

    def stage_refs(self, i: int, stage: Stage, stage_index: dict[str, int]) -> None:
        """References, wherever they appear, and ``needs``."""
        base = ("stages", i)
        for field in ("command", "args"):
            for j, item in enumerate(getattr(stage, field) or ()):
                self._refs_in(i, item, (*base, field, j), stage_index)
        for key, value in stage.env.items():
            self._refs_in(i, value, (*base, "env", key), stage_index)
        for key, value in stage.inputs.items():
            self._refs_in(i, value, (*base, "inputs", key), stage_index)
        for j, name in enumerate(stage.needs):
            span = self.at(*base, "needs", j)
            if name not in stage_index:
                self.add(error("P0301", f"unknown stage `{name}` in `needs`", span,
                               "no such stage", help=did_you_mean(name, list(stage_index)),
                               about=Subject("stage", name)))
            elif name == stage.name:
                self.add(error("P0308", f'stage "{stage.name}" needs itself', span,
                               "self-reference"))

    def stage(self, i: int, stage: Stage, stage_index: dict[str, int]) -> None:
        base = ("stages", i)
        self.stage_refs(i, stage, stage_index)
        self.kube.cluster_settings(i, stage)
        written = bool(self.written(i) & {"command", "script"})
        if stage.command is not None and stage.script is not None or (
                stage.command is None and stage.script is None and not written):
            # (A `command` or `script` that was written but is invalid is reported already.)
            both = stage.command is not None
            self.add(error("P0306", f'stage "{stage.name}" '
                           + ("sets both `command` and `script`" if both
                              else "has neither `command` nor `script`"),
                           self.at(*base, "script" if both else "name"),
                           "choose one" if both else "nothing to run",
                           help="a stage runs `command = [...]` or `script = <<EOT ... EOT`"))
        self.resources(i, stage)
        if stage.script is not None and stage.args:
            # Also the compiler's rule; here so that `check` and `run` refuse it as well.
            self.add(error("P0319", "`args` has no effect on a `script` stage",
                           self.at(*base, "args"), "has no effect",
                           help="pass values through `env`, or use `command = [...]`"))
        for name in ("backoff_factor", "max_backoff"):
            if name in self.written(i, "retry") and stage.retry.backoff is None:
                self.add(error("P0319", f"`{name}` has no effect without `backoff`",
                               self.at(*base, "retry", name, KEY), "has no effect",
                               help=f"set `backoff = 30s` (the first delay) or drop `{name}`"))
        if stage.last_attempt_on_demand and not stage.interruptible:
            self.add(error("P0315", "`last_attempt_on_demand` needs `interruptible = true`",
                           self.at(*base, "last_attempt_on_demand"), "has no effect",
                           help="set `interruptible = true` or drop this attribute"))
        if (stage.checkpoint is not None or stage.cache is not None) and not self.p.storage:
            what = "checkpoint" if stage.checkpoint is not None else "cache"
            self.add(error("P0317", f'stage "{stage.name}" uses `{what}` but the pipeline has '
                           "no `storage`", self.at(*base, what), "needs storage",
                           help='set `storage = "s3://bucket/prefix"` in the pipeline block'))
        if stage.cache is not None and not stage.outputs:
            self.add(warning("W0002", f'stage "{stage.name}" is cached but declares no outputs',
                             self.at(*base, "cache"), "cached"))
        if stage.distributed is not None:
            res = stage.resources
            if res.gpu is None and res.cpu is None:
                self.add(error("P0318", f'distributed stage "{stage.name}" declares no per-node '
                               "resources", self.at(*base, "distributed"), "multi-node",
                               help="set `resources { gpu { count = 8 } }` (per node)"))

    def _refs_in(self, i: int, value: object, loc: tuple[Any, ...],
                 stage_index: dict[str, int]) -> None:
        if isinstance(value, Ref):
            self.ref(i, value, loc, stage_index)
        elif isinstance(value, Interp):
            refs = [p for p in value.parts if isinstance(p, Ref)]
            ref_locs = sorted(self._ref_locs().get(loc, ()))
            for n, ref in enumerate(refs):
                sub = ref_locs[n] if n < len(ref_locs) else loc
                self.ref(i, ref, sub, stage_index)

    def _ref_locs(self) -> dict[tuple[Any, ...], list[tuple[Any, ...]]]:
        """Source-map keys of references inside strings, by the string's location: built in
        one pass, since scanning the whole map per string made checking quadratic."""
        if self._ref_index is None:
            self._ref_index = {}
            for key in self.sm:
                if len(key) >= 2 and key[-2] == "<ref>":
                    self._ref_index.setdefault(key[:-2], []).append(key)
        return self._ref_index

    def resources(self, i: int, stage: Stage) -> None:
        base = ("stages", i, "resources")
        gpu = stage.resources.gpu
        if gpu is not None:
            known = catalog.known_gpu_types(self.p.cluster.profile, self.p.cluster.gpu_products)
            for j, choice in enumerate(gpu.types):
                if choice.type not in known:
                    self.add(error(
                        "P0311", f'unknown GPU type "{choice.type}"',
                        self.at(*base, "gpu", "types", j), "not in the GPU catalogue",
                        help=did_you_mean(choice.type, known),
                        notes=(f"known types for profile `{self.p.cluster.profile}`: "
                               + ", ".join(known),)))
            if gpu.fallback_after is not None and len(gpu.types) < 2:
                self.add(error("P0314", "`fallback_after` needs at least two GPU types",
                               self.at(*base, "gpu", "fallback_after"), "nothing to fall back to",
                               help='list them in order: `types = ["H100", "A100"]`'))
        ladder = stage.retry.on_oom.memory if stage.retry.on_oom else ()
        for j in range(1, len(ladder)):
            if ladder[j] <= ladder[j - 1]:
                self.add(error("P0312", "each OOM memory size must be larger than the one before",
                               self.at("stages", i, "retry", "on_oom", "memory", j),
                               "not larger than the previous size"))
        memory = stage.resources.memory
        if ladder and memory is not None and memory != ladder[0]:
            self.add(error("P0313", "`resources.memory` differs from the first OOM rung",
                           self.at(*base, "memory"), "this size",
                           extra=_labels(self.at("stages", i, "retry", "on_oom", "memory", 0),
                                         "first rung"),
                           help="drop `resources.memory` (the first rung is the memory) "
                                "or make them equal"))

    def cycles(self, stage_index: dict[str, int]) -> None:
        graph = {name: [u for u in self.p.stages[i].upstream()
                        if u in stage_index and u != name]
                 for name, i in stage_index.items()}
        state: dict[str, int] = {}
        reported: set[frozenset[str]] = set()
        for root in graph:
            if state.get(root):
                continue
            stack: list[tuple[str, int]] = [(root, 0)]
            path: list[str] = []
            while stack:
                node, child = stack.pop()
                if child == 0:
                    state[node] = 1
                    path.append(node)
                deps = graph[node]
                if child < len(deps):
                    stack.append((node, child + 1))
                    nxt = deps[child]
                    if state.get(nxt) == 1:
                        cycle = path[path.index(nxt):]
                        key = frozenset(cycle)
                        if key not in reported:
                            reported.add(key)
                            self._cycle(cycle + [nxt], stage_index)
                    elif not state.get(nxt):
                        stack.append((nxt, 0))
                else:
                    state[node] = 2
                    path.pop()

    def _cycle(self, cycle: list[str], stage_index: dict[str, int]) -> None:
        first = min(cycle[:-1], key=lambda n: stage_index[n])
        start = cycle.index(first)
        ordered = cycle[start:-1] + cycle[:start] + [first]
        self.add(error("P0302", "dependency cycle: " + " -> ".join(reversed(ordered)),
                       self.at("stages", stage_index[first], "name"), "part of the cycle",
                       help="remove one of the references or `needs` entries"))

    def pipeline_settings(self) -> None:
        for j, schedule_text in enumerate(self.p.schedules):
            self.cron_schedule(schedule_text,
                               lookup(self.sm, ("schedules", j)) or self.at("schedules"))
        if self.p.timezone is not None:
            problem = schedule.timezone_problem(self.p.timezone)
            if problem:
                near = closest(self.p.timezone, schedule.timezones())
                self.add(error("P0320", f'unknown time zone "{self.p.timezone}"',
                               self.at("timezone"), problem,
                               help=f'did you mean "{near}"?' if near else
                               'use an IANA name such as "Europe/Berlin" or "UTC"',
                               suggestion=near))
        for j, name in enumerate(self.p.image_pull_secrets):
            self.kube.k8s_name("image pull secret", name, ("image_pull_secrets", j))
        if self.p.schedules and self.p.kind in ("workflow", "template"):
            self.add(schedule_conflict(self.p.kind, self.at("kind")))
        if self.p.kind == "cron" and not self.p.schedules:
            self.add(error("P0316", "`kind = \"cron\"` needs a `schedule`", self.at("kind"),
                           "no schedule", help='add `schedule = "0 3 * * *"`'))
        if self.p.checkpoint_gc is not None:
            self.checkpoint_gc(self.p.checkpoint_gc)
        self.unqueued_gpu_stages()

    def unqueued_gpu_stages(self) -> None:
        """W0004: on a pipeline whose stages name Kueue queues, a GPU stage that names none
        (its pods would bypass the quota, or wait forever where Kueue manages every pod)."""
        if self.p.queue is not None or not any(s.queue is not None for s in self.p.stages):
            return
        for i, stage in enumerate(self.p.stages):
            if stage.queue is None and stage.resources.gpu is not None:
                self.add(warning("W0004", f"GPU stage `{stage.name}` has no `queue`, while "
                                 "other stages of the pipeline go through Kueue queues",
                                 self.at("stages", i, "name"), "no queue",
                                 help='add `queue = "..."` to the stage, or one `queue` to the '
                                      "pipeline block for every stage"))

    def cron_schedule(self, text: str, span: Span | None) -> None:
        """P0316 for a schedule Argo's CronWorkflow controller would refuse."""
        problem = schedule.cron_problem(text)
        if problem:
            label = "expected 5 fields" if problem.startswith("expected 5") else problem
            self.add(error("P0316", f'invalid cron schedule "{text}"', span, label,
                           help='e.g. "0 3 * * *" (03:00 daily)'))

    def checkpoint_gc(self, gc: CheckpointGc) -> None:
        self.cron_schedule(gc.schedule, self.at("checkpoint_gc", "schedule"))
        if not self.p.storage:
            self.add(error("P0317", "`checkpoint_gc` collects the pipeline's checkpoint lines, "
                           "but the pipeline has no `storage`", self.at("checkpoint_gc"),
                           "needs storage",
                           help='set `storage = "s3://bucket/prefix"` in the pipeline block'))
        if gc.image is None and not any(s.checkpoint is not None for s in self.p.stages):
            self.add(error("P0346", "`checkpoint_gc` has no image to run in: no stage "
                           "checkpoints", self.at("checkpoint_gc"), "no image",
                           help='add `image = "python:3.12-slim"` (any image with Python '
                                '3.10 or later) to the block'))

    def unused_params(self) -> None:
        used = {ref.path[1] for s in self.p.stages for ref in s.references() if ref.is_param}
        declared: set[str] = set()
        for i, param in enumerate(self.p.params):
            if param.name not in used and param.name not in declared:
                self.add(warning("W0001", f"param `{param.name}` is never used",
                                 self.at("params", i), "declared here"))
            declared.add(param.name)


def schedule_conflict(kind: str, span: Span | None) -> Diagnostic:
    """A schedule on a pipeline asked to compile to a kind that cannot carry it (P0345)."""
    what = "a Workflow" if kind == "workflow" else "a WorkflowTemplate"
    return error("P0345", f"`schedule` is set but the pipeline is compiled to {what}, which "
                 "has no schedule", span, f"`kind = \"{kind}\"`",
                 help="drop `kind` (a pipeline with `schedule` is a CronWorkflow) or drop "
                      "`schedule`")


def _article(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _labels(span: Span | None, message: str) -> tuple[Label, ...]:
    return (Label(span, message),) if span is not None else ()


def _valid_name(name: str) -> str:
    """The nearest valid pipeline or stage name (what the quick fix writes)."""
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:50].strip("-") or "my-stage"


def _name_hint(name: str) -> str:
    return (f"use lower-case letters, digits and `-`, at most 50 characters: "
            f"\"{_valid_name(name)}\"")


def check(pipeline: Pipeline, source_map: SourceMap, fallback: Span | None,
          data: dict[str, Any]) -> list[Diagnostic]:
    """The language's own rules on a built model; ``data`` is what it was built from, for the
    rules about what was written rather than what it means (``backoff_factor`` alone)."""
    return _Checker(pipeline, source_map, fallback, data).run()


_CHECKED = "_durapipe_checked"


def mark_checked(pipeline: Pipeline) -> None:
    """Record that ``pipeline`` (this object) passed every check.  The mark lives in the
    instance dict, as ``cached_property`` values do, so it is outside equality and a changed
    copy (``dataclasses.replace``) is not marked."""
    pipeline.__dict__[_CHECKED] = True


def is_checked(pipeline: Pipeline) -> bool:
    return bool(pipeline.__dict__.get(_CHECKED))


def check_references(pipeline: Pipeline, source_map: SourceMap) -> list[Diagnostic]:
    """The rules about references and the stage graph, on a model the front end has not
    checked (one built in code): the one place unknown references (P0301) and cycles (P0302)
    are found, for ``compile_pipeline`` as for ``check``."""
    if is_checked(pipeline):
        return []
    return _Checker(pipeline, source_map, None, {}).references()
