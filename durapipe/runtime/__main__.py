"""Command line of the in-pod runtime (also the zipapp's entry point).

python -m durapipe.runtime exec [--grace-seconds S] [--termination-log PATH] -- CMD...
python -m durapipe.runtime hash PATH...
python -m durapipe.runtime cache-key RECORD.json|-
python -m durapipe.runtime agent --spool DIR [--uri URI]
python -m durapipe.runtime preflight [--uri URI]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from durapipe.runtime import contract


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(message)


def _grace_seconds(text: str) -> float:
    try:
        return contract.parse_grace_seconds(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m durapipe.runtime", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="subcommand", required=True)

    run = commands.add_parser("exec", help="run a stage command and report its verdict")
    run.add_argument("--grace-seconds", type=_grace_seconds, default=None)
    run.add_argument("--termination-log", default=None)
    run.add_argument("--output-hash-dir", default=None)
    run.add_argument("argv", nargs=argparse.REMAINDER)

    hashing = commands.add_parser("hash", help="print the content digest of files or trees")
    hashing.add_argument("paths", nargs="+")

    key = commands.add_parser("cache-key", help="print the cache key of a JSON record")
    key.add_argument("record", help="path of a JSON record, or - for stdin")

    agent = commands.add_parser("agent", help="run the checkpoint upload agent (sidecar)")
    agent.add_argument("--spool", default=None)
    agent.add_argument("--uri", default=None)
    agent.add_argument("--keep", type=int, default=None)
    agent.add_argument("--poll-seconds", type=float, default=0.2)

    lines = commands.add_parser("checkpoints", help="list or collect checkpoint lines")
    lines.add_argument("action", choices=("list", "gc"))
    lines.add_argument("uri")
    lines.add_argument("--max-age", default="14d")
    lines.add_argument("--apply", action="store_true")
    lines.add_argument("--json", action="store_true")
    lines.add_argument("--protect-unfinished-runs", action="store_true",
                       help="read the namespace's unfinished Workflows from the Kubernetes API "
                            "and keep their lines (fails, removing nothing, when it cannot)")

    check = commands.add_parser("preflight",
                                help="check this Python can run the runtime and open the store")
    check.add_argument("--uri", default=None)
    return parser


def _exec_usage_error(message: str, termination_log: str | None = None) -> int:
    """``exec`` promises a verdict for every ending, its own misuse included."""
    from durapipe.runtime.wrapper import report_without_attempt

    sys.stderr.write(f"durapipe.runtime exec: {message}\n")
    return report_without_attempt(
        f"wrapper usage error: {message}", termination_log=termination_log
    ).exit_code


def _termination_log_argument(arguments: list[str]) -> str | None:
    """``--termination-log`` of arguments that failed to parse as a whole."""
    for index, argument in enumerate(arguments):
        if argument == "--":
            break
        if argument == "--termination-log" and index + 1 < len(arguments):
            return arguments[index + 1]
        if argument.startswith("--termination-log="):
            return argument.partition("=")[2]
    return None


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        options = _parser().parse_args(arguments)
    except _UsageError as error:
        if arguments[:1] == ["exec"]:
            return _exec_usage_error(str(error), _termination_log_argument(arguments))
        sys.stderr.write(f"durapipe.runtime: {error}\n")
        return contract.EXIT_USAGE
    if options.subcommand == "exec":
        command = list(options.argv)
        if command and command[0] == "--":
            command = command[1:]
        if not command:
            return _exec_usage_error("no command given after --", options.termination_log)
        from durapipe.runtime.mainbeat import MainBeat
        from durapipe.runtime.wrapper import run_attempt

        # With the upload sidecar, it waits for a final save while this command runs.
        spool = os.environ.get(contract.ENV_SPOOL_DIR)
        sidecar = os.environ.get(contract.ENV_UPLOADER) == "sidecar" and spool
        beat = MainBeat(spool).start() if sidecar and spool else None
        try:
            result = run_attempt(
                command,
                handle_signals=True,
                grace_seconds=options.grace_seconds,
                termination_log=options.termination_log,
                output_hash_dir=options.output_hash_dir,
            )
        except Exception as error:  # noqa: BLE001 (the verdict is the one report there is)
            return _exec_usage_error(f"{type(error).__name__}: {error}", options.termination_log)
        finally:
            if beat is not None:
                beat.stop()
        return result.exit_code
    if options.subcommand == "hash":
        from durapipe.runtime.hashing import hash_path

        for path in options.paths:
            print(f"{hash_path(path)}  {path}")
        return 0
    if options.subcommand == "cache-key":
        from durapipe.runtime.cachekey import cache_key

        text = sys.stdin.read() if options.record == "-" else Path(options.record).read_text()
        print(cache_key(json.loads(text)))
        return 0
    if options.subcommand == "agent":
        from durapipe.runtime.agent import run_agent

        return run_agent(
            spool=options.spool,
            uri=options.uri,
            keep=options.keep,
            poll_seconds=options.poll_seconds,
        )
    if options.subcommand == "checkpoints":
        from durapipe.runtime import linegc

        return linegc.run(options.action, options.uri, max_age=options.max_age,
                          apply=options.apply, as_json=options.json,
                          protection=linegc.unfinished_runs_in_cluster
                          if options.protect_unfinished_runs else None)
    if options.subcommand == "preflight":
        from durapipe.runtime.agent import preflight

        return preflight(options.uri)
    raise AssertionError(options.subcommand)


if __name__ == "__main__":
    sys.exit(main())
