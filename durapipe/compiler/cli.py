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
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from durapipe.compiler.options import ARGO_VERSIONS
from durapipe.files import write_atomic


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="*", metavar="FILE",
                        help=".pipe files or builder .py modules (with -o DIR/ or --check, "
                             "the sources the directory records are compiled too)")
    parser.add_argument("-o", "--output", metavar="PATH",
                        help="write to FILE, or to DIR/ (one file per pipeline); default stdout")
    parser.add_argument("--kind", choices=("workflow", "template", "cron"),
                        help="override the pipeline's output kind")
    parser.add_argument("--argo-version", choices=ARGO_VERSIONS, default="4.1",
                        help="Argo Workflows version to target (default 4.1)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 with a diff if the output on disk is stale "
                             "or holds orphans (without -o: every directory of compiled output "
                             "below the working directory)")
    parser.add_argument("--kustomization", action="store_true",
                        help="with -o DIR/: also write kustomization.yaml listing the files "
                             "(kept from then on)")
    parser.add_argument("--prune", action="store_true",
                        help="with -o DIR/: delete the files of pipelines whose source is gone "
                             "or renamed (orphans), which are otherwise kept and reported")
    parser.add_argument("--namespaces", action="store_true",
                        help="gitops output: also emit a Namespace object for each pipeline "
                             "namespace (-o DIR/: durapipe-namespaces.yaml, kept from then on)")
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
#: ``--namespaces``: the Namespace objects of every pipeline of the directory.
NAMESPACES_FILE = "durapipe-namespaces.yaml"
KUSTOMIZATION_FILE = "kustomization.yaml"


@dataclass
class Compiled:
    #: The source as shown in diagnostics (relative to the working directory).
    source: str
    name: str
    #: The pipeline's own objects as YAML (the runtime's objects are kept apart, see stream()).
    text: str
    #: The documents of ``text``, and the RBAC documents kept apart (gitops output only).
    documents: list[dict[str, Any]]
    rbac: list[dict[str, Any]]
    #: The runtime's objects (its ConfigMap), which every pipeline of one durapipe shares.
    runtime_objects: list[dict[str, Any]] = field(default_factory=list)
    #: The source file as given, and the pipeline's namespace.
    path: str = ""
    namespace: str | None = None


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
    recorded = shown
    if args.output is not None and not is_dir_output(args):
        from durapipe.compiler.managed import recorded_source

        # -o FILE records its source relative to the file: the same from every directory.
        recorded = recorded_source(path, Path(args.output).parent)
    text = to_yaml(result.documents, header(recorded))
    if extra and not is_dir_output(args):
        text = to_yaml([*result.documents, *extra], header(recorded))
    return Compiled(shown, pipeline.name, text, result.documents, extra,
                    list(result.runtime_objects), path, pipeline.namespace)


def stream(compiled: list[Compiled], *, namespaces: bool = False) -> str:
    """One YAML stream of every pipeline: the runtime's objects once (pipelines in one
    namespace share them, and Argo CD flags an object that appears twice), right after the
    first pipeline's header so that an ordered apply creates them before any pod mounts them
    (and the Namespace objects before them, with ``--namespaces``)."""
    runtime = unique_runtime_objects(compiled)
    if namespaces:
        runtime = [*namespace_documents(c.namespace for c in compiled), *runtime]
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


def unique_runtime_objects(compiled: list[Compiled],
                           extra_namespaces: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Every pipeline's runtime objects, each (namespace, name) once, in a stable order; and
    the same objects in ``extra_namespaces`` (those of orphaned pipelines kept deployed)."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for item in compiled:
        for doc in item.runtime_objects:
            meta = doc["metadata"]
            seen.setdefault((str(meta.get("namespace", "")), str(meta["name"])), doc)
    templates = {name: doc for (_, name), doc in sorted(seen.items())}
    for namespace in extra_namespaces:
        for name, doc in templates.items():
            copy = {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
            seen.setdefault((namespace, name), copy)
    return [seen[key] for key in sorted(seen)]


def namespace_documents(namespaces: Iterable[str | None]) -> list[dict[str, Any]]:
    """``--namespaces``: a Namespace for each namespace the pipelines name, so that ``kubectl
    apply -k`` works on a new cluster.  ``Prune=false``: removing the last pipeline of a
    namespace never makes Argo CD delete the namespace and everything else in it."""
    return [{
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "durapipe"},
            "annotations": {"argocd.argoproj.io/sync-options": "Prune=false"},
        },
    } for name in sorted({n for n in namespaces if n})]


