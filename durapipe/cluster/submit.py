"""``durapipe submit``, ``durapipe status`` and ``durapipe watch``: runs on a cluster.

``submit`` sends a compiled pipeline (compiling a ``.pipe`` or builder ``.py`` first) or starts
a run of a WorkflowTemplate already on the cluster, and prints the run's name.  ``status``
prints each stage as durapipe understands it (``run_status``), ``watch`` follows the run live
and exits with a code for its end phase: 0 Succeeded, 1 Failed, 2 Error.

Exit codes otherwise: 0 done, 1 a cluster or input problem (one line on stderr, never a
traceback), 2 usage errors.  What the cluster sent is printed with its control characters
escaped (``run_status.printable``): names and messages come from the API server and from the
workload's own termination messages.

``watch`` outlives a lost connection: once it has read the run, a transient failure (the API
server unreachable, silent, too slow, a 5xx) is said on stderr and retried after a growing
pause (``RECONNECT_FIRST_S`` doubling up to ``RECONNECT_MAX_S``), until ``RECONNECT_GIVE_UP_S``
pass without a healthy watch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO

from durapipe.cluster import run_status
from durapipe.cluster.arguments import add_connection_arguments
from durapipe.cluster.api import Cluster, ClusterError, Expired, connect, resource_version
from durapipe.compiler.argo_pod import RESUME_FROM_PARAM
from durapipe.compiler.checkpoint_gc import is_collector
from durapipe.dsl.arguments import parse_assignments

#: The label Argo puts on each pod of a Workflow, naming it.
LABEL_WORKFLOW = "workflows.argoproj.io/workflow"

#: Seconds a watch request asks the server to keep it open before it is renewed (a watch
#: silent for longer, plus ``cluster.WATCH_SILENCE_S``, is a dead connection).
WATCH_TIMEOUT_S = 60
#: `watch`'s first pause before reconnecting, its longest, and how long it keeps trying.
RECONNECT_FIRST_S = 1.0
RECONNECT_MAX_S = 30.0
RECONNECT_GIVE_UP_S = 300.0


def add_submit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", metavar="FILE",
                        help=".pipe, builder .py, or compiled .yaml/.json to submit")
    parser.add_argument("--template", metavar="NAME",
                        help="start a run of the WorkflowTemplate NAME already on the cluster")
    parser.add_argument("-p", "--parameter", action="append", default=[], metavar="NAME=VALUE",
                        help="set a pipeline parameter (repeatable; over --parameter-file)")
    parser.add_argument("-f", "--parameter-file", metavar="FILE",
                        help="parameters from a YAML or JSON mapping (name: value)")
    parser.add_argument("--resume-from", metavar="RUN",
                        help="restore each checkpointed stage from RUN's checkpoint line "
                             "while its own has no commit, even where the inputs changed "
                             "(its commits still go to its own line)")
    parser.add_argument("--watch", action="store_true",
                        help="follow the run until it ends, as `durapipe watch` does")
    parser.add_argument("--dry-run", action="store_true",
                        help="print what would be created (with -o yaml or json) and create "
                             "nothing; a FILE needs no cluster then")
    parser.add_argument("-o", "--output", choices=("name", "yaml", "json"), default="name",
                        help="print the run's name (default), or the created objects as yaml "
                             "or json")
    add_connection_arguments(parser)


def add_status_arguments(parser: argparse.ArgumentParser, *, watch: bool = False) -> None:
    parser.add_argument("run", metavar="RUN", help="the Workflow's name")
    if not watch:
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument("--argo-namespace", default="argo", metavar="NS",
                            help="the namespace of Argo's controller, where it keeps the "
                                 "memoization caches that say why a stage missed "
                                 "(default: argo)")
    add_connection_arguments(parser)


def print_failure(message: str) -> int:
    print(f"durapipe: {run_status.printable(message)}", file=sys.stderr)
    return 1


# -- submit -----------------------------------------------------------------------------------


def given_parameters(args: argparse.Namespace) -> dict[str, str] | str:
    """``--parameter-file`` first, then each ``-p`` over it (as ``argo submit`` does)."""
    from durapipe.dsl.arguments import read_parameter_file

    given: dict[str, str] = {}
    if getattr(args, "parameter_file", None):
        from_file = read_parameter_file(args.parameter_file)
        if isinstance(from_file, str):
            return from_file
        given.update(from_file)
    from_line = parse_assignments(args.parameter)
    if isinstance(from_line, str):
        return from_line
    given.update(from_line)
    return given


def declared_parameters(spec: Mapping[str, Any]) -> list[str]:
    return [str(p.get("name")) for p in (spec.get("arguments") or {}).get("parameters") or ()]


def check_parameters(given: Mapping[str, str], declared: Sequence[str], owner: str) -> str | None:
    """The message for the first parameter ``owner`` does not declare, or ``None``."""
    from durapipe.dsl.diagnostics import did_you_mean

    for key in given:
        if key not in declared:
            hint = did_you_mean(key, declared)
            known = ", ".join(declared) if declared else "none"
            return (f"unknown parameter {key!r} for {owner}"
                    + (f"; {hint}" if hint else "") + f" (it declares: {known})")
    return None


def with_parameters(spec: Mapping[str, Any], given: Mapping[str, str]) -> dict[str, Any]:
    """``spec`` with the given values replacing its declared parameters' defaults."""
    out = dict(spec)
    params = [dict(p) for p in (spec.get("arguments") or {}).get("parameters") or ()]
    for p in params:
        if p.get("name") in given:
            p["value"] = given[str(p["name"])]
            p.pop("valueFrom", None)
    if params:
        out["arguments"] = {**(spec.get("arguments") or {}), "parameters": params}
    return out


