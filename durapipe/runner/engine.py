"""The local executor: schedule stages, run attempts through the runtime wrapper, step the
retry machine.

Each attempt is ``python -m durapipe.runtime exec -- CMD`` as a child process, placed in its
own memory cgroup (limit = the attempt's rung), with the contract environment the compiled pod
gets.  The wrapper's one-line verdict (its termination log) decides what happens next, through
:func:`durapipe.plan.machine.step`, the machine the Argo lowering unrolls into its task grid.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import durapipe
from durapipe.compiler import memo
from durapipe.compiler.plan import (
    Site,
    StagePlan,
    Variant,
    cache_parts,
    cache_static,
    checkpoint_line,
    contract_env,
    kubelet_literal,
    param_value,
    plan_pipeline,
)
from durapipe.dsl import units
from durapipe.dsl.model import ConfigMapKey, Interp, Pipeline, Ref, Secret, Stage, Text
from durapipe.plan import machine
from durapipe.runner.cache import Hit, open_cache
from durapipe.runner.cgroups import AttemptCgroup, CgroupFactory
from durapipe.runner.records import (
    SUCCESSFUL,
    AttemptRecord,
    RunRecord,
    StageRecord,
    last_lines,
    load_run,
    runs_dir,
    write_json_atomic,
)
from durapipe.runtime import contract, resume_report
from durapipe.runtime.manifest import decode_manifest, manifest_key
from durapipe.runtime.restore import list_commits
from durapipe.runtime.store import StoreError, open_store
from durapipe.runtime.verdict import parse_verdict_line

DEFAULT_GRACE_SECONDS = 10.0


@dataclass(frozen=True)
class Fault:
    """An injected failure: ``preempt`` (SIGTERM, then SIGKILL after the grace period) or
    ``kill`` (SIGKILL at once) of ``stage``, ``seconds`` after the attempt's first output."""

    kind: str
    stage: str
    seconds: float

    @classmethod
    def parse(cls, kind: str, text: str) -> Fault:
        stage, sep, seconds = text.rpartition("@")
        if not sep or not stage:
            raise ValueError(f"expected STAGE@SECONDS, got {text!r}")
        return cls(kind, stage, float(seconds))


@dataclass
class RunOptions:
    params: dict[str, str] = field(default_factory=dict)
    jobs: int = 2
    home: Path = Path(".durapipe")
    store: str | None = None
    faults: list[Fault] = field(default_factory=list)
    chaos_seed: int | None = None
    chaos_max: int = 3
    resume: str | None = None
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    #: Scale every retry backoff (tests use 0 to avoid waiting).
    backoff_scale: float = 1.0
    workdir: Path | None = None


class RunError(Exception):
    """A problem with the run's inputs (bad param, unknown run to resume); user-facing."""


Listener = Callable[[str, StageRecord, str], None]


