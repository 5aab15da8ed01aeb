"""The ``durapipe`` command line: check, fmt, explain, compile, run, bound, graph, submit,
status, watch, doctor, and the day-two commands on runs (list, stop, terminate, delete,
resubmit, logs).

Each command imports what it needs when it runs, so ``durapipe check`` pays for the compiler
only on a file the front end accepts (to find what the lowering refuses) and ``--help`` pays for
nothing.  Exit codes: 0 clean, 1 diagnostics with errors (or
stale files under ``--check``), 2 usage errors.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from durapipe import __version__
from durapipe.files import expand_pipeline_inputs, write_atomic

if TYPE_CHECKING:
    from durapipe.dsl.diagnostics import Diagnostic
    from durapipe.dsl.load import LoadResult
    from durapipe.dsl.model import Pipeline
    from durapipe.dsl.source import SourceMap


def _color(stream: object) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)()) and "NO_COLOR" not in os.environ


def cmd_check(args: argparse.Namespace) -> int:
    from durapipe.dsl import diagnostics as dg

    files = expand_pipeline_inputs(args.files, builders=True)
    if files is None:
        return 2
    everything: list[dg.Diagnostic] = []
    for path in files:
        everything += _diagnose(path)[1]
    return _report(everything, len(files), args.format, args.warnings)


def _diagnose(path: str) -> tuple[LoadResult, list[Diagnostic]]:
    """Everything ``check`` says about one file: the front end's diagnostics, then, for a file
    it accepts, what the lowering refuses.  ``run`` asks the same, so it refuses what ``check``
    and ``compile`` refuse."""
    from durapipe.dsl import load_path

    loaded = load_path(path)
    found = list(loaded.diagnostics)
    if loaded.pipeline is not None and loaded.ok:
        found += _lowering_errors(path, loaded.pipeline, loaded.source_map)
    return loaded, found


def _report(everything: list[Diagnostic], files: int, fmt: str, warnings: bool) -> int:
    """Print diagnostics and the ``N errors in M files`` line; the exit code of ``check``."""
    from durapipe.dsl import diagnostics as dg

    shown = everything if warnings else [d for d in everything if d.is_error]
    if fmt == "json":
        print(dg.render(shown, "json"))
    elif shown:
        print(dg.render(shown, fmt, _color(sys.stderr)), file=sys.stderr)
    errors = sum(d.is_error for d in everything)
    if fmt != "json":
        summary = (f"{errors} error{'s' * (errors != 1)} in {files} file{'s' * (files != 1)}"
                   if errors else f"{files} file{'s' * (files != 1)} ok")
        print(("\n" if shown else "") + summary, file=sys.stderr)
    return 1 if errors else 0


def _lowering_errors(path: str, pipeline: Pipeline, source_map: SourceMap) -> list[Diagnostic]:
    """What ``durapipe compile`` (default options) would refuse in a file the front end
    accepts: generated names that collide (P0402), GPU requests or multi-node settings Argo
    cannot carry.  These rules need the lowering's own names and plan, so ``check`` runs it
    rather than restating them, and ``check`` and ``compile`` cannot disagree."""
    from durapipe.compiler import CompileOptions, compile_pipeline
    from durapipe.compiler.cli import display_path

    result = compile_pipeline(pipeline, CompileOptions(
        source_map=source_map, source_path=display_path(path)))
    return [d for d in result.diagnostics if d.is_error]


def cmd_fmt(args: argparse.Namespace) -> int:
    import difflib

    from durapipe.dsl import diagnostics as dg
    from durapipe.dsl.fmt import FormatterError, format_source
    from durapipe.dsl.load import read_source

    files = expand_pipeline_inputs(args.files, builders=False)
    if files is None:
        return 2
    if "-" in files and len(files) > 1:
        print("durapipe fmt: - (standard input) formats one source alone", file=sys.stderr)
        return 2
    status = 0
    for path in files:
        if path == "-":
            return _fmt_stdin(args.check)
        source, problems = read_source(path)
        if source is None:
            print(dg.render(problems, "human", _color(sys.stderr)), file=sys.stderr)
            status = 1
            continue
        try:
            formatted, problems = format_source(source.text, source.path)
        except FormatterError as exc:  # the formatter refused to change meaning: a bug
            print(f"durapipe fmt: {path} left unchanged: {exc}", file=sys.stderr)
            status = max(status, 2)
            continue
        if formatted is None:
            print(dg.render(problems, "human", _color(sys.stderr)), file=sys.stderr)
            status = 1
            continue
        if formatted == source.text:
            continue
        if args.check:
            diff = difflib.unified_diff(source.text.splitlines(True), formatted.splitlines(True),
                                        f"{path} (current)", f"{path} (formatted)")
            sys.stdout.writelines(diff)
            print(f"{path} is not formatted", file=sys.stderr)
            status = 1
            continue
        write_atomic(path, formatted)
        print(f"formatted {path}", file=sys.stderr)
    return status


def _fmt_stdin(check: bool) -> int:
    """``fmt -``: standard input formatted to standard output (what editors pipe through);
    with ``--check``, nothing printed but the diff, exit 1 if it would change."""
    import difflib

    from durapipe.dsl import diagnostics as dg
    from durapipe.dsl.fmt import FormatterError, format_source
    from durapipe.dsl.source import MAX_SOURCE_BYTES

    raw = sys.stdin.buffer.read(MAX_SOURCE_BYTES + 1)
    if len(raw) > MAX_SOURCE_BYTES:
        print(f"durapipe fmt: standard input is over {MAX_SOURCE_BYTES:,} bytes (P0003)",
              file=sys.stderr)
        return 1
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        print(f"durapipe fmt: standard input is not UTF-8 text (invalid byte at offset "
              f"{exc.start}) (P0002)", file=sys.stderr)
        return 1
    try:
        formatted, problems = format_source(text, "<stdin>")
    except FormatterError as exc:
        print(f"durapipe fmt: standard input left unchanged: {exc}", file=sys.stderr)
        sys.stdout.write(text)
        return 2
    if formatted is None:
        print(dg.render(problems, "human", _color(sys.stderr)), file=sys.stderr)
        return 1
    if check:
        if formatted == text:
            return 0
        sys.stdout.writelines(difflib.unified_diff(text.splitlines(True),
                                                   formatted.splitlines(True),
                                                   "<stdin> (current)", "<stdin> (formatted)"))
        return 1
    sys.stdout.write(formatted)
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from durapipe.dsl import codes
    from durapipe.dsl.diagnostics import did_you_mean

    if args.code is None:  # every code, a line each: what `explain CODE` then tells
        width = max(len(c) for c in codes.CODES)
        for entry in codes.CODES.values():
            print(f"{entry.code:<{width}}  {entry.title}")
        return 0
    code = args.code.upper()
    if code not in codes.CODES:
        hint = did_you_mean(code, codes.CODES)
        print(f"durapipe: unknown diagnostic code {args.code!r}" + (f"; {hint}" if hint else ""),
              file=sys.stderr)
        return 2
    entry = codes.CODES[code]
    print(f"{entry.code}: {entry.title}\n\n{entry.explanation}")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from durapipe.compiler import cli as compiler_cli

    return compiler_cli.run(args)


def cmd_run(args: argparse.Namespace) -> int:
    from durapipe.runner import cli as runner_cli

    # The runner imports no Argo lowering, so the lowering's checks are asked here, above both
    # executors: a file `check` refuses is refused with the same words, and nothing starts.
    loaded, found = _diagnose(args.file)
    if loaded.pipeline is None or any(d.is_error for d in found):
        return _report(found, 1, "human", warnings=True)
    return runner_cli.run(args, loaded.pipeline)


def cmd_runs(args: argparse.Namespace) -> int:
    from durapipe.runner import cli as runner_cli

    return runner_cli.runs(args)


def cmd_cluster(args: argparse.Namespace) -> int:
    from durapipe.cluster import submit

    command: int = getattr(submit, args.command)(args)
    return command


def cmd_operate(args: argparse.Namespace) -> int:
    from durapipe.cluster import operate

    command: int = getattr(operate, _OPERATIONS[args.command])(args)
    return command


#: Each day-two command and its function in durapipe.cluster.operate.
_OPERATIONS = {"list": "list_runs", "stop": "stop", "terminate": "terminate",
               "delete": "delete", "resubmit": "resubmit", "logs": "logs"}


def cmd_doctor(args: argparse.Namespace) -> int:
    from durapipe.cluster import doctor

    return doctor.doctor(args)


def cmd_lsp(args: argparse.Namespace) -> int:
    try:
        from durapipe.lsp import server
    except ImportError as exc:  # the optional extra is not installed
        from durapipe.extras import install_hint

        print(f"durapipe lsp needs the `lsp` extra ({exc.name} is missing): "
              f"{install_hint('lsp')}", file=sys.stderr)
        return 2
    return server.main()


def cmd_checkpoints(args: argparse.Namespace) -> int:
    from durapipe.runtime import linegc

    protection = partial(_unfinished_runs, args) if args.protect_unfinished_runs else None
    code = linegc.run(args.action, args.uri, max_age=args.max_age, apply=args.apply,
                      as_json=args.json, protection=protection)
    return 2 if code == 64 else code


def _unfinished_runs(args: argparse.Namespace) -> Any:
    """``checkpoints gc --protect-unfinished-runs``: the unfinished Workflows of the
    kubeconfig's namespace (or ``-n``), as the in-cluster collector reads them."""
    from durapipe.cluster.api import ClusterError, connect
    from durapipe.runtime import contract, linegc
    from durapipe.runtime.errors import CheckpointError

    try:
        cluster = connect(args.kubeconfig, args.context, args.namespace)
        workflows = cluster.list_objects(
            "Workflow", f"{contract.WORKFLOW_COMPLETED_LABEL}!=true")
    except ClusterError as error:
        raise CheckpointError(f"cannot tell which runs have not finished, so removes nothing: "
                              f"{error}") from None
    return linegc.protection_from_workflows(
        workflows, f"the unfinished Workflows of namespace {cluster.namespace}")