def template_run(template: Mapping[str, Any], given: Mapping[str, str]) -> dict[str, Any]:
    """A Workflow that runs the WorkflowTemplate ``template`` with ``given`` parameters."""
    meta = template.get("metadata") or {}
    name = str(meta.get("name"))
    body: dict[str, Any] = {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
        "metadata": {"generateName": f"{name}-",
                     "labels": {"workflows.argoproj.io/workflow-template": name}},
        "spec": {"workflowTemplateRef": {"name": name}},
    }
    if given:
        body["spec"]["arguments"] = {"parameters": [
            {"name": k, "value": v} for k, v in given.items()]}
    return body


def load_documents(path: str, args: argparse.Namespace) -> list[dict[str, Any]] | int:
    """The Argo objects of ``path``: compiled here for ``.pipe``/``.py``, read otherwise."""
    if path.endswith((".pipe", ".py")):
        from durapipe.compiler.cli import _render, compile_file

        diagnostics: list[object] = []
        # A run-once submission: no GitOps layout, and RBAC is the cluster's (the run uses the
        # namespace's default account unless the pipeline names one).
        compile_args = argparse.Namespace(kind=None, argo_version="4.1", runtime_image=None,
                                          gitops=False, no_rbac=True, output=None)
        compiled = compile_file(path, compile_args, diagnostics)
        if diagnostics:
            print(_render(diagnostics, "human"), file=sys.stderr)
        if compiled is None:
            return 1
        return [*compiled.runtime_objects,
                *(d for d in compiled.documents if not is_collector(d))]
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        return print_failure(f"cannot read {path}: {exc.strerror or exc}")
    try:
        if path.endswith(".json"):
            loaded = json.loads(text)
            docs = loaded if isinstance(loaded, list) else [loaded]
        else:
            import yaml

            docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except ImportError:
        from durapipe.extras import install_hint

        return print_failure(f"reading YAML needs the `cluster` extra: {install_hint('cluster')}")
    except ValueError as exc:  # JSONDecodeError, and yaml.YAMLError via its mark text
        return print_failure(f"{path} is not valid JSON: {exc}")
    except Exception as exc:  # yaml.YAMLError has no common base with the stdlib's
        if type(exc).__module__.startswith("yaml"):
            return print_failure(f"{path} is not valid YAML: {str(exc).splitlines()[0]}")
        raise
    kinds = {"Workflow", "WorkflowTemplate", "CronWorkflow"}
    # The checkpoint collector's CronWorkflow is deployed with the pipeline, never a run of it.
    found = [d for d in docs if isinstance(d, dict) and d.get("kind") in kinds
             and not is_collector(d)]
    if not found:
        return print_failure(f"{path} holds no Workflow, WorkflowTemplate or CronWorkflow")
    # The runtime's ConfigMap, which every pod of the pipeline mounts, travels with it.
    return [d for d in docs if isinstance(d, dict) and d.get("kind") == "ConfigMap"] + found


