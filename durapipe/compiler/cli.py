"""``durapipe compile``: arguments and behaviour (the top-level CLI delegates here).

Output goes to stdout, to one file (``-o FILE``, every pipeline's documents in one stream), or
to a directory (``-o DIR/``: one ``<pipeline>.yaml`` per pipeline, optionally with a
``kustomization.yaml``).  ``--check`` writes nothing: it compares what would be written with
what is on disk, prints a unified diff and exits 1 when they differ.

A directory, or any output with ``--gitops``, is what a GitOps tool applies (``gitops``): a
pipeline that would be a run-once Workflow becomes a WorkflowTemplate unless a Workflow is asked
for (``--kind workflow`` or ``kind = "workflow"``), which then gets a fixed ``metadata.name``
(kustomize and Argo CD cannot apply ``generateName``); and the ServiceAccount, Role and
RoleBinding the pods need (:mod:`durapipe.compiler.rbac`) come along, in
``<pipeline>.rbac.yaml``, unless ``--no-rbac``.

Exit codes: 0 success, 1 diagnostics with errors or stale output under ``--check``,
2 usage errors.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from durapipe.compiler.options import ARGO_VERSIONS
from durapipe.files import write_atomic


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help=".pipe files or builder .py modules")
    parser.add_argument("-o", "--output", metavar="PATH",
                        help="write to FILE, or to DIR/ (one file per pipeline); default stdout")
    parser.add_argument("--kind", choices=("workflow", "template", "cron"),
                        help="override the pipeline's output kind")
    parser.add_argument("--argo-version", choices=ARGO_VERSIONS, default="4.1",
                        help="Argo Workflows version to target (default 4.1)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 with a diff if the output on disk is stale")
    parser.add_argument("--kustomization", action="store_true",
                        help="with -o DIR/: also write kustomization.yaml listing the files")
    parser.add_argument("--gitops", action="store_true",
                        help="output for kustomize / Argo CD / Flux (implied by -o DIR/): "
                             "WorkflowTemplates and CronWorkflows, named Workflows, RBAC")
    parser.add_argument("--no-rbac", action="store_true",
                        help="leave out the ServiceAccount, Role and RoleBinding (gitops "
                             "output); the pods then run as `service_account` or the "
                             "namespace's default")
    parser.add_argument("--format", choices=("human", "short", "json"), default="human",
                        help="how to print diagnostics (default human)")
    parser.add_argument("--runtime-image", metavar="IMAGE",
                        help="copy the runtime out of IMAGE (built from Containerfile.runtime) "
                             "instead of shipping it as a ConfigMap (the default)")


#: The file of ``-o DIR/`` that holds the runtime's ConfigMap(s), once for all pipelines.
RUNTIME_FILE = "durapipe-runtime.yaml"


@dataclass
class Compiled:
    source: str
    name: str
    #: The pipeline's own objects as YAML (the runtime's objects are kept apart, see stream()).
    text: str
    #: The documents of ``text``, and the RBAC documents kept apart (gitops output only).
    documents: list[dict[str, Any]]
    rbac: list[dict[str, Any]]
    #: The runtime's objects (its ConfigMap), which every pipeline of one durapipe shares.
    runtime_objects: list[dict[str, Any]] = field(default_factory=list)


def is_dir_output(args: argparse.Namespace) -> bool:
    out = args.output
    return out is not None and (out.endswith(("/", os.sep)) or Path(out).is_dir())


def gitops(args: argparse.Namespace) -> bool:
    return bool(args.gitops) or is_dir_output(args)


def display_path(path: str) -> str:
    """The source path as written in headers: relative and POSIX, so machines agree."""
    p = Path(path)
    if p.is_absolute():
        try:
            p = p.relative_to(Path.cwd())
        except ValueError:
            return p.name
    return str(PurePosixPath(*p.parts))


def _render(diags: list[object], fmt: str) -> str:
    from durapipe.dsl.diagnostics import Diagnostic, render

    items = [d for d in diags if isinstance(d, Diagnostic)]
    return render(items, fmt, color=fmt == "human" and sys.stderr.isatty())


def compile_file(path: str, args: argparse.Namespace, diagnostics: list[object]) -> Compiled | None:
    from durapipe.compiler import CompileOptions, compile_pipeline, header, to_yaml
    from durapipe.dsl import load_path

    loaded = load_path(path)
    diagnostics.extend(loaded.diagnostics)
    if loaded.pipeline is None or not loaded.ok:
        return None
    from durapipe.compiler import rbac

    shown = display_path(path)
    pipeline = loaded.pipeline
    kind = args.kind
    with_rbac = gitops(args) and not args.no_rbac
    if gitops(args) and kind is None and pipeline.output_kind == "workflow" and \
            pipeline.kind is None:
        kind = "template"  # a run-once Workflow only where asked for
    options = CompileOptions(
        kind=kind,
        argo_version=args.argo_version,
        runtime_image=args.runtime_image or None,
        fixed_names=gitops(args),
        service_account=rbac.account_name(pipeline) if with_rbac else None,
        source_map=loaded.source_map,
        source_path=shown,
    )
    result = compile_pipeline(pipeline, options)
    diagnostics.extend(result.diagnostics)
    if not result.ok:
        return None
    from durapipe.compiler.argo_workflow import creates_workflows

    extra = rbac.rbac_documents(pipeline, creates_workflows(result.documents)) \
        if with_rbac else []
    text = to_yaml(result.documents, header(shown))
    if extra and not is_dir_output(args):
        text = to_yaml([*result.documents, *extra], header(shown))
    return Compiled(shown, pipeline.name, text, result.documents, extra,
                    list(result.runtime_objects))


def stream(compiled: list[Compiled]) -> str:
    """One YAML stream of every pipeline: the runtime's objects once (pipelines in one
    namespace share them, and Argo CD flags an object that appears twice), right after the
    first pipeline's header so that an ordered apply creates them before any pod mounts them."""
    runtime = unique_runtime_objects(compiled)
    if not compiled or not runtime:
        return "".join(c.text for c in compiled)
    from durapipe.compiler.serialize import to_yaml

    first = compiled[0]
    head, _, body = first.text.partition("\n---\n")
    return head + "\n---\n" + to_yaml(runtime) + "---\n" + body + \
        "".join(c.text for c in compiled[1:])


