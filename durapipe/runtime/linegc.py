"""Checkpoint lines under a store root, and their collection (``durapipe checkpoints list|gc``).

A line is a prefix holding ``manifests/``, ``blobs/`` and ``writers/`` (docs/runtime.md).  Lines
keyed by inputs are never reused once their inputs change, so a team's nightly runs would fill
the bucket: :func:`collect` removes the lines whose newest commit is older than ``max_age``.

What it never does: touch a line with a live writer (it claims each line it removes as a writer
would, with a run id of its own, so a writer's live lease makes it skip the line, and a run
that starts on the line meanwhile finds the collector's lease and waits for it); touch a line
a run that has not finished uses, when told which runs those are (:class:`Protection`: a run
whose claim is in the line, between two attempts, or one resuming from it by
``durapipe-resume-from``; in a pod, read from the Kubernetes API, and a pass that cannot read
them removes nothing); or leave a
manifest whose blobs are gone (it removes every manifest before any blob, so a collector
killed midway leaves a line whose remaining commits restore, and that a later pass removes).
Ages are by the store's clock: a probe object written at the start is "now"."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from durapipe.runtime import contract
from durapipe.runtime.claim import WRITER_DIR, LineClaim, beat_key, claim_key, claim_runs
from durapipe.runtime.errors import CheckpointError
from durapipe.runtime.manifest import BLOB_DIR, MANIFEST_DIR
from durapipe.runtime.store import Store, StoreError, open_store, retrying

#: A line's parts, by the key under the store root: every line the compiler names ends in
#: ``/checkpoints`` (``plan.checkpoint_line``), which keeps the cache's entries (and anything
#: else in the bucket) out; a root that is itself a line is one too.
_PART = re.compile(rf"^(?P<line>(?:.*/)?checkpoints/|)(?P<part>{MANIFEST_DIR}|{BLOB_DIR}|"
                   rf"{WRITER_DIR})/[^/]+$")
_MANIFEST = re.compile(rf"(?:^|/){MANIFEST_DIR}/(\d+)\.json$")
#: Written at the start of a pass, to read the store's clock.
CLOCK_PROBE = ".durapipe-gc-clock"


@dataclass(frozen=True)
class Line:
    """One checkpoint line as the store shows it."""

    #: The prefix under the root, ending in ``/`` ("" for a root that is one line).
    prefix: str
    commits: int
    newest_seq: int | None
    #: Seconds since its newest commit (or, without one, its newest object), by the store's
    #: clock.
    age_seconds: float
    bytes: int
    keys: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def lines(store: Store) -> tuple[list[Line], float]:
    """Every line under ``store``'s root, and the store's "now"."""
    retrying(partial(store.put_bytes, CLOCK_PROBE, b"probe"))
    now = retrying(partial(store.modified, CLOCK_PROBE)) or time.time()
    grouped: dict[str, list[str]] = {}
    for key in retrying(partial(store.list, "")):
        match = _PART.match(key)
        if match is not None:
            grouped.setdefault(match["line"], []).append(key)
    found = []
    for prefix, keys in sorted(grouped.items()):
        seqs = sorted(int(m[1]) for k in keys if (m := _MANIFEST.search(k)))
        dated = [k for k in keys if _MANIFEST.search(k)] or keys
        newest = max((retrying(partial(store.modified, k)) or 0.0) for k in dated)
        size = sum(retrying(partial(store.size, k)) or 0 for k in keys)
        found.append(Line(prefix, len(seqs), seqs[-1] if seqs else None,
                          max(0.0, now - newest), size, len(keys)))
    return found, now


@dataclass(frozen=True)
class Protection:
    """The runs that have not finished, and so whose lines no pass may remove."""

    #: Their run ids (the Workflows' names, which their claims record as ``run``).
    runs: frozenset[str] = frozenset()
    #: Line URI (no trailing ``/``) -> the run resuming from it (``durapipe-resume-from``).
    resumed_lines: Mapping[str, str] = field(default_factory=dict)
    #: Where they were read, for the report.
    source: str = ""

    def why_kept(self, line_uri: str, claimed_by: Iterable[str]) -> str | None:
        """Why a line must stay for these runs, or ``None``."""
        users = sorted(set(claimed_by) & self.runs)
        if users:
            return f"kept: run {users[0]} has not finished and has claimed it"
        resumer = self.resumed_lines.get(line_uri.rstrip("/"))
        if resumer is not None:
            return f"kept: run {resumer} has not finished and resumes from it"
        return None


def protection_from_workflows(workflows: Iterable[Mapping[str, Any]], source: str) -> Protection:
    """What the Workflows that have not finished protect (finished ones are skipped here too,
    whatever the query asked for)."""
    runs: set[str] = set()
    resumed: dict[str, str] = {}
    for workflow in workflows:
        meta = workflow.get("metadata") or {}
        if (meta.get("labels") or {}).get(contract.WORKFLOW_COMPLETED_LABEL) == "true":
            continue
        name = str(meta.get("name") or "")
        if not name:
            continue
        runs.add(name)
        for param in ((workflow.get("spec") or {}).get("arguments") or {}).get("parameters") or []:
            if isinstance(param, Mapping) and param.get("name") == contract.RESUME_FROM_PARAM:
                for line in _resume_lines(param.get("value")):
                    resumed.setdefault(line.rstrip("/"), name)
    return Protection(frozenset(runs), resumed, source)


def _resume_lines(value: object) -> list[str]:
    try:
        lines_by_stage = json.loads(value) if isinstance(value, str) and value else {}
    except ValueError:
        return []
    if not isinstance(lines_by_stage, dict):
        return []
    return [line for line in lines_by_stage.values() if isinstance(line, str)]


#: Workflows per page of the list (the API server's continue token pages the rest).
_PAGE = 500


def unfinished_runs_in_cluster(namespace: str | None = None,
                               **api_options: Any) -> Protection:
    """The unfinished Workflows of this pod's namespace (or ``namespace``), read from the
    Kubernetes API as the pod's service account (RBAC: ``list`` of ``workflows`` in
    ``argoproj.io``).  ``CheckpointError`` when they cannot be read: a pass that does not
    know which runs are live must not remove their lines."""
    from urllib.parse import quote

    from durapipe.runtime.podstatus import api_get, own_namespace

    namespace = namespace or own_namespace()
    if not namespace:
        raise CheckpointError("--protect-unfinished-runs needs the pod's namespace, and this "
                              "is not a pod (no service account mount)")
    selector = quote(f"{contract.WORKFLOW_COMPLETED_LABEL}!=true", safe="")
    items: list[Mapping[str, Any]] = []
    token = ""
    try:
        while True:
            page = api_get(f"/apis/argoproj.io/v1alpha1/namespaces/{namespace}/workflows"
                           f"?labelSelector={selector}&limit={_PAGE}"
                           + (f"&continue={quote(token, safe='')}" if token else ""),
                           **api_options)
            items.extend(i for i in page.get("items") or [] if isinstance(i, Mapping))
            token = str((page.get("metadata") or {}).get("continue") or "")
            if not token:
                break
    except (OSError, ValueError, KeyError) as error:
        raise CheckpointError(
            f"cannot list the Workflows of namespace {namespace}, so cannot tell which lines "
            f"runs that have not finished use, and removes nothing: {error} (the pod's service "
            "account needs `list` on `workflows` in `argoproj.io`; `durapipe compile -o DIR/` "
            "emits that Role)") from None
    return protection_from_workflows(items, f"the unfinished Workflows of namespace "
                                             f"{namespace}")


@dataclass(frozen=True)
class Outcome:
    line: Line
    #: "removed", "would remove", "kept: ..." (why).
    action: str


class _LineStore:
    """The store seen from one line's prefix (what :class:`LineClaim` expects)."""

    def __init__(self, store: Store, prefix: str) -> None:
        self._store, self._prefix = store, prefix
        self.uri = f"{getattr(store, 'uri', '').rstrip('/')}/{prefix}".rstrip("/")

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)
        if name in ("put_bytes", "get_bytes", "size", "delete", "modified", "put_file",
                    "get_file", "fingerprint"):
            return lambda key, *a, **k: method(self._prefix + key, *a, **k)
        if name == "list":
            return lambda prefix: [key[len(self._prefix):] for key in method(self._prefix + prefix)]
        return method