def submit(args: argparse.Namespace) -> int:
    given = given_parameters(args)
    if isinstance(given, str):
        print(f"durapipe submit: {given}", file=sys.stderr)
        return 2
    if (args.file is None) == (args.template is None):
        print("durapipe submit: give a FILE or --template NAME (one of them)", file=sys.stderr)
        return 2
    if args.watch and args.dry_run:
        print("durapipe submit: --watch follows a run --dry-run does not start", file=sys.stderr)
        return 2
    sender = Sender(args)
    try:
        if getattr(args, "resume_from", None):
            problem = resume_lines(sender, args, given)
            if problem:
                return print_failure(problem)
        if args.template is not None:
            cluster = sender.connect(args.namespace)
            template = cluster.get("WorkflowTemplate", args.template)
            problem = check_parameters(given, declared_parameters(template.get("spec") or {}),
                                       f"WorkflowTemplate {args.template}")
            if problem:
                return print_failure(problem)
            sender.create(template_run(template, given))
        else:
            docs = load_documents(args.file, args)
            if isinstance(docs, int):
                return docs
            problem = _submit_documents(docs, given, sender)
            if problem:
                return print_failure(problem)
        return sender.finish()
    except ClusterError as exc:
        return print_failure(str(exc))


def resume_lines(sender: Sender, args: argparse.Namespace, given: dict[str, str]) -> str | None:
    """``--resume-from RUN``: RUN's checkpoint lines, by stage, into the run's
    ``RESUME_FROM_PARAM``; the message where there are none to give."""
    if RESUME_FROM_PARAM in given:
        return f"--resume-from sets the parameter {RESUME_FROM_PARAM}; do not give it as well"
    cluster = sender.connect(args.namespace)
    run = str(args.resume_from)
    wf = cluster.get("Workflow", run)
    try:
        lines = run_status.checkpoint_lines(wf)
    except run_status.MalformedWorkflow as exc:
        return (f"the API server at {cluster.server} returned a Workflow {run} that durapipe "
                f"cannot read: {exc}")
    if not lines:
        return (f"run {run} has no checkpoint line to resume from: none of its checkpointed "
                "stages' pods ran (or its pipeline checkpoints nothing)")
    for stage, line in sorted(lines.items()):
        print(f"durapipe submit: {stage} restores from {run}'s line {line}", file=sys.stderr)
    given[RESUME_FROM_PARAM] = json.dumps(lines, sort_keys=True, separators=(",", ":"))
    return None