def runtime_file(compiled: list[Compiled], extra_namespaces: Iterable[str] = ()) -> str | None:
    """Every pipeline's runtime objects, each (namespace, name) once: pipelines compiled by
    one durapipe share the ConfigMap, and kustomize refuses an object listed twice."""
    from durapipe.compiler.serialize import to_yaml

    runtime = unique_runtime_objects(compiled, extra_namespaces)
    if not runtime:
        return None
    return to_yaml(runtime,
                   "The durapipe runtime the pipelines' pods mount. Generated by durapipe "
                   "compile. Do not edit.")


def pipeline_files(compiled: list[Compiled], out: str) -> dict[str, tuple[str, Compiled]]:
    """``-o DIR/``: file name -> (text, pipeline) of each pipeline's objects
    (``<pipeline>.yaml``) and RBAC (``<pipeline>.rbac.yaml``), headed by the source they
    record (relative to the directory).  An object that an earlier pipeline's files hold
    already (the same kind, namespace, name and content, such as an object every pipeline
    shares) is written once, so kustomize sees no duplicate; pipelines are taken in name
    order, so which file holds it does not depend on the order of the command line.  The same
    name with different content is a conflict (``DirectoryConflict``)."""
    from durapipe.compiler import header, to_yaml
    from durapipe.compiler.managed import recorded_source

    seen: dict[tuple[str, str, str, str], tuple[dict[str, Any], str]] = {}
    files: dict[str, tuple[str, Compiled]] = {}
    for c in sorted(compiled, key=lambda item: item.name):
        recorded = recorded_source(c.path, out) if c.path else c.source
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
                files[f"{c.name}{suffix}.yaml"] = (
                    to_yaml(kept, header(recorded, managed=True)), c)
    return files


@dataclass
class Shared:
    """What the files every pipeline of a directory shares are made of."""
    kustomization: bool = False
    namespaces: bool = False
    #: Files kept without being compiled (orphans): their names, and their namespaces.
    kept_names: list[str] = field(default_factory=list)
    kept_namespaces: set[str] = field(default_factory=set)


def shared_files(compiled: list[Compiled], names: list[str], shared: Shared) -> dict[str, str]:
    """File name -> text of ``durapipe-runtime.yaml``, ``durapipe-namespaces.yaml`` and
    ``kustomization.yaml``, from every pipeline of the directory (and the orphans kept)."""
    from durapipe.compiler import to_yaml

    files: dict[str, str] = {}
    runtime = runtime_file(compiled, sorted(shared.kept_namespaces))
    if runtime is not None:
        files[RUNTIME_FILE] = runtime
    if shared.namespaces:
        spaces = [*(c.namespace for c in compiled), *shared.kept_namespaces]
        files[NAMESPACES_FILE] = to_yaml(
            namespace_documents(spaces),
            "The namespaces of the pipelines. Generated by durapipe compile. Do not edit.")
    if shared.kustomization:
        files[KUSTOMIZATION_FILE] = kustomization(
            sorted({*names, *shared.kept_names, *files}))
    return files


def directory_files(compiled: list[Compiled], args: argparse.Namespace) -> dict[str, str]:
    """``-o DIR/`` from these pipelines alone: path -> text of every file."""
    out = args.output
    own = {name: text for name, (text, _) in pipeline_files(compiled, out).items()}
    shared = Shared(kustomization=bool(args.kustomization),
                    namespaces=bool(getattr(args, "namespaces", False)))
    files = {**shared_files(compiled, list(own), shared), **own}
    return {os.path.join(out, name): text for name, text in sorted(files.items())}


class DirectoryConflict(Exception):
    """Two pipelines of one ``-o DIR/`` emit different objects of the same name."""


