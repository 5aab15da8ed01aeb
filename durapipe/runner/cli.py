"""``durapipe run`` and ``durapipe runs``."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from durapipe.dsl.model import Pipeline
    from durapipe.runner.engine import Runner, RunOptions
    from durapipe.runner.records import RunRecord



class _Drill(argparse.Action):
    """``--preempt``/``--kill``: appends ``(kind, STAGE@SECONDS)`` to one shared list, so the
    drills keep the order they were given in."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        drills = list(getattr(namespace, self.dest, None) or [])
        drills.append((str(option_string).lstrip("-"), str(values)))
        setattr(namespace, self.dest, drills)

def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="a .pipe file or builder .py module")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                        help="set a param (repeatable)")
    parser.add_argument("--jobs", "-j", type=int, default=2,
                        help="independent stages to run at once (default 2)")
    parser.add_argument("--store", default=None, metavar="URI",
                        help="checkpoint and cache store (default .durapipe/store)")
    parser.add_argument("--home", default=".durapipe", help="run records and logs")
    # One list in command-line order: the n-th drill naming a stage is its n-th attempt's.
    parser.add_argument("--preempt", action=_Drill, dest="drills", default=[],
                        metavar="STAGE@SECONDS",
                        help="preempt STAGE (SIGTERM, SIGKILL after the grace period) SECONDS "
                             "after its next attempt first prints; repeat for later attempts "
                             "(with --kill, in the order given)")
    parser.add_argument("--kill", action=_Drill, dest="drills", default=[],
                        metavar="STAGE@SECONDS",
                        help="SIGKILL STAGE SECONDS after its next attempt first prints")
    parser.add_argument("--chaos", type=int, default=None, metavar="SEED",
                        help="inject random preemptions and kills, reproducibly from SEED")
    parser.add_argument("--chaos-max", type=int, default=3, help="most faults chaos injects")
    parser.add_argument("--grace-seconds", type=float, default=10.0,
                        help="time between SIGTERM and SIGKILL (default 10)")
    parser.add_argument("--resume", metavar="RUN", default=None,
                        help="re-run RUN, reusing every stage that succeeded in it")
    parser.add_argument("--plain", action="store_true", help="plain lines, no live table")


def add_runs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--home", default=".durapipe", help="run records and logs")


def run(args: argparse.Namespace, pipeline: Pipeline) -> int:
    """Run ``pipeline``, which ``durapipe check`` accepts (the caller asked it)."""
    from durapipe.runner.engine import RunError, Runner
    from durapipe.runner.view import View, summary

    options = _options(args, {s.name for s in pipeline.stages})
    if isinstance(options, str):
        print(f"durapipe run: {options}", file=sys.stderr)
        return 2
    view = View(live=False if args.plain else None)
    try:
        runner = Runner(pipeline, args.file, options, view)
    except RunError as exc:
        print(f"durapipe run: {exc}", file=sys.stderr)
        return 2
    print(f"run {runner.run_id}: stages run on this machine, in the host environment; "
          "images are not pulled and GPU requests are reported, not enforced", file=sys.stderr)
    if not runner.cgroups.available:
        print(f"warning: {runner.cgroups.reason}", file=sys.stderr)
    view.attach(runner.record)
    try:
        record = _run_interruptible(runner)
    finally:
        view.close()
    print(summary(record), file=sys.stderr)
    return {"succeeded": 0, "interrupted": 130}.get(record.status, 1)


def _options(args: argparse.Namespace, stage_names: set[str]) -> RunOptions | str:
    """The run's options from the command line, or what is wrong with them."""
    from durapipe.dsl.arguments import parse_assignments
    from durapipe.runner.engine import Fault, RunOptions

    params = parse_assignments(args.param)
    if isinstance(params, str):
        return params
    try:
        faults = [Fault.parse(kind, text) for kind, text in args.drills]
    except ValueError as exc:
        return str(exc)
    for fault in faults:
        if fault.stage not in stage_names:
            return f"no stage {fault.stage!r} to {fault.kind}"
    return RunOptions(params=params, jobs=args.jobs, home=Path(args.home), store=args.store,
                      faults=faults, chaos_seed=args.chaos, chaos_max=args.chaos_max,
                      resume=args.resume, grace_seconds=args.grace_seconds)


def _run_interruptible(runner: Runner) -> RunRecord:
    """Run with Ctrl-C stopping cleanly: running stages get their grace period."""
    def on_interrupt(_signum: int, _frame: FrameType | None) -> None:
        print("\ninterrupted: stopping stages (they get their grace period to checkpoint)",
              file=sys.stderr)
        runner.interrupt()

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        return runner.run()
    finally:
        signal.signal(signal.SIGINT, previous)


def runs(args: argparse.Namespace) -> int:
    import time

    from durapipe.runner.records import SUCCESSFUL, list_runs

    records = list_runs(Path(args.home))
    if not records:
        print(f"no runs under {args.home}/runs", file=sys.stderr)
        return 0
    print(f"{'run':<48} {'status':<12} {'started (UTC)':<20} {'seconds':>8}  stages")
    for record in records:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(record.started))
        took = (record.finished - record.started) if record.finished else 0.0
        ok = sum(s.status in SUCCESSFUL for s in record.stages.values())
        print(f"{record.run_id:<48} {record.status:<12} {started:<20} {took:>8.1f}  "
              f"{ok}/{len(record.stages)} ok")
    return 0