class Sender:
    """Where `submit`'s objects go: to the cluster, or (``--dry-run``) only to stdout; and
    what is printed of them (``-o``)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dry_run: bool = bool(getattr(args, "dry_run", False))
        self.output: str = getattr(args, "output", "name") or "name"
        self.cluster: Cluster | None = None
        self.namespace = ""
        self.sent: list[dict[str, Any]] = []
        self.run: dict[str, Any] | None = None

    def connect(self, namespace: str | None) -> Cluster:
        self.cluster = connect(self.args.kubeconfig, self.args.context, namespace)
        self.namespace = self.cluster.namespace
        return self.cluster

    def target(self, namespace: str | None) -> str:
        """The namespace the objects go to: without a cluster (a dry run of a file), the
        file's, the option's or ``default``."""
        if not self.dry_run:
            return self.connect(namespace).namespace
        self.namespace = namespace or "default"
        return self.namespace

    def ensure_core(self, body: dict[str, Any]) -> None:
        self.sent.append(body)
        if not self.dry_run:
            assert self.cluster is not None
            self.cluster.ensure_core(body)

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        self.sent.append(body)
        if self.dry_run:
            return body
        assert self.cluster is not None
        return self.cluster.apply(body)

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create the run's own object (the Workflow, or a CronWorkflow applied)."""
        self.sent.append(body)
        if self.dry_run:
            self.run = body
            return body
        assert self.cluster is not None
        created = self.cluster.apply(body) if body["kind"] == "CronWorkflow" \
            else self.cluster.create(body)
        self.run = created
        return created

    def finish(self) -> int:
        assert self.run is not None
        if self.output == "json":
            print(json.dumps(self.sent[:-1] + [self.run] if not self.dry_run else self.sent,
                             indent=2, sort_keys=True))
        elif self.output == "yaml":
            import yaml

            print(yaml.safe_dump_all(self.sent[:-1] + [self.run] if not self.dry_run
                                     else self.sent, sort_keys=False), end="")
        elif self.dry_run:
            print(f"{self.run['kind']} {_name_of(self.run)} (dry run: nothing created)")
        else:
            print(self.run["metadata"]["name"])
        if self.run["kind"] == "CronWorkflow" and not self.dry_run:
            name = self.run["metadata"]["name"]
            print(f"durapipe: CronWorkflow {name} scheduled; its runs are named {name}-<time>",
                  file=sys.stderr)
            return 0
        if self.args.watch:
            assert self.cluster is not None
            name = str(self.run["metadata"]["name"])
            report = follow(self.cluster, name, Display(sys.stderr, sys.stderr.isatty()))
            return run_status.EXIT_CODES.get(report.phase, 2)
        return 0


def _submit_documents(docs: list[dict[str, Any]], given: Mapping[str, str],
                      sender: Sender) -> str | None:
    """Send a file's objects; the message for parameters the file does not declare."""
    namespace = sender.args.namespace or next(
        (d["metadata"].get("namespace") for d in docs if d["metadata"].get("namespace")), None)
    runs = [d for d in docs if d["kind"] in ("Workflow", "CronWorkflow")]
    templates = [d for d in docs if d["kind"] == "WorkflowTemplate"]
    # The run's own object carries the parameters: the Workflow, or else the one template no
    # other template refers to (the entry; the rest are parts of a split pipeline).
    if runs:
        owner = runs[0]
        spec = owner["spec"].get("workflowSpec", owner["spec"]) \
            if owner["kind"] == "CronWorkflow" else owner["spec"]
    else:
        referenced = {ref for t in templates for ref in _template_refs(t)}
        entries = [t for t in templates if t["metadata"]["name"] not in referenced]
        owner = entries[0] if entries else templates[0]
        spec = owner["spec"]
    problem = check_parameters(given, declared_parameters(spec),
                               f"{owner['kind']} {_name_of(owner)}")
    if problem:
        return problem
    target = sender.target(namespace)
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            sender.ensure_core(_in_namespace(doc, target))
    for doc in templates:
        sender.apply(_in_namespace(doc, target))
    if not runs:
        sender.create(_in_namespace(template_run(owner, given), target))
    elif owner["kind"] == "CronWorkflow":
        body = _in_namespace(owner, target)
        body["spec"] = {**body["spec"], "workflowSpec": with_parameters(spec, given)}
        sender.create(body)
    else:
        body = _in_namespace(owner, target)
        body["spec"] = with_parameters(spec, given)
        sender.create(body)
    return None


def _name_of(doc: Mapping[str, Any]) -> str:
    meta = doc.get("metadata") or {}
    return str(meta.get("name") or meta.get("generateName", ""))


def _template_refs(doc: Mapping[str, Any]) -> set[str]:
    found: set[str] = set()

    def walk(value: object) -> None:
        if isinstance(value, dict):
            ref = value.get("templateRef")
            if isinstance(ref, dict) and "name" in ref:
                found.add(str(ref["name"]))
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(doc.get("spec"))
    return found