def check_outputs(files: dict[str, str], removed: Iterable[str] = ()) -> int:
    """Compare ``files`` (path -> text) with the disk: a unified diff for each stale file;
    ``removed`` are the paths a write would delete (or keep as orphans), each reported."""
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
    orphans = list(removed)
    if stale:
        print(f"durapipe: {stale} compiled file(s) are stale; run `durapipe compile` again",
              file=sys.stderr)
    for path in orphans:
        print(f"durapipe: {path} is an orphan: its recorded source is gone or no longer "
              "defines that pipeline; `durapipe compile -o DIR/ --prune` deletes it",
              file=sys.stderr)
    return 1 if stale or orphans else 0


def compile_sources(paths: list[str], args: argparse.Namespace) -> tuple[list[Compiled], int]:
    """Compile each of ``paths``, print the diagnostics; the pipelines and an exit code (1
    when a file has errors, 2 when two files of a directory define the same pipeline)."""
    diagnostics: list[object] = []
    compiled: list[Compiled] = []
    failed = False
    for path in paths:
        item = compile_file(path, args, diagnostics)
        if item is None:
            failed = True
        else:
            compiled.append(item)
    names = [c.name for c in compiled]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates and is_dir_output(args):
        print(f"durapipe: several inputs define pipeline(s) {', '.join(duplicates)}; "
              "their files would overwrite each other", file=sys.stderr)
        return compiled, 2
    if not failed and gitops(args):
        from durapipe.compiler.apply_limits import apply_limit_diagnostics

        diagnostics.extend(apply_limit_diagnostics(
            (doc, c.source) for c in compiled
            for doc in (*c.documents, *c.rbac, *c.runtime_objects)))
        failed = any(getattr(d, "is_error", False) for d in diagnostics)
    if diagnostics:
        text = _render(diagnostics, args.format)
        if args.format == "json" or text:
            print(text, file=sys.stderr)
    return compiled, 1 if failed else 0


def _directory_sources(directory: Path, given: list[str]) -> list[str]:
    """The sources of a compile into ``directory``: those given, then those its files record
    (that still exist), each once."""
    from durapipe.compiler import managed

    seen = {managed.source_stem(p) for p in given}
    extra: list[str] = []
    for item in managed.scan(directory).values():
        stem = item.source_stem(directory)
        if stem is None or stem in seen:
            continue
        seen.add(stem)
        found = managed.find_source(stem)
        if found is not None:
            extra.append(os.path.relpath(found))
    return [*given, *sorted(extra)]


def _plan_directory(compiled: list[Compiled], args: argparse.Namespace
                    ) -> tuple[dict[str, str], dict[str, Compiled], list[str]]:
    """File name -> text of the whole directory, file name -> pipeline of the pipelines'
    files, and the orphans (managed files no source makes any more)."""
    from durapipe.compiler import managed

    directory = Path(args.output)
    found = managed.scan(directory)
    own = pipeline_files(compiled, args.output)
    shared = Shared(kustomization=bool(args.kustomization) or KUSTOMIZATION_FILE in found,
                    namespaces=bool(args.namespaces) or NAMESPACES_FILE in found)
    orphans = sorted(n for n, f in found.items() if f.source is not None and n not in own)
    files = shared_files(compiled, list(own), shared)
    orphans += sorted(n for n, f in found.items() if f.source is None and n not in files)
    if orphans and not args.prune:  # kept, and kept deployed: listed, their runtime kept
        shared.kept_names = orphans
        for name in orphans:
            try:
                text = (directory / name).read_text(encoding="utf-8")
            except OSError:
                continue
            shared.kept_namespaces |= managed.namespaces_in(text)
        files = shared_files(compiled, list(own), shared)
    files.update({name: text for name, (text, _) in own.items()})
    return dict(sorted(files.items())), {n: c for n, (_, c) in own.items()}, orphans