def collect(store: Store, *, max_age: float, apply: bool, lease_seconds: float | None = None,
            delete: Callable[[str], None] | None = None,
            protection: Protection | None = None) -> list[Outcome]:
    """Each line with what the pass did to it.  ``apply`` false: a dry run, nothing changes.
    ``protection``: the runs that have not finished, whose lines stay."""
    found, _now = lines(store)
    delete = delete or store.delete
    outcomes = []
    for line in found:
        if line.age_seconds <= max_age:
            outcomes.append(Outcome(line, f"kept: its newest commit is {format_age(line.age_seconds)}"
                                          " old"))
            continue
        view: Any = _LineStore(store, line.prefix)
        kept = protection.why_kept(view.uri, claim_runs(view)) if protection is not None \
            else None
        if kept is not None:
            outcomes.append(Outcome(line, kept))
            continue
        claim = LineClaim(view, run_id=f"durapipe-gc-{os.urandom(4).hex()}",
                          lease_seconds=lease_seconds, env={})
        try:
            # A live lease: skip the line, never wait for it (a sleep that says "give up").
            if apply:
                claim.ensure(sleep=lambda _seconds: True)
            else:
                claim.wait_until_free(sleep=lambda _seconds: True)
        except CheckpointError as error:
            outcomes.append(Outcome(line, f"kept: a writer holds it ({error})"))
            continue
        if not apply:
            outcomes.append(Outcome(line, "would remove"))
            continue
        held = claim.held
        try:
            _remove(store, line.prefix, claim, delete)
        finally:
            claim.release()
        if held is not None:  # last: until here its claim and lease fenced writers out
            try:
                retrying(partial(delete, line.prefix + claim_key(*held)))
            except StoreError:
                pass
        outcomes.append(Outcome(line, "removed"))
    return outcomes