def _in_namespace(doc: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    out = dict(doc)
    out["metadata"] = {**doc["metadata"], "namespace": namespace}
    return out


# -- status and watch -------------------------------------------------------------------------


def interpret_workflow(cluster: Cluster, name: str, wf: Mapping[str, Any], *,
                       details: bool = True,
                       argo_namespace: str | None = None) -> run_status.RunReport:
    """The run's report; with ``details`` (not for many runs at once: `durapipe list`), also
    what the Workflow does not record: its JobSets' restarts where it has multi-node stages,
    and its pods where an attempt sits on a node without starting (the kubelet's reason); with
    ``argo_namespace``, why its cached stages missed (``read_caches``).  One call for each,
    and only where ``run_status.reads_for`` says it tells something."""
    reads = run_status.reads_for(wf) if details else run_status.Reads()
    jobsets: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    if reads.jobset_selector:
        try:
            jobsets = cluster.list_jobsets(reads.jobset_selector)
        except ClusterError:
            pass  # the report then says the restarts are not known (RBAC, or no JobSet CRD)
    if reads.pods:
        try:
            pods = cluster.pods(f"{LABEL_WORKFLOW}={name}")
        except ClusterError:
            pass  # without `list` of pods the report has Argo's message only
    caches = (read_caches(cluster, reads.caches, argo_namespace)
              if argo_namespace is not None else None)
    stopped: dict[str, str] = {}
    if reads.deleted_pods:
        try:
            stopped = {pod: message for pod, message in
                       cluster.pod_events(run_status.KUEUE_STOPPED).items()
                       if pod in reads.deleted_pods}
        except ClusterError:
            pass  # without `list` of events the report says "pod deleted", as Argo does
    try:
        return run_status.interpret(wf, jobsets, caches, pods, stopped)
    except run_status.MalformedWorkflow as exc:
        raise ClusterError(f"the API server at {cluster.server} returned a Workflow {name} "
                           f"that durapipe cannot read: {exc}") from None


def read_caches(cluster: Cluster, names: Iterable[str],
                argo_namespace: str) -> dict[str, object]:
    """The data of the memoization ConfigMaps ``names``: in the controller's namespace (where
    Argo v4.1.2 writes them), else the run's; one found in neither holds no entry yet (Argo
    creates a shard with its first entry); one that cannot be read (no `get` of configmaps
    there) is left out, and its misses say so."""
    caches: dict[str, object] = {}
    namespaces = list(dict.fromkeys((argo_namespace, cluster.namespace)))
    for name in sorted(names):
        missing = 0
        for namespace in namespaces:
            try:
                caches[name] = cluster.config_map_data(name, namespace)
                break
            except ClusterError as exc:
                missing += exc.status == 404
        else:
            if missing == len(namespaces):
                caches[name] = {}
    return caches


def status(args: argparse.Namespace) -> int:
    try:
        cluster = connect(args.kubeconfig, args.context, args.namespace)
        report = interpret_workflow(cluster, args.run, cluster.get("Workflow", args.run),
                                    argo_namespace=args.argo_namespace)
    except ClusterError as exc:
        return print_failure(str(exc))
    if args.json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        sys.stdout.write(run_status.render(report))
    return 0


class Display:
    """Progress of a run: a table redrawn in place on a terminal, else one line per change."""

    def __init__(self, out: TextIO, tty: bool) -> None:
        self.out, self.tty = out, tty
        self.lines: dict[str, str] = {}
        self.drawn = 0

    def show(self, report: run_status.RunReport) -> None:
        report = run_status.for_terminal(report)
        if self.tty:
            head = f"{report.name}: {report.phase}" + (
                f" ({report.progress})" if report.progress else "")
            lines = [head, *run_status.table(report)]
            if self.drawn:
                self.out.write(f"\x1b[{self.drawn}F\x1b[J")
            self.out.write("\n".join(lines) + "\n")
            self.drawn = len(lines)
        else:
            current = {"": f"{report.name}: {report.phase}"
                           + (f" ({report.progress})" if report.progress else "")}
            for s in report.stages:
                last = s.attempts[-1] if s.attempts else None
                current[s.stage] = (
                    f"{s.stage}: {s.phase}" + (" (cache hit)" if s.cache_hit else "")
                    + (f", attempt {len(s.attempts)} {last.verdict}"
                       + (f" on {last.memory}" if last.memory else "")
                       + (f" {last.gpu_type}" if last.gpu_type else "") if last else ""))
            for key, line in current.items():
                if self.lines.get(key) != line:
                    self.out.write(line + "\n")
            self.lines = current
        self.out.flush()


class Reconnect:
    """`watch`'s patience with a lost connection: a pause that doubles after each failure,
    each said on ``log``, until ``RECONNECT_GIVE_UP_S`` pass without a healthy watch."""

    def __init__(self, name: str, log: TextIO) -> None:
        self.name, self.log = name, log
        self.healthy_at = time.monotonic()
        self.pause = RECONNECT_FIRST_S
        self.failed = False

    def healthy(self) -> None:
        if self.failed:
            print(f"durapipe: watching Workflow {self.name} again", file=self.log, flush=True)
        self.healthy_at, self.pause, self.failed = time.monotonic(), RECONNECT_FIRST_S, False

    def wait(self, problem: ClusterError) -> None:
        """Sleep before the next try, or raise ``problem`` where it is no reason to retry."""
        waited = time.monotonic() - self.healthy_at
        if not problem.transient:
            raise problem
        if waited + self.pause > RECONNECT_GIVE_UP_S:
            raise ClusterError(f"{problem} (gave up reconnecting after {waited:.0f} s)")
        print(f"durapipe: lost the watch of Workflow {self.name}: "
              f"{run_status.printable(str(problem))}; reconnecting in {self.pause:g} s",
              file=self.log, flush=True)
        time.sleep(self.pause)
        self.pause = min(self.pause * 2, RECONNECT_MAX_S)
        self.failed = True


def _list_again(cluster: Cluster, name: str, reconnect: Reconnect) -> dict[str, Any]:
    while True:
        try:
            return cluster.get("Workflow", name)
        except ClusterError as exc:
            reconnect.wait(exc)


def follow(cluster: Cluster, name: str, display: Display, sleep: float = 1.0,
           log: TextIO | None = None) -> run_status.RunReport:
    """Show the run until it ends, renewing the watch when the server closes it, listing
    again when its resource version expired, and reconnecting after a transient failure."""
    wf = cluster.get("Workflow", name)
    reconnect = Reconnect(name, log or sys.stderr)
    while True:
        report = interpret_workflow(cluster, name, wf)
        display.show(report)
        if report.done:
            return report
        try:
            for kind, obj in cluster.watch_workflow(name, resource_version(wf), WATCH_TIMEOUT_S):
                reconnect.healthy()
                if kind == "BOOKMARK":  # the next list gives a newer version anyway
                    continue
                if kind == "DELETED":
                    raise ClusterError(f"Workflow {name} was deleted while being watched")
                wf = obj
                report = interpret_workflow(cluster, name, wf)
                display.show(report)
                if report.done:
                    return report
            reconnect.healthy()
            time.sleep(sleep)
        except Expired:
            pass
        except ClusterError as exc:
            reconnect.wait(exc)
        wf = _list_again(cluster, name, reconnect)


def watch(args: argparse.Namespace) -> int:
    try:
        cluster = connect(args.kubeconfig, args.context, args.namespace)
        report = follow(cluster, args.run, Display(sys.stdout, sys.stdout.isatty()))
    except ClusterError as exc:
        return print_failure(str(exc))
    if not sys.stdout.isatty():
        sys.stdout.write("\n" + run_status.render(report))
    return run_status.EXIT_CODES.get(report.phase, 2)


__all__ = ["add_status_arguments", "add_submit_arguments", "follow", "status", "submit", "watch"]
