"""Command line of the in-pod runtime (also the zipapp's entry point).

python -m durapipe.runtime exec [--grace-seconds S] [--termination-log PATH] -- CMD...
python -m durapipe.runtime hash PATH...
python -m durapipe.runtime cache-key RECORD.json|-
python -m durapipe.runtime agent --spool DIR [--uri URI]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from durapipe.runtime import contract


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m durapipe.runtime", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="subcommand", required=True)

    run = commands.add_parser("exec", help="run a stage command and report its verdict")
    run.add_argument("--grace-seconds", type=float, default=None)
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        options = _parser().parse_args(argv)
    except _UsageError as error:
        sys.stderr.write(f"durapipe.runtime: {error}\n")
        return contract.EXIT_USAGE
    if options.subcommand == "exec":
        command = list(options.argv)
        if command and command[0] == "--":
            command = command[1:]
        if not command:
            sys.stderr.write("durapipe.runtime exec: no command given after --\n")
            return contract.EXIT_USAGE
        from durapipe.runtime.wrapper import run_attempt

        try:
            result = run_attempt(
                command,
                handle_signals=True,
                grace_seconds=options.grace_seconds,
                termination_log=options.termination_log,
                output_hash_dir=options.output_hash_dir,
            )
        except (OSError, ValueError) as error:
            # The command could not even start (not found, not executable, bad outputs JSON).
            sys.stderr.write(f"durapipe.runtime exec: {error}\n")
            return contract.EXIT_USAGE
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
    raise AssertionError(options.subcommand)


if __name__ == "__main__":
    sys.exit(main())
