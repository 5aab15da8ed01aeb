"""Day-two commands on runs: ``durapipe list``, ``stop``, ``terminate``, ``delete``,
``resubmit`` and ``logs``.

Only the Kubernetes API, never the Argo Server: a run is a Workflow object, stopping it is
Argo's ``spec.shutdown`` set by a JSON merge patch (both start no new stage and stop the
running pods; ``Stop`` then runs the exit handlers, ``Terminate`` does not), and a stage's log is its attempt's pod's ``main``
container log, the pod found from the Workflow's own node tree (``run_status.stage_pods``).

Failures are one line on stderr and exit 1 (``submit.print_failure``); usage errors exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

from durapipe.cluster import run_status
from durapipe.cluster.api import Cluster, ClusterError, connect
from durapipe.cluster.arguments import add_connection_arguments
from durapipe.cluster.submit import LABEL_WORKFLOW, interpret_workflow, print_failure
from durapipe.compiler.argo_pod import LABEL_PIPELINE
from durapipe.runtime import contract

LABEL_TEMPLATE = "workflows.argoproj.io/workflow-template"
LABEL_RESUBMITTED_FROM = "durapipe.dev/resubmitted-from"
#: The container Argo names a container template's own: the stage's program, through the
#: runtime wrapper (the others are Argo's init and wait sidecars).
USER_CONTAINER = "main"
#: Labels the controller sets on a run it owns; a resubmission gets its own.
_CONTROLLER_LABELS = ("workflows.argoproj.io/completed", "workflows.argoproj.io/phase",
                      "workflows.argoproj.io/workflow-archiving-status",
                      "workflows.argoproj.io/resubmitted-from-workflow")


# -- arguments --------------------------------------------------------------------------------


def add_list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pipeline", metavar="PIPELINE_OR_FILE",
                        help="the pipeline's name, or a .pipe/.py/.yaml file that defines it")
    parser.add_argument("--json", action="store_true", help="print the runs as JSON")
    add_connection_arguments(parser)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="the Workflow's name")
    add_connection_arguments(parser)


def add_logs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="the Workflow's name")
    parser.add_argument("stage", nargs="?", metavar="STAGE",
                        help="the stage (may be left out where the run has one stage)")
    parser.add_argument("--attempt", type=int, metavar="N",
                        help="the stage's Nth attempt, from 1 (default: the latest)")
    parser.add_argument("-f", "--follow", action="store_true",
                        help="keep printing while the attempt runs")
    add_connection_arguments(parser)


# -- helpers ----------------------------------------------------------------------------------


def _get_run(cluster: Cluster, name: str) -> dict[str, Any]:
    try:
        return cluster.get("Workflow", name)
    except ClusterError as exc:
        if exc.status == 404:
            raise ClusterError(
                f"no run {name} in namespace {cluster.namespace}; `durapipe list PIPELINE "
                f"-n {cluster.namespace}` lists a pipeline's runs", status=404) from None
        raise


def _time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


def duration(started_at: str, finished_at: str, now: datetime | None = None) -> str:
    """``1h02m``, ``4m05s``, ``12s``: from start to end (or to ``now`` while it runs)."""
    start = _time(started_at)
    if start is None:
        return "-"
    end = _time(finished_at) or now or datetime.now(timezone.utc)
    seconds = max(int((end - start).total_seconds()), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def stage_summary(report: run_status.RunReport) -> str:
    """``4/5 succeeded, 1 failed``: how many stages ended how."""
    total = len(report.stages)
    counts: dict[str, int] = {}
    for stage in report.stages:
        phase = "cached" if stage.cache_hit else stage.phase.lower() or "pending"
        counts[phase] = counts.get(phase, 0) + 1
    done = counts.pop("succeeded", 0) + counts.get("cached", 0)
    parts = [f"{done}/{total} succeeded"] + [
        f"{n} {phase}" for phase, n in sorted(counts.items())]
    return ", ".join(parts)


# -- list -------------------------------------------------------------------------------------


def _pipeline_of(target: str, namespace: str | None) -> tuple[str, str | None] | int:
    """(pipeline name, namespace it declares) of a file, or of a name as given."""
    import os

    if not (os.path.isfile(target) and target.endswith((".pipe", ".py", ".yaml", ".yml",
                                                        ".json"))):
        return target, namespace
    from durapipe.cluster.submit import load_documents

    docs = load_documents(target, argparse.Namespace())
    if isinstance(docs, int):
        return docs
    for doc in docs:
        if doc.get("kind") == "ConfigMap":
            continue
        meta = doc.get("metadata") or {}
        name = (meta.get("labels") or {}).get(LABEL_PIPELINE) or meta.get("name")
        if name:
            return str(name), namespace or meta.get("namespace")
    return print_failure(f"{target} names no pipeline")


def runs_of(cluster: Cluster, pipeline: str) -> list[dict[str, Any]]:
    """The pipeline's Workflows, newest first: those it compiled to (labelled with the
    pipeline) and those started from its WorkflowTemplate (labelled by Argo)."""
    found: dict[str, dict[str, Any]] = {}
    for selector in (f"{LABEL_PIPELINE}={pipeline}", f"{LABEL_TEMPLATE}={pipeline}"):
        for wf in cluster.list_objects("Workflow", selector):
            found.setdefault(str((wf.get("metadata") or {}).get("name", "")), wf)

    def started(wf: Mapping[str, Any]) -> tuple[str, str]:
        meta = wf.get("metadata") or {}
        return (str((wf.get("status") or {}).get("startedAt")
                    or meta.get("creationTimestamp") or ""), str(meta.get("name", "")))

    return sorted(found.values(), key=started, reverse=True)


def list_runs(args: argparse.Namespace) -> int:
    target = _pipeline_of(args.pipeline, args.namespace)
    if isinstance(target, int):
        return target
    pipeline, namespace = target
    try:
        cluster = connect(args.kubeconfig, args.context, namespace)
        reports = [interpret_workflow(cluster, str(wf["metadata"].get("name")), wf,
                                      details=False)
                   for wf in runs_of(cluster, pipeline)]
    except ClusterError as exc:
        return print_failure(str(exc))
    if args.json:
        print(json.dumps([{"name": r.name, "phase": r.phase, "started_at": r.started_at,
                           "finished_at": r.finished_at,
                           "duration": duration(r.started_at, r.finished_at),
                           "stages": {s.stage: "cached" if s.cache_hit else s.phase
                                      for s in r.stages}}
                          for r in reports], indent=2, sort_keys=True))
        return 0
    if not reports:
        print(f"durapipe: no runs of pipeline {run_status.printable(pipeline)} in namespace "
              f"{cluster.namespace}", file=sys.stderr)
        return 0
    rows = [("NAME", "PHASE", "STARTED", "DURATION", "STAGES")]
    for r in map(run_status.for_terminal, reports):
        rows.append((r.name, r.phase, r.started_at or "-",
                     duration(r.started_at, r.finished_at), stage_summary(r)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    return 0


# -- stop, terminate, delete, resubmit --------------------------------------------------------


def _shutdown(args: argparse.Namespace, how: str) -> int:
    try:
        cluster = connect(args.kubeconfig, args.context, args.namespace)
        wf = _get_run(cluster, args.run)
        phase = str((wf.get("status") or {}).get("phase") or "Pending")
        if phase in ("Succeeded", "Failed", "Error"):
            return print_failure(f"run {args.run} already ended ({phase}); nothing to "
                         f"{how.lower()}")
        cluster.merge_patch("Workflow", args.run, {"spec": {"shutdown": how}},
                            what=f"{how.lower()} Workflow {args.run}")
    except ClusterError as exc:
        return print_failure(str(exc))
    effect = ("no new stage starts, running ones are stopped, exit handlers run"
              if how == "Stop" else "no new stage starts, running ones are stopped, no exit "
              "handler runs")
    print(f"{args.run}: {how.lower()} requested ({effect})")
    return 0


def stop(args: argparse.Namespace) -> int:
    return _shutdown(args, "Stop")


def terminate(args: argparse.Namespace) -> int:
    return _shutdown(args, "Terminate")


def delete(args: argparse.Namespace) -> int:
    try:
        cluster = connect(args.kubeconfig, args.context, args.namespace)
        _get_run(cluster, args.run)
        cluster.delete("Workflow", args.run)
    except ClusterError as exc:
        return print_failure(str(exc))
    print(f"{args.run}: deleted")
    return 0


def resubmission(wf: Mapping[str, Any]) -> dict[str, Any]:
    """A new Workflow with the old one's spec and arguments: its stages' memoization keys are
    the same, so stages that succeeded are cache hits."""
    meta = wf.get("metadata") or {}
    name = str(meta.get("name", ""))
    generate = str(meta.get("generateName") or f"{name}-")
    labels = {k: v for k, v in (meta.get("labels") or {}).items()
              if k not in _CONTROLLER_LABELS}
    labels[LABEL_RESUBMITTED_FROM] = name
    spec = {k: v for k, v in (wf.get("spec") or {}).items() if k not in ("shutdown", "suspend")}
    body: dict[str, Any] = {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
        "metadata": {"generateName": generate, "labels": labels}, "spec": spec}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                   if not k.startswith("workflows.argoproj.io/")
                   and k != "kubectl.kubernetes.io/last-applied-configuration"}
    if annotations:
        body["metadata"]["annotations"] = annotations
    return body


def resubmit(args: argparse.Namespace) -> int:
    try:
        cluster = connect(args.kubeconfig, args.context, args.namespace)
        wf = _get_run(cluster, args.run)
        created = cluster.create(resubmission(wf))
    except ClusterError as exc:
        return print_failure(str(exc))
    print(created["metadata"]["name"])
    return 0


# -- logs -------------------------------------------------------------------------------------


def render_log_line(line: str) -> str:
    """A log line as shown: the wrapper's verdict line as a sentence, the rest as it is (with
    control characters escaped, since the workload wrote it)."""
    from durapipe.runtime.verdict import parse_verdict_line

    at = line.find(contract.VERDICT_TAG)
    if at >= 0:
        try:
            verdict, details = parse_verdict_line(line[at:])
        except ValueError:
            verdict, details = "", {}
        if verdict in contract.VERDICTS:
            said = [f"durapipe: attempt ended: {verdict}"]
            reason = details.get("reason") or details.get("exception")
            if reason:
                said.append(f"({run_status.printable(str(reason))})")
            if details.get("exit_code") not in (None, ""):
                said.append(f"exit {details['exit_code']}")
            return run_status.printable(line[:at]) + " ".join(said)
    return run_status.printable(line)


def _choose_attempt(run: str, stages: Mapping[str, list[Any]], stage: str | None,
                    attempt: int | None) -> Mapping[str, Any] | str:
    """The pod node of the asked attempt, or the message why there is none."""
    from durapipe.dsl.diagnostics import did_you_mean

    with_pods = [s for s, nodes in stages.items() if nodes]
    if stage is None:
        if len(stages) == 1:
            stage = next(iter(stages))
        else:
            return (f"run {run} has {len(stages)} stages; name one: "
                    f"durapipe logs {run} STAGE (stages: {', '.join(stages) or 'none'})")
    if stage not in stages:
        hint = did_you_mean(stage, list(stages))
        return (f"run {run} has no stage {stage!r}" + (f"; {hint}" if hint else "")
                + f" (stages: {', '.join(stages) or 'none'})")
    nodes = stages[stage]
    if not nodes:
        return (f"stage {stage} of run {run} has not started an attempt yet"
                + (" (it was a cache hit, or has not been reached)" if stage not in with_pods
                   else ""))
    if attempt is None:
        return nodes[-1]  # type: ignore[no-any-return]
    if not 1 <= attempt <= len(nodes):
        return f"stage {stage} of run {run} has {len(nodes)} attempt{'s' * (len(nodes) != 1)}; " \
               f"--attempt takes 1 to {len(nodes)}"
    return nodes[attempt - 1]  # type: ignore[no-any-return]


def logs(args: argparse.Namespace) -> int:
    if args.attempt is not None and args.attempt < 1:
        print("durapipe logs: --attempt counts from 1", file=sys.stderr)
        return 2
    try:
        cluster = connect(args.kubeconfig, args.context, args.namespace)
        wf = _get_run(cluster, args.run)
        try:
            stages = run_status.stage_pods(wf)
        except run_status.MalformedWorkflow as exc:
            return print_failure(f"the API server at {cluster.server} returned a Workflow {args.run} "
                         f"that durapipe cannot read: {exc}")
        chosen = _choose_attempt(args.run, stages, args.stage, args.attempt)
        if isinstance(chosen, str):
            return print_failure(chosen)
        pod = run_status.pod_of(chosen, cluster.pods(f"{LABEL_WORKFLOW}={args.run}"))
        if pod is None:
            return print_failure(f"the pod of {chosen.get('displayName') or chosen.get('name')} is "
                         f"gone (Argo's pod GC deleted it, or the node never got one); its "
                         "log is only in the artifact repository, if archived")
        if args.follow:
            for line in cluster.follow_pod_log(pod, USER_CONTAINER):
                print(render_log_line(line), flush=True)
        else:
            text = cluster.pod_log(pod, USER_CONTAINER)
            for line in text.splitlines():
                print(render_log_line(line))
    except ClusterError as exc:
        return print_failure(str(exc))
    return 0


__all__ = ["add_list_arguments", "add_logs_arguments", "add_run_arguments", "delete",
           "duration", "list_runs", "logs", "render_log_line", "resubmission",
           "resubmit", "runs_of", "stage_summary", "stop", "terminate"]