def run_directory(args: argparse.Namespace, given: list[str]) -> int:
    """``-o DIR/``: compile ``given`` and every source the directory records; write the
    given pipelines' files and the shared ones (the others' files stay as they are), or with
    ``--check`` compare the whole directory."""
    from durapipe.compiler import managed

    directory = Path(args.output)
    compiled, rc = compile_sources(_directory_sources(directory, given), args)
    if rc:
        return rc
    try:
        files, owners, orphans = _plan_directory(compiled, args)
    except DirectoryConflict as exc:
        print(f"durapipe: {exc}", file=sys.stderr)
        return 2
    shown = args.output if args.output.endswith(("/", os.sep)) else args.output + "/"
    if args.check:
        return check_outputs({shown + n: t for n, t in files.items()},
                             [shown + n for n in orphans])
    given_stems = {managed.source_stem(p) for p in given}
    for name, text in files.items():
        owner = owners.get(name)
        if owner is not None and managed.source_stem(owner.path) not in given_stems and \
                (directory / name).exists():
            continue  # another pipeline's file: a subset compile leaves it as it is
        write_atomic(directory / name, text)
    for name in orphans:
        if args.prune:
            (directory / name).unlink(missing_ok=True)
            print(f"durapipe: removed {shown}{name} (orphan)", file=sys.stderr)
        else:
            print(f"durapipe: kept {shown}{name}: an orphan (its recorded source is gone or no "
                  "longer defines that pipeline); --prune deletes it", file=sys.stderr)
    return 0


def check_discovered(args: argparse.Namespace) -> int:
    """``--check`` without ``-o`` (a pre-commit hook without args, ``pre-commit try-repo``):
    check each directory below the working directory that records one of the files (every
    one when no file is named); a file no directory records goes to the only one there is."""
    from durapipe.compiler import managed

    directories = managed.managed_directories(Path.cwd())
    if not directories:
        print("durapipe: --check needs -o FILE or -o DIR/: no directory below the working "
              "directory holds output of `durapipe compile -o DIR/`", file=sys.stderr)
        return 2
    records = {d: {f.source_stem(d) for f in managed.scan(d).values()} for d in directories}
    assigned: dict[Path, list[str]] = {d: [] for d in directories}
    unplaced: list[str] = []
    for path in args.files:
        homes = [d for d in directories if managed.source_stem(path) in records[d]]
        for home in homes:
            assigned[home].append(path)
        if not homes:
            unplaced.append(path)
    if unplaced and len(directories) > 1:
        print(f"durapipe: no directory of compiled output records {', '.join(unplaced)}; "
              "compile it once with -o DIR/ (or pass -o DIR/ to --check)", file=sys.stderr)
        return 2
    if unplaced:
        assigned[directories[0]].extend(unplaced)
    rc = 0
    for directory, files in assigned.items():
        if files or not args.files:
            shown = os.path.relpath(directory) + "/"
            rc = max(rc, run_directory(argparse.Namespace(**{**vars(args), "output": shown}),
                                       files))
    return rc


def _usage_error(args: argparse.Namespace) -> str | None:
    directory = is_dir_output(args)
    if args.kustomization and not directory and not (args.check and args.output is None):
        return "--kustomization needs -o DIR/"
    if args.prune and not directory and not (args.check and args.output is None):
        return "--prune needs -o DIR/"
    if args.namespaces and not gitops(args) and not (args.check and args.output is None):
        return "--namespaces needs gitops output (-o DIR/ or --gitops)"
    if not args.files and not directory and not args.check:
        return "compile needs FILE... (or -o DIR/, which compiles the sources it records)"
    return None


def run(args: argparse.Namespace) -> int:
    from durapipe.files import expand_pipeline_inputs

    files = expand_pipeline_inputs(list(args.files))
    if files is None:
        return 2
    args = argparse.Namespace(**{**vars(args), "files": files})
    problem = _usage_error(args)
    if problem is not None:
        print(f"durapipe: {problem}", file=sys.stderr)
        return 2
    if args.output is None and args.check:
        return check_discovered(args)
    if is_dir_output(args):
        return run_directory(args, list(args.files))
    if not args.files:
        print("durapipe: --check -o FILE needs FILE...", file=sys.stderr)
        return 2
    compiled, rc = compile_sources(list(args.files), args)
    if rc:
        return rc
    if args.output is None:
        sys.stdout.write(stream(compiled, namespaces=args.namespaces))
        return 0
    # The order of the command line (pre-commit's) does not change the file.
    text = stream(sorted(compiled, key=lambda c: c.name), namespaces=args.namespaces)
    if args.check:
        return check_outputs({args.output: text})
    write_atomic(Path(args.output), text)
    return 0


__all__ = ["add_arguments", "run"]