def kustomization(names: list[str]) -> str:
    from durapipe.compiler.serialize import to_yaml

    doc = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": sorted(names),
    }
    return to_yaml([doc], "Generated by durapipe compile. Do not edit.")


def _object_id(doc: dict[str, Any]) -> tuple[str, str, str, str]:
    meta = doc.get("metadata", {})
    return (str(doc.get("apiVersion")), str(doc.get("kind")), str(meta.get("namespace", "")),
            str(meta.get("name") or meta.get("generateName")))


def unique_runtime_objects(compiled: list[Compiled]) -> list[dict[str, Any]]:
    """Every pipeline's runtime objects, each (namespace, name) once, in a stable order."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for item in compiled:
        for doc in item.runtime_objects:
            meta = doc["metadata"]
            seen.setdefault((str(meta.get("namespace", "")), str(meta["name"])), doc)
    return [seen[key] for key in sorted(seen)]


def runtime_file(compiled: list[Compiled]) -> str | None:
    """Every pipeline's runtime objects, each (namespace, name) once: pipelines compiled by
    one durapipe share the ConfigMap, and kustomize refuses an object listed twice."""
    from durapipe.compiler.serialize import to_yaml

    runtime = unique_runtime_objects(compiled)
    if not runtime:
        return None
    return to_yaml(runtime,
                   "The durapipe runtime the pipelines' pods mount. Generated by durapipe "
                   "compile. Do not edit.")


def directory_files(compiled: list[Compiled], args: argparse.Namespace) -> dict[str, str]:
    """``-o DIR/``: each pipeline's objects in ``<pipeline>.yaml``, its RBAC in
    ``<pipeline>.rbac.yaml``.  Whatever objects the compiler emits are written, and an object
    that an earlier pipeline's files hold already (the same kind, namespace, name and content,
    such as an object every pipeline shares) is written once, so kustomize sees no duplicate.
    The same name with different content is a conflict (``DirectoryConflict``)."""
    from durapipe.compiler import header, to_yaml

    out = args.output
    seen: dict[tuple[str, str, str, str], tuple[dict[str, Any], str]] = {}
    files: dict[str, str] = {}
    runtime = runtime_file(compiled)
    if runtime is not None:
        files[os.path.join(out, RUNTIME_FILE)] = runtime
    for c in compiled:
        for suffix, docs in (("", c.documents), (".rbac", c.rbac)):
            kept: list[dict[str, Any]] = []
            for doc in docs:
                key = _object_id(doc)
                if key in seen:
                    if seen[key][0] != doc:
                        raise DirectoryConflict(
                            f"{key[1]} `{key[3]}` of pipeline {c.name} differs from the one "
                            f"of pipeline {seen[key][1]}")
                    continue
                seen[key] = (doc, c.name)
                kept.append(doc)
            if kept:
                files[os.path.join(out, f"{c.name}{suffix}.yaml")] = to_yaml(
                    kept, header(c.source))
    if args.kustomization:
        files[os.path.join(out, "kustomization.yaml")] = kustomization(
            [os.path.basename(path) for path in files])
    return files


class DirectoryConflict(Exception):
    """Two pipelines of one ``-o DIR/`` emit different objects of the same name."""


def planned_outputs(compiled: list[Compiled], args: argparse.Namespace) -> dict[str, str] | None:
    """Path -> text of everything to write; ``None`` means stdout."""
    out = args.output
    if out is None:
        return None
    if is_dir_output(args):
        return directory_files(compiled, args)
    return {out: stream(compiled)}


def check_outputs(files: dict[str, str]) -> int:
    stale = 0
    for path, text in files.items():
        try:
            current = Path(path).read_text(encoding="utf-8")
        except OSError:
            current = ""
        if current != text:
            stale += 1
            sys.stdout.writelines(difflib.unified_diff(
                current.splitlines(keepends=True), text.splitlines(keepends=True),
                fromfile=f"{path} (on disk)", tofile=f"{path} (compiled)"))
    if stale:
        print(f"durapipe: {stale} compiled file(s) are stale; run `durapipe compile` again",
              file=sys.stderr)
        return 1
    return 0


def run(args: argparse.Namespace) -> int:
    diagnostics: list[object] = []
    compiled: list[Compiled] = []
    failed = False
    for path in args.files:
        item = compile_file(path, args, diagnostics)
        if item is None:
            failed = True
        else:
            compiled.append(item)
    names = [c.name for c in compiled]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates and args.output is not None and (
            args.output.endswith(("/", os.sep)) or Path(args.output).is_dir()):
        print(f"durapipe: several inputs define pipeline(s) {', '.join(duplicates)}; "
              "their files would overwrite each other", file=sys.stderr)
        return 2
    if diagnostics:
        text = _render(diagnostics, args.format)
        if args.format == "json" or text:
            print(text, file=sys.stderr)
    if failed:
        return 1
    if args.kustomization and not is_dir_output(args):
        print("durapipe: --kustomization needs -o DIR/", file=sys.stderr)
        return 2
    try:
        files = planned_outputs(compiled, args)
    except DirectoryConflict as exc:
        print(f"durapipe: {exc}", file=sys.stderr)
        return 2
    if files is None:
        if args.check:
            print("durapipe: --check needs -o FILE or -o DIR/", file=sys.stderr)
            return 2
        sys.stdout.write(stream(compiled))
        return 0
    if args.check:
        return check_outputs(files)
    for path, text in files.items():
        write_atomic(Path(path), text)
    return 0


__all__ = ["add_arguments", "run"]
