"""Run records on disk: ``.durapipe/runs/<run>/run.json``, written atomically."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from durapipe.files import write_atomic


@dataclass
class AttemptRecord:
    #: ``DURAPIPE_ATTEMPT`` of the attempt: the number the summary shows, its directory
    #: (``attempt-N``) and the compiled workflow's pod all use.
    number: int
    rung: int
    memory: str
    verdict: str
    exit_code: int
    seconds: float
    message: str
    resumed_from: str
    log: str
    fault: str = ""
    #: The last lines of a failed attempt's output (stdout and stderr), for the summary.
    tail: str = ""

#: The stage statuses that give downstream stages their inputs: ran, found in the cache, or
#: taken from the run being resumed.
SUCCESSFUL = frozenset({"succeeded", "cached", "reused"})


@dataclass
class StageRecord:
    name: str
    #: pending | running | succeeded | cached | reused | failed | skipped | interrupted
    status: str = "pending"
    reason: str = ""
    cache_key: str = ""
    #: A cached stage that missed: what changed against the newest entry of the stage.
    cache_miss: str = ""
    #: The checkpoint line (store URI) the stage's attempts restore from and commit to.
    checkpoint_line: str = ""
    outputs: dict[str, str] = field(default_factory=dict)
    output_hashes: dict[str, str] = field(default_factory=dict)
    attempts: list[AttemptRecord] = field(default_factory=list)
    seconds: float = 0.0
    #: The attempt running now (its verdict ``running``), ``None`` between attempts: what the
    #: live table shows, where ``attempts`` holds only the ended ones.  Not kept on disk.
    current: AttemptRecord | None = None


@dataclass
class RunRecord:
    run_id: str
    pipeline: str
    source: str
    started: float
    params: dict[str, str]
    status: str = "running"
    finished: float = 0.0
    resumed_from: str = ""
    stages: dict[str, StageRecord] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for stage in data["stages"].values():
            del stage["current"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        stages = {
            name: StageRecord(**{**s, "attempts": [AttemptRecord(**a) for a in s["attempts"]]})
            for name, s in data.get("stages", {}).items()
        }
        return cls(**{**data, "stages": stages})


def write_json_atomic(path: Path, data: Any, durable: bool = True) -> None:
    """Write ``data`` so that a crash leaves the old or the new file, never a torn one.

    ``durable`` also survives power loss (fsync); progress updates skip it, as they are
    superseded within seconds and fsync costs milliseconds each.
    """
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True), durable=durable)


def runs_dir(home: Path) -> Path:
    return home / "runs"


def load_run(home: Path, run_id: str) -> RunRecord | None:
    path = runs_dir(home) / run_id / "run.json"
    try:
        return RunRecord.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def list_runs(home: Path) -> list[RunRecord]:
    found = []
    base = runs_dir(home)
    if not base.is_dir():
        return []
    for entry in sorted(base.iterdir()):
        record = load_run(home, entry.name)
        if record is not None:
            found.append(record)
    return sorted(found, key=lambda r: r.started)


def last_lines(path: str | Path, count: int, *,
               skip_prefix: str | tuple[str, ...] | None = None) -> list[str]:
    """The last ``count`` non-empty lines of a log (read from its end: logs can be large)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 4096 * max(1, count)))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return []
    lines = [ln.rstrip() for ln in text.splitlines()
             if ln.strip() and not (skip_prefix and ln.startswith(skip_prefix))]
    return lines[-count:]