def cmd_bound(args: argparse.Namespace) -> int:
    import json

    from durapipe.dsl import diagnostics as dg
    from durapipe.plan import bound, bound_render

    loaded, found = _diagnose(args.file)
    if loaded.pipeline is None or any(d.is_error for d in found):
        return _report(found, 1, "human", warnings=True)
    prices = bound.Prices.of(loaded.pipeline)  # the pipeline's own over the defaults
    if args.prices is not None:
        try:
            with open(args.prices, encoding="utf-8") as handle:
                parsed = bound.parse_prices(json.load(handle), prices)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            parsed = f"cannot read it: {exc}"
        if isinstance(parsed, str):
            problem = dg.error("P0353", f"invalid price file {args.prices}: {parsed}", None,
                               help='a JSON object such as {"gpu": {"H100": 4.1}, '
                                    '"cpu_hour": 0.04, "memory_gib_hour": 0.005}')
            return _report([problem], 1, "human", warnings=True)
        prices = parsed
    result = bound.pipeline_bound(loaded.pipeline, prices)
    print(bound_render.to_json(result, prices) if args.json else bound_render.table(result),
          end="")
    problems = bound_render.unbounded_diagnostics(loaded.pipeline, result, loaded.source_map)
    if problems:
        return _report(problems, 1, "human", warnings=True)
    return 0