def _remove(store: Store, prefix: str, claim: LineClaim, delete: Callable[[str], None]) -> None:
    """Manifests first, then blobs, then the other writers' claims: never a manifest without
    its blobs, whenever this stops."""
    keys = retrying(partial(store.list, prefix))
    held = claim.held
    own = {prefix + claim_key(*held), prefix + beat_key(*held)} if held is not None else set()
    order = {MANIFEST_DIR: 0, BLOB_DIR: 1}
    for key in sorted(keys, key=lambda k: (order.get(k[len(prefix):].split("/", 1)[0], 2), k)):
        if key not in own:
            retrying(partial(delete, key))


def format_age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def open_root(uri: str) -> Store:
    return open_store(uri)


_AGE = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_age(text: str) -> float:
    """``14d``, ``36h``, ``1d12h``, ``90m``, ``3600s`` or plain seconds; ``ValueError``."""
    text = text.strip()
    if text.isdigit():
        return float(text)
    match = _AGE.match(text)
    if not text or match is None or not any(match.groups()):
        raise ValueError("expected a duration such as 14d, 36h, 1d12h or 90m")
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def render(outcomes: list[Outcome], *, gc: bool, apply: bool) -> str:
    """What ``checkpoints list|gc`` print: a line per checkpoint line, then for gc a summary."""
    out = []
    for o in outcomes:
        line = o.line
        newest = f"#{line.newest_seq}" if line.newest_seq is not None else "-"
        out.append(f"{line.prefix or '.'}  {line.commits} commit(s), newest {newest}, "
                   f"{format_age(line.age_seconds)} old, {line.bytes:,} bytes"
                   + (f": {o.action}" if o.action else ""))
    if gc:
        going = [o for o in outcomes if o.action in ("removed", "would remove")]
        verb = "removed" if apply else "would remove (dry run; --apply removes)"
        out.append(f"{len(going)} of {len(outcomes)} line(s), "
                   f"{sum(o.line.bytes for o in going):,} bytes: {verb}")
    return "".join(f"{line}\n" for line in out)


def to_json(outcomes: list[Outcome]) -> str:
    return json.dumps([{**o.line.to_json(), **({"action": o.action} if o.action else {})}
                       for o in outcomes], indent=2, sort_keys=True) + "\n"


def run(action: str, uri: str, *, max_age: str, apply: bool, as_json: bool,
        protection: Callable[[], Protection] | None = None) -> int:
    """``checkpoints list|gc``, for both command lines (``durapipe`` and the runtime's);
    ``protection`` reads the runs that have not finished (before the pass: when it fails,
    nothing is removed)."""
    try:
        age = parse_age(max_age)
    except ValueError as error:
        sys.stderr.write(f"checkpoints: --max-age {max_age!r}: {error}\n")
        return contract.EXIT_USAGE
    try:
        store = open_root(uri)
        if action == "list":
            outcomes = [Outcome(line, "") for line in lines(store)[0]]
        else:
            protected = protection() if protection is not None else None
            if protected is not None:
                sys.stderr.write(f"checkpoints: keeping the lines of {len(protected.runs)} "
                                 f"run(s) that have not finished ({protected.source})\n")
            outcomes = collect(store, max_age=age, apply=apply, protection=protected)
    except (StoreError, OSError, ValueError, CheckpointError) as error:
        sys.stderr.write(f"checkpoints: {uri}: {error}\n")
        return 1
    sys.stdout.write(to_json(outcomes) if as_json else render(outcomes, gc=action == "gc",
                                                              apply=apply))
    return 0