class Runner:
    def __init__(self, pipeline: Pipeline, source: str, options: RunOptions,
                 listener: Listener | None = None):
        self.pipeline = pipeline
        self.options = options
        self.home = options.home.resolve()
        self.workdir = (options.workdir or Path(source).resolve().parent).resolve()
        self.listener = listener or (lambda _event, _stage, _text: None)
        self.params = self._resolve_params(options.params)
        self.store_root = self._store_root(options.store)
        self.cache = open_cache(self.store_root, pipeline.name)
        self.cgroups = CgroupFactory()
        self.resumed = self._load_resume(options.resume)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        self.run_id = f"{pipeline.name}-{stamp}-{uuid.uuid4().hex[:6]}"
        self.run_dir = runs_dir(self.home) / self.run_id
        # The same plan the compiler lowers to Argo (rungs, variants, budgets, the contract
        # environment): `durapipe run` promises the cluster's semantics.
        self.plan = plan_pipeline(pipeline, checkpoint_grace_seconds=0)
        self.plans = {p.stage.name: p for p in self.plan.stages}
        self.record = RunRecord(self.run_id, pipeline.name, source, time.time(), self.params,
                                resumed_from=self.resumed.run_id if self.resumed else "")
        for stage in pipeline.stages:
            self.record.stages[stage.name] = StageRecord(stage.name)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._running: dict[str, subprocess.Popen[bytes]] = {}
        self._chaos = random.Random(options.chaos_seed) if options.chaos_seed is not None else None
        self._chaos_left = options.chaos_max
        self._fault_counts: dict[str, int] = {}

    # -- inputs ---------------------------------------------------------------------------

    def _resolve_params(self, given: Mapping[str, str]) -> dict[str, str]:
        declared = {p.name: p for p in self.pipeline.params}
        unknown = sorted(set(given) - set(declared))
        if unknown:
            raise RunError(f"unknown param {unknown[0]!r}; declared: {', '.join(declared) or 'none'}")
        values: dict[str, str] = {}
        for name, param in declared.items():
            if name in given:
                text = given[name]
                checks: dict[str, Callable[[str], object]] = {
                    "int": int, "float": float, "str": str,
                    "bool": lambda t: {"true": True, "false": False}[t]}
                try:
                    checks[param.type](text)
                except (ValueError, KeyError):
                    raise RunError(f"param {name} expects {param.type}, got {text!r}") from None
                values[name] = text
            elif param.default is not None:
                values[name] = param_value(param.default)
            else:
                raise RunError(f"param {name} has no default; pass -p {name}=VALUE")
        return values

    def _store_root(self, store: str | None) -> str:
        if store is None:
            path = self.home / "store"
            path.mkdir(parents=True, exist_ok=True)
            return path.as_uri()
        if "://" not in store:
            path = Path(store).resolve()
            path.mkdir(parents=True, exist_ok=True)
            return path.as_uri()
        return store.rstrip("/")

    def _load_resume(self, run_id: str | None) -> RunRecord | None:
        if run_id is None:
            return None
        record = load_run(self.home, run_id)
        if record is None:
            raise RunError(f"no run {run_id!r} under {runs_dir(self.home)}; see `durapipe runs`")
        if record.pipeline != self.pipeline.name:
            raise RunError(f"run {run_id} is of pipeline {record.pipeline!r}, "
                           f"not {self.pipeline.name!r}")
        return record

    # -- the run --------------------------------------------------------------------------

    def run(self) -> RunRecord:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._save()
        order = {s.name: i for i, s in enumerate(self.pipeline.stages)}
        deps = {s.name: set(s.upstream()) for s in self.pipeline.stages}
        done: set[str] = set()
        failed: set[str] = set()
        active: dict[str, threading.Thread] = {}
        finished: list[str] = []
        wake = threading.Condition()

        def work(stage: Stage) -> None:
            try:
                self._run_stage(stage)
            except Exception as exc:  # a bug must not hang the scheduler
                record = self.record.stages[stage.name]
                record.status, record.reason = "failed", f"internal error: {exc!r}"
            with wake:
                finished.append(stage.name)
                wake.notify_all()

        pending = sorted(self.pipeline.stages, key=lambda s: order[s.name])
        while pending or active:
            with wake:
                for name in finished:
                    active.pop(name).join()
                    status = self.record.stages[name].status
                    (done if status in SUCCESSFUL else failed).add(name)
                finished.clear()
            for stage in list(pending):
                if deps[stage.name] & failed or self._stop.is_set():
                    pending.remove(stage)
                    record = self.record.stages[stage.name]
                    record.status = "interrupted" if self._stop.is_set() else "skipped"
                    record.reason = ("the run was interrupted" if self._stop.is_set() else
                                     "upstream failed: " + ", ".join(sorted(deps[stage.name] & failed)))
                    failed.add(stage.name)
                    self._event("skip", record, record.reason)
                elif deps[stage.name] <= done and len(active) < max(1, self.options.jobs):
                    pending.remove(stage)
                    thread = threading.Thread(target=work, args=(stage,), daemon=True,
                                              name=f"stage-{stage.name}")
                    active[stage.name] = thread
                    thread.start()
            with wake:
                if active and not finished:
                    wake.wait(0.5)
        statuses = {r.status for r in self.record.stages.values()}
        self.record.status = ("interrupted" if self._stop.is_set() else
                              "failed" if statuses - SUCCESSFUL else
                              "succeeded")
        self.record.finished = time.time()
        self._save(durable=True)
        return self.record

    def interrupt(self) -> None:
        """Stop cleanly: running attempts get SIGTERM and their grace period; nothing new starts."""
        self._stop.set()
        with self._lock:
            for process in self._running.values():
                _signal(process.pid, signal.SIGTERM)

    def _save(self, durable: bool = False) -> None:
        with self._lock:
            write_json_atomic(self.run_dir / "run.json", self.record.to_json(), durable)

    def _event(self, event: str, record: StageRecord, text: str) -> None:
        self._save()
        self.listener(event, record, text)

    # -- one stage ------------------------------------------------------------------------

    def _run_stage(self, stage: Stage) -> None:
        record = self.record.stages[stage.name]
        started = time.monotonic()
        if self.resumed is not None:
            previous = self.resumed.stages.get(stage.name)
            if previous is not None and previous.status in SUCCESSFUL \
                    and all(Path(p).exists() for p in previous.outputs.values()):
                record.status, record.outputs = "reused", dict(previous.outputs)
                record.output_hashes = dict(previous.output_hashes)
                record.reason = f"succeeded in {self.resumed.run_id}"
                self._event("reused", record, record.reason)
                return
        key = self._cache_key(self.plans[stage.name])
        if key:
            record.cache_key = key
            hit = self._cache_lookup(stage, key)
            if hit is not None:
                record.status, record.outputs = "cached", hit.outputs
                record.output_hashes = hit.output_hashes
                record.reason = f"cache hit {key[:12]}"
                self._event("cached", record, record.reason)
                return
            record.cache_miss = self._explain_miss(self.plans[stage.name])
        record.status = "running"
        record.checkpoint_line = self._checkpoint_uri(stage)
        self._event("start", record, "")
        self._attempts(self.plans[stage.name], record, key)
        record.seconds = time.monotonic() - started
        self._event("end", record, record.reason)

    def _attempts(self, plan: StagePlan, record: StageRecord, key: str) -> None:
        """Run attempts as the retry machine says, until it is done or gives up."""
        stage_dir = self.run_dir / plan.stage.name
        outputs = {name: str(stage_dir / "outputs" / name) for name in plan.stage.outputs}
        run, state = machine.begin(plan.rules)
        while True:
            attempt = self._attempt(plan, run, stage_dir, outputs, record)
            record.attempts.append(attempt)
            record.current = None
            action, state = machine.step(state, attempt.verdict)
            reason = action.reason
            if attempt.message and not isinstance(action, machine.Done):
                reason = f"{reason} ({attempt.message})"
            self._event("attempt", record, reason)
            if isinstance(action, machine.Done):
                record.status, record.outputs = "succeeded", outputs
                record.output_hashes = self._read_hashes(stage_dir, attempt.number)
                if key:
                    self._cache_store(plan.stage, key, record)
                return
            if isinstance(action, machine.Fail) or self._stop.is_set():
                record.status = "interrupted" if self._stop.is_set() else "failed"
                record.reason = reason
                return
            run = action
            wait = run.backoff * self.options.backoff_scale
            if wait and self._stop.wait(wait):
                record.status, record.reason = "interrupted", "the run was interrupted"
                return

    @staticmethod
    def _variant(plan: StagePlan, run: machine.Run) -> Variant:
        """The variant an attempt runs: its rung and GPU type (a local run never waits for
        capacity, so it stays on the first type)."""
        return next(v for v in plan.variants
                    if v.rung == run.rung and v.type_index == run.gpu_type)

    def _attempt(self, plan: StagePlan, run: machine.Run, stage_dir: Path,
                 outputs: dict[str, str], record: StageRecord) -> AttemptRecord:
        stage = plan.stage
        # One number everywhere: DURAPIPE_ATTEMPT as the compiled workflow's pod would get it,
        # the attempt directory, and the summary's `#N`.
        number = run.attempt
        attempt_dir = stage_dir / f"attempt-{number}"
        attempt_dir.mkdir(parents=True, exist_ok=True)
        log_path = attempt_dir / "log"
        variant = self._variant(plan, run)
        memory = variant.memory
        site = self._site(stage, number, attempt_dir, outputs)
        env = self._env(plan, variant, site, outputs)
        argv = self._argv(stage, outputs, Path(site.checkpoint_path))
        for path in outputs.values():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        cgroup: AttemptCgroup | None = None
        if memory is not None:
            cgroup = self.cgroups.create(f"{self.run_id}/{stage.name}-{number}", memory)
        resumed_from = self._latest_checkpoint(stage)
        fault = self._fault_for(stage)
        record.current = AttemptRecord(
            number=number, rung=run.rung,
            memory=units.format_bytes(memory) if memory is not None else "",
            verdict="running", exit_code=0, seconds=0.0, message="",
            resumed_from=resumed_from, log=str(log_path))
        started = time.monotonic()
        process = self._supervise(stage, self._wrapper(site, argv), env, cgroup, fault, log_path)
        seconds = time.monotonic() - started
        verdict, message = self._judge(process, Path(site.termination_log), cgroup)
        reported = resume_report.read_text(Path(site.resume_report)) if site.resume_report else None
        if reported is not None:  # what the attempt's restore found, rather than foreseen
            resumed_from = reported
        if cgroup is not None:
            cgroup.remove()
        return AttemptRecord(
            number=number, rung=run.rung,
            memory=units.format_bytes(memory) if memory is not None else "",
            verdict=verdict, exit_code=process.returncode, seconds=round(seconds, 3),
            message=message, resumed_from=resumed_from, log=str(log_path),
            fault=f"{fault.kind}@{fault.seconds:g}s" if fault else "",
            tail="" if verdict == contract.VERDICT_SUCCESS else _tail(log_path))

    def _site(self, stage: Stage, number: int, attempt_dir: Path,
              outputs: dict[str, str]) -> Site:
        """Where this attempt's contract points: its own directory under the run."""
        return Site(
            run_id=self.run_id,
            attempt=str(number),
            outputs=outputs,
            output_hash_dir=str(attempt_dir / "output-hashes"),
            termination_log=str(attempt_dir / "termination-log"),
            inputs=self._declared_inputs(stage), store_uri=self.store_root,
            checkpoint_uri=self._checkpoint_uri(stage),
            checkpoint_path=str(attempt_dir / "checkpoint"),
            grace_seconds=str(self.options.grace_seconds), upload_sidecar=False,
            resume_report=str(attempt_dir / "resumed-from.json") if stage.checkpoint else "",
            resume_from=self._resume_from(stage))

    def _resume_from(self, stage: Stage) -> str:
        """The resumed run's line for the stage, to restore from while this run's own has no
        commit (even where the inputs changed since: a fixed evaluation must not retrain);
        commits go to the stage's own line, as ``durapipe submit --resume-from`` does."""
        previous = self.resumed.stages.get(stage.name) if self.resumed else None
        if stage.checkpoint is None or previous is None or not previous.checkpoint_line:
            return ""
        if previous.checkpoint_line == self._checkpoint_uri(stage):
            return ""
        return json.dumps({stage.name: previous.checkpoint_line})

    def _wrapper(self, site: Site, argv: list[str]) -> list[str]:
        """The command under the runtime wrapper, as the pod runs it."""
        return [sys.executable, "-S", "-m", "durapipe.runtime", "exec",
                "--grace-seconds", str(self.options.grace_seconds),
                "--termination-log", site.termination_log,
                "--output-hash-dir", site.output_hash_dir, "--", *argv]

    def _supervise(self, stage: Stage, wrapper: list[str], env: dict[str, str],
                   cgroup: AttemptCgroup | None, fault: Fault | None,
                   log_path: Path) -> subprocess.Popen[bytes]:
        """Start the attempt, arm its faults and timeout, wait for it, then kill whatever it
        left behind; the process comes back ended."""
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                wrapper, env=env, cwd=self._cwd(stage), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=_join_cgroup(cgroup.procs_file) if cgroup else None)
            with self._lock:
                self._running[stage.name] = process
            timers = self._arm(process, stage, fault, cgroup, log_path)
            process.wait()
            for timer in list(timers):
                timer.cancel()
            with self._lock:
                self._running.pop(stage.name, None)
        _kill_tree(process.pid, cgroup)
        return process

    def _judge(self, process: subprocess.Popen[bytes], termination_log: Path,
               cgroup: AttemptCgroup | None) -> tuple[str, str]:
        """The attempt's verdict and what the report says about it."""
        verdict, details = self._verdict(termination_log, process.returncode, cgroup)
        if getattr(process, "durapipe_timed_out", False):
            # On the cluster the kubelet stops the pod at its activeDeadlineSeconds with SIGTERM:
            # the machine's timeout transition, whatever the wrapper made of the signal.
            return machine.TIMEOUT, ""
        if getattr(process, "durapipe_deleted", False) and verdict != contract.VERDICT_SUCCESS:
            return contract.VERDICT_PREEMPTED, "the pod was deleted (--kill)"
        return verdict, str(details["reason"]) if details.get("reason") else ""

    def _verdict(self, termination_log: Path, returncode: int,
                 cgroup: AttemptCgroup | None) -> tuple[str, dict[str, object]]:
        try:
            line = termination_log.read_text(encoding="utf-8").strip().splitlines()[-1]
            return parse_verdict_line(line)
        except (OSError, IndexError, ValueError):
            pass
        # No verdict: the wrapper itself died (a kill drill, or the kernel OOM-killed it).
        if cgroup is not None and cgroup.oom_kills() > 0:
            return contract.VERDICT_HOST_OOM, {"reason": "the kernel OOM-killed the attempt"}
        return contract.VERDICT_APP_FAILURE, {"reason": f"killed (exit {returncode})"}

    # -- faults ---------------------------------------------------------------------------

    def _fault_for(self, stage: Stage) -> Fault | None:
        """The n-th ``--preempt``/``--kill`` naming a stage applies to its n-th attempt."""
        n = self._fault_counts.get(stage.name, 0)
        self._fault_counts[stage.name] = n + 1
        mine = [f for f in self.options.faults if f.stage == stage.name]
        if n < len(mine):
            return mine[n]
        if self._chaos is not None:
            with self._lock:
                if self._chaos_left > 0 and self._chaos.random() < 0.5:
                    self._chaos_left -= 1
                    kind = self._chaos.choice(["preempt", "kill"])
                    return Fault(kind, stage.name, round(self._chaos.uniform(0.2, 2.0), 2))
        return None

    def _arm(self, process: subprocess.Popen[bytes], stage: Stage, fault: Fault | None,
             cgroup: AttemptCgroup | None, log_path: Path) -> list[threading.Timer]:
        timers: list[threading.Timer] = []
        grace = self.options.grace_seconds

        def preempt() -> None:
            _signal(process.pid, signal.SIGTERM)
            later = threading.Timer(grace + 2.0, lambda: _kill_tree(process.pid, cgroup))
            later.daemon = True
            later.start()
            timers.append(later)

        def timeout() -> None:
            process.durapipe_timed_out = True  # type: ignore[attr-defined]
            preempt()

        def delete() -> None:
            # A pod deletion: Argo's "pod deleted", which the cluster retries as a preemption.
            process.durapipe_deleted = True  # type: ignore[attr-defined]
            _kill_tree(process.pid, cgroup)

        if fault is not None:
            action = preempt if fault.kind == "preempt" else delete
            # The drill clock starts at the attempt's first output, so a slow framework import
            # on a busy machine does not swallow the drill.
            def after_first_output() -> None:
                while process.poll() is None:
                    try:
                        if log_path.stat().st_size > 0:
                            break
                    except OSError:
                        pass
                    time.sleep(0.02)
                else:
                    return
                timer = threading.Timer(fault.seconds, action)
                timer.daemon = True
                timers.append(timer)
                timer.start()

            threading.Thread(target=after_first_output, daemon=True).start()
        if stage.timeout:
            timer = threading.Timer(stage.timeout, timeout)
            timer.daemon = True
            timers.append(timer)
            timer.start()
        return timers

    # -- environment and command ----------------------------------------------------------

    def _checkpoint_uri(self, stage: Stage) -> str:
        """The stage's checkpoint line, by its scope (a resumed run's for scope ``run``)."""
        if stage.checkpoint is None:
            return ""
        run = self.resumed.run_id if self.resumed else self.run_id
        inputs_key = self._inputs_key(self.plans[stage.name]) \
            if stage.checkpoint.scope == "inputs" else ""
        return checkpoint_line(self.store_root, self.pipeline.name, stage.name,
                               stage.checkpoint.scope, run=run, inputs_key=inputs_key)

    def _latest_checkpoint(self, stage: Stage) -> str:
        # The newest commit before the attempt starts; the runtime's own report of its
        # restore (``resume_report.read_text``) replaces it when the attempt wrote one.
        """The newest committed checkpoint this attempt will find, for the report."""
        uri = self._checkpoint_uri(stage)
        if not uri:
            return ""
        try:
            store = open_store(uri)
            seqs = list_commits(store)
            if not seqs:
                return ""
            body = decode_manifest(store.get_bytes(manifest_key(seqs[0])))
        except (StoreError, OSError, ValueError):
            return ""  # only the report loses the detail; the attempt reads the store itself
        step = body.get("metadata", {}).get("step")
        return f"#{seqs[0]}" + (f" (step {step})" if step is not None else "")

    def _declared_inputs(self, stage: Stage) -> dict[str, str]:
        return {name: self.record.stages[ref.path[0]].outputs[ref.path[2]]
                for name, ref in sorted(stage.inputs.items()) if ref.is_output}

    def _env(self, plan: StagePlan, variant: Variant, site: Site,
             outputs: Mapping[str, str]) -> dict[str, str]:
        """The host's environment, the user's variables, then the contract's (built by the
        plan, as for the pod)."""
        stage = plan.stage
        env = dict(os.environ)
        package_root = str(Path(durapipe.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        for name, value in stage.env.items():
            if isinstance(value, Secret):
                if name not in os.environ:
                    source = "config map" if isinstance(value, ConfigMapKey) else "secret"
                    self.listener("warn", self.record.stages[stage.name],
                                  f"env {name} comes from {source} {value.name}/{value.key}, "
                                  f"which is not available locally; export {name} to provide it")
                continue
            env[name] = self._text(value, outputs)
        env.update(contract_env(self.pipeline, plan, variant, site))
        return env

    def _text(self, value: Text, outputs: Mapping[str, str]) -> str:
        def ref(r: Ref) -> str:
            if r.is_param:
                return self.params[r.path[1]]
            upstream = self.record.stages[r.path[0]]
            return upstream.outputs[r.path[2]]

        if isinstance(value, Ref):
            return ref(value)
        if isinstance(value, Interp):
            return "".join(p if isinstance(p, str) else ref(p) for p in value.parts)
        return value

    def _argv(self, stage: Stage, outputs: Mapping[str, str], checkpoint_local: Path) -> list[str]:
        """The command with references resolved and container paths relocated.

        A declared output path (``/out/data``) or checkpoint path inside the image's filesystem
        means nothing on this machine, so an argument equal to it, or starting with it, is
        rewritten to the run directory's copy.
        """
        relocate = {stage.outputs[n]: outputs[n] for n in stage.outputs}
        if stage.checkpoint is not None:
            relocate[stage.checkpoint.path] = str(checkpoint_local)

        def moved(arg: str) -> str:
            for old, new in sorted(relocate.items(), key=lambda kv: -len(kv[0])):
                if arg == old or arg.startswith(old + "/"):
                    return new + arg[len(old):]
                if "=" in arg:
                    flag, _, rest = arg.partition("=")
                    if rest == old or rest.startswith(old + "/"):
                        return f"{flag}={new}{rest[len(old):]}"
            return arg

        items: Sequence[Text]
        if stage.command is not None:
            items = [*stage.command, *stage.args]
            return [moved(self._text(item, outputs)) for item in items]
        return ["sh", "-c", stage.script or "", "sh",
                *[moved(self._text(a, outputs)) for a in stage.args]]

    def _cwd(self, stage: Stage) -> str:
        if stage.workdir and Path(stage.workdir).is_dir():
            return stage.workdir
        return str(self.workdir)

    # -- caching --------------------------------------------------------------------------

    def _cache_key(self, plan: StagePlan) -> str:
        """The key the compiled workflow's memoization computes, from the same functions and
        the same reads (``plan.params``, ``plan.upstream``: what the Argo lowering's
        ``memoize`` names), not a second walk over the stage's references.
        A param enters as the value Argo would hold for the program to get the text this run
        passes: kubelet-escaped, as the compiled defaults are (``argo_workflow.arguments``)."""
        if not plan.cached:
            return ""
        return self._inputs_key(plan)

    def _key_components(self, plan: StagePlan) -> dict[str, object]:
        """What the stage's key is made of (``memo.components``), read as ``_inputs_key``
        reads it: what a later miss is explained against, as the compiled workflow records."""
        params = {name: kubelet_literal(self.params[name]) for name in sorted(plan.params)}
        upstream = {f"{stage}.{output}": self.record.stages[stage].output_hashes.get(output, "")
                    for stage, output in plan.upstream}
        return memo.components(plan.stage.name, cache_static(plan.stage),
                               cache_parts(plan.stage), params, upstream)

    def _explain_miss(self, plan: StagePlan) -> str:
        try:
            entries = self.cache.entries(plan.stage.name)
        except (StoreError, OSError) as exc:
            self._cache_unavailable(plan.stage, "read", exc)
            return ""
        return memo.explain_miss(self._key_components(plan), entries)

    def _inputs_key(self, plan: StagePlan) -> str:
        """The stage's cache key whether or not it caches: it also names an inputs-scoped
        checkpoint line (``plan.checkpoint_line``), as in the compiled workflow."""
        params = {name: kubelet_literal(self.params[name]) for name in sorted(plan.params)}
        upstream = {f"{stage}.{output}": self.record.stages[stage].output_hashes.get(output, "")
                    for stage, output in plan.upstream}
        return memo.runtime_key(cache_static(plan.stage), params, upstream)

    def _cache_lookup(self, stage: Stage, key: str) -> Hit | None:
        """A store that cannot be read is a miss, said once: the stage runs as uncached."""
        assert stage.cache is not None
        try:
            return self.cache.lookup(stage.name, key, sorted(stage.outputs),
                                     stage.cache.max_age,
                                     self.run_dir / stage.name / "outputs")
        except (StoreError, OSError, KeyError, TypeError, ValueError) as exc:
            self._cache_unavailable(stage, "read", exc)
            return None

    def _cache_store(self, stage: Stage, key: str, record: StageRecord) -> None:
        try:
            self.cache.save(stage.name, key, record.outputs, record.output_hashes, self.run_id,
                            self._key_components(self.plans[stage.name]))
        except (StoreError, OSError) as exc:
            self._cache_unavailable(stage, "write", exc)

    def _cache_unavailable(self, stage: Stage, what: str, exc: Exception) -> None:
        self.listener("warn", self.record.stages[stage.name],
                      f"cannot {what} the cache in {self.store_root} ({exc}); "
                      "the stage runs as if uncached")

    def _read_hashes(self, stage_dir: Path, number: int) -> dict[str, str]:
        hash_dir = stage_dir / f"attempt-{number}" / "output-hashes"
        hashes = {}
        if hash_dir.is_dir():
            for path in hash_dir.glob(f"*{contract.OUTPUT_HASH_SUFFIX}"):
                hashes[path.name[: -len(contract.OUTPUT_HASH_SUFFIX)]] = path.read_text().strip()
        return hashes


def _join_cgroup(procs_file: str) -> Callable[[], None]:
    def join() -> None:
        with open(procs_file, "w") as handle:
            handle.write(str(os.getpid()))

    return join


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                stat = handle.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _kill_tree(pid: int, cgroup: AttemptCgroup | None) -> None:
    """SIGKILL the attempt and everything it started, as a pod deletion would."""
    victims = set(_descendants(pid)) | {pid}
    if cgroup is not None:
        try:
            victims |= {int(p) for p in Path(cgroup.procs_file).read_text().split()}
        except OSError:
            pass
    for victim in victims:
        _signal(victim, signal.SIGKILL)


#: Lines of a failed attempt's output the summary shows.
TAIL_LINES = 5


def _tail(log_path: Path) -> str:
    """The last non-empty lines of an attempt's log (the child's stdout and stderr), without
    the wrapper's verdict line."""
    return "\n".join(last_lines(log_path, TAIL_LINES, skip_prefix=contract.VERDICT_TAG))