def cmd_graph(args: argparse.Namespace) -> int:
    from durapipe.diagram import cli as diagram_cli

    return diagram_cli.run(args)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; ``command`` names the subcommand about to run, if known.

    argparse reads only the chosen subcommand's arguments, so the compiler's and the runner's
    are added only when one of them is chosen (or none is known yet): `durapipe check` does not
    import the compiler just to describe `compile`.
    """
    parser = argparse.ArgumentParser(
        prog="durapipe",
        description="Durable ML training pipelines: check and format .pipe files, "
                    "compile them to Argo Workflows.")
    parser.add_argument("--version", action="version", version=f"durapipe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    check = sub.add_parser("check", help="check pipelines and report every diagnostic",
                           description="Check .pipe files (or builder .py modules); exit 1 on "
                                       "errors.")
    check.add_argument("files", nargs="+", metavar="FILE",
                       help="a .pipe file, a builder .py, or a directory (its .pipe files and "
                            "the .py files that import durapipe.dsl)")
    check.add_argument("--format", choices=("human", "short", "json"), default="human",
                       help="human (default), short (one line each) or json (for tools)")
    check.add_argument("--no-warnings", dest="warnings", action="store_false",
                       help="show errors only")
    check.set_defaults(func=cmd_check)

    fmt = sub.add_parser("fmt", help="rewrite .pipe files in the canonical layout",
                         description="Format .pipe files in place; comments are kept.")
    fmt.add_argument("files", nargs="+", metavar="FILE",
                     help="a .pipe file, a directory (its .pipe files), or - to format "
                          "standard input to standard output")
    fmt.add_argument("--check", action="store_true",
                     help="change nothing; print a diff and exit 1 if a file is not formatted")
    fmt.set_defaults(func=cmd_fmt)

    explain = sub.add_parser("explain", help="explain a diagnostic code",
                             description="Print the long explanation of a code such as P0101; "
                                         "without CODE, list every code with its title.")
    explain.add_argument("code", metavar="CODE", nargs="?")
    explain.set_defaults(func=cmd_explain)

    compile_ = sub.add_parser("compile", help="compile pipelines to Argo Workflows YAML",
                              description="Compile .pipe files or builder .py modules to Argo "
                                          "Workflows YAML for GitOps.")
    if command in (None, "compile"):
        from durapipe.compiler import cli as compiler_cli

        compiler_cli.add_arguments(compile_)
    compile_.set_defaults(func=cmd_compile)

    run = sub.add_parser("run", help="run a pipeline on this machine with the same durability",
                         description="Run a pipeline locally: stages as processes through the "
                                     "runtime wrapper, real memory limits where the machine "
                                     "allows, the same retries, OOM ladder, caching and "
                                     "checkpoint resume as the compiled workflow.")
    runs = sub.add_parser("runs", help="list past local runs",
                          description="List runs recorded under .durapipe/runs.")
    if command in (None, "run", "runs"):
        from durapipe.runner import cli as runner_cli

        runner_cli.add_run_arguments(run)
        runner_cli.add_runs_arguments(runs)
    run.set_defaults(func=cmd_run)
    runs.set_defaults(func=cmd_runs)

    bound_ = sub.add_parser("bound", help="worst-case wall time, GPU-hours and cost of a pipeline",
                            description="Print each stage's and the pipeline's worst case (every "
                                        "retry budget spent, every attempt to its timeout) and "
                                        "best case: wall time, GPU-hours, node-hours, cost.")
    bound_.add_argument("file", metavar="FILE")
    bound_.add_argument("--json", action="store_true", help="print JSON (for tools)")
    bound_.add_argument("--prices", metavar="FILE",
                        help='JSON price overrides: {"gpu": {"H100": 4.1}, "cpu_hour": 0.04, '
                             '"memory_gib_hour": 0.005} (US dollars per hour), over the '
                             "pipeline's own `prices` and the defaults")
    bound_.set_defaults(func=cmd_bound)

    checkpoints = sub.add_parser(
        "checkpoints", help="list or collect checkpoint lines in a store",
        description="List the checkpoint lines under a store URI (the pipeline's `storage`, "
                    "or any prefix of it), or collect those whose newest commit is older than "
                    "--max-age. gc is a dry run unless --apply is given; a line with a live "
                    "writer is never touched.")
    checkpoints.add_argument("action", choices=("list", "gc"))
    checkpoints.add_argument("uri", metavar="STORE_URI",
                             help="s3://bucket/prefix, file:///path or a path")
    checkpoints.add_argument("--max-age", metavar="AGE", default="14d",
                             help="gc: collect lines whose newest commit is older (default 14d)")
    checkpoints.add_argument("--apply", action="store_true",
                             help="gc: remove them (without it, only say what would go)")
    checkpoints.add_argument("--json", action="store_true", help="print JSON (for tools)")
    checkpoints.add_argument("--protect-unfinished-runs", action="store_true",
                             help="gc: keep every line a Workflow that has not finished has "
                                  "claimed or resumes from (read from the cluster; nothing is "
                                  "removed when it cannot be read)")
    if command in (None, "checkpoints"):
        from durapipe.cluster.arguments import add_connection_arguments

        add_connection_arguments(checkpoints)
    checkpoints.set_defaults(func=cmd_checkpoints)

    graph = sub.add_parser("graph", help="draw the stage DAG (Mermaid, Graphviz dot, SVG)",
                           description="Print the stage DAG of a pipeline, each stage labelled "
                                       "with its retry budgets, memory rungs, GPU types and "
                                       "cache state.")
    graph.add_argument("file", metavar="FILE")
    graph.add_argument("--format", choices=("mermaid", "dot", "svg"), default="mermaid",
                       help="mermaid (default; renders in GitHub and GitLab), dot, or svg "
                            "(through Graphviz `dot`, where installed)")
    graph.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    graph.set_defaults(func=cmd_graph)

    submit_ = sub.add_parser("submit", help="submit a pipeline or start a WorkflowTemplate run",
                             description="Submit a compiled pipeline (a .pipe or builder .py is "
                                         "compiled first) or start a run of a WorkflowTemplate "
                                         "on the cluster; print the run's name. Needs the "
                                         "`cluster` extra.")
    status = sub.add_parser("status", help="each stage of a run: attempts, budgets, verdicts",
                            description="Show a run's stages as durapipe sees them: attempts "
                                        "used of each retry budget, the memory rung and GPU "
                                        "type that ran, cache hits, and each failed attempt's "
                                        "verdict. Needs the `cluster` extra.")
    watch = sub.add_parser("watch", help="follow a run live until it ends",
                           description="Follow a run with a progress display; exit 0 when it "
                                       "Succeeded, 1 Failed, 2 Error. Needs the `cluster` "
                                       "extra.")
    if command in (None, "submit", "status", "watch"):
        from durapipe.cluster import submit as submit_cli

        submit_cli.add_submit_arguments(submit_)
        submit_cli.add_status_arguments(status)
        submit_cli.add_status_arguments(watch, watch=True)
    for parser_ in (submit_, status, watch):
        parser_.set_defaults(func=cmd_cluster)

    helps = {
        "list": ("list a pipeline's runs: phase, duration, stages",
                 "List the runs (Workflows) of a pipeline, newest first, with each run's "
                 "phase, duration and how its stages ended. Needs the `cluster` extra."),
        "stop": ("stop a run; its exit handlers still run",
                 "Set Argo's spec.shutdown=Stop on the run: no new stage starts, running "
                 "pods are stopped, exit handlers run. Needs the `cluster` extra."),
        "terminate": ("terminate a run at once, without exit handlers",
                      "Set Argo's spec.shutdown=Terminate on the run: no new stage starts, "
                      "running pods are stopped, no exit handler runs. Needs the `cluster` "
                      "extra."),
        "delete": ("delete a run and its pods",
                   "Delete the run's Workflow (its pods go with it). Needs the `cluster` "
                   "extra."),
        "resubmit": ("start a new run with the same parameters, reusing cached stages",
                     "Create a new Workflow from a run's spec and arguments; stages that "
                     "succeeded before are memoization cache hits. Needs the `cluster` "
                     "extra."),
        "logs": ("print a stage attempt's log",
                 "Print the user container's log of a stage's attempt (the latest unless "
                 "--attempt N), the runtime's verdict line as a sentence. Needs the `cluster` "
                 "extra."),
    }
    for name, (short, long) in helps.items():
        operation = sub.add_parser(name, help=short, description=long)
        if command in (None, name):
            from durapipe.cluster import operate as operate_cli

            if name == "list":
                operate_cli.add_list_arguments(operation)
            elif name == "logs":
                operate_cli.add_logs_arguments(operation)
            else:
                operate_cli.add_run_arguments(operation)
        operation.set_defaults(func=cmd_operate)

    doctor = sub.add_parser("doctor", help="check that a cluster has what pipelines need",
                            description="Check the cluster (and, given FILE, what that "
                                        "pipeline needs): Argo's CRDs and version, the "
                                        "controller's memoization RBAC, the artifact "
                                        "repository, the runtime ConfigMap, the pipeline's "
                                        "service account and RBAC, JobSet where used. One line "
                                        "per check, a fix for each failure; exit 1 on any "
                                        "failure. Needs the `cluster` extra.")
    if command in (None, "doctor"):
        from durapipe.cluster import doctor as doctor_cli

        doctor_cli.add_arguments(doctor)
    doctor.set_defaults(func=cmd_doctor)

    lsp = sub.add_parser("lsp", help="run the language server (for editors), over stdio",
                         description="Language Server Protocol server for .pipe files: "
                                     "diagnostics, completion, hover, go-to-definition, "
                                     "references, outline, formatting and quick fixes. "
                                     "Needs the `lsp` extra.")
    lsp.add_argument("--stdio", action="store_true", help="talk over stdin/stdout (the default)")
    lsp.set_defaults(func=cmd_lsp)

    completion = sub.add_parser(
        "completion", help="print a shell completion script (bash, zsh, fish)",
        description="Print a completion script for every command and option: "
                    "`source <(durapipe completion bash)` (or zsh) in the shell's rc file, "
                    "`durapipe completion fish | source` for fish.")
    completion.add_argument("shell", choices=("bash", "zsh", "fish"))
    completion.set_defaults(func=cmd_completion)
    return parser


def cmd_completion(args: argparse.Namespace) -> int:
    from durapipe.completion import script

    # Every command's options, so the parser of every command (not only this one's).
    sys.stdout.write(script(args.shell, build_parser(None)))
    return 0


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line: the first argument that is not an option."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_command_of(argv))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug in durapipe, not in the user's input
        if os.environ.get("DURAPIPE_DEBUG"):
            raise
        print(f"durapipe: internal error: {type(exc).__name__}: {exc}\n"
              "This is a bug in durapipe; rerun with DURAPIPE_DEBUG=1 for a traceback and "
              "report it.", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
