"""What `durapipe run` shows: a live table on a terminal, plain lines elsewhere, a summary."""

from __future__ import annotations

import sys
import threading
import time
from typing import IO

from durapipe.runner.records import AttemptRecord, RunRecord, StageRecord, last_lines
from durapipe.runtime import contract

_SYMBOL = {"pending": "·", "running": "▶", "succeeded": "✓", "cached": "↺", "reused": "↺",
           "failed": "✗", "skipped": "-", "interrupted": "!"}


#: The runtime's own lines in an attempt's log (verdicts), which the summary states in words:
#: the live table shows the program's last line instead.
_RUNTIME_LINES = (contract.VERDICT_TAG, contract.AGENT_VERDICT_TAG)


def _last_line(path: str) -> str:
    lines = last_lines(path, 1, skip_prefix=_RUNTIME_LINES)
    return lines[-1].strip() if lines else ""


def _shown_attempt(stage: StageRecord) -> AttemptRecord | None:
    """The attempt the live table shows: the running one, else the last that ended."""
    return stage.current or (stage.attempts[-1] if stage.attempts else None)


def _attempt_text(stage: StageRecord) -> str:
    last = _shown_attempt(stage)
    if last is None:
        return ""
    rung = f" rung {last.rung}" + (f" ({last.memory})" if last.memory else "")
    return f"attempt #{last.number}{rung if last.memory else ''}"


class View:
    """Receives runner events; prints them as lines, or redraws a table on a TTY."""

    def __init__(self, record_of: RunRecord | None = None, stream: IO[str] | None = None,
                 live: bool | None = None):
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.record: RunRecord | None = record_of
        self._started: dict[str, float] = {}
        self._drawn = 0
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._warned: set[str] = set()

    def attach(self, record: RunRecord) -> None:
        self.record = record
        if self.live:
            threading.Thread(target=self._refresh, daemon=True).start()

    def close(self) -> None:
        self._done.set()
        if self.live:
            self._draw()

    def __call__(self, event: str, stage: StageRecord, text: str) -> None:
        with self._lock:
            if event == "start":
                self._started[stage.name] = time.monotonic()
            if event == "warn":
                if text in self._warned:
                    return
                self._warned.add(text)
                self._print(f"warning: {text}")
                return
            if self.live:
                return
            line = {
                "start": f"{stage.name}: started"
                         + (f" (cache miss: {stage.cache_miss})" if stage.cache_miss else ""),
                "attempt": f"{stage.name}: attempt "
                           f"#{stage.attempts[-1].number if stage.attempts else 0} "
                           f"{stage.attempts[-1].verdict if stage.attempts else ''}"
                           + (f" [{stage.attempts[-1].fault}]"
                              if stage.attempts and stage.attempts[-1].fault else "")
                           + f" -> {text}",
                "cached": f"{stage.name}: skipped, {text}",
                "reused": f"{stage.name}: reused, {text}",
                "skip": f"{stage.name}: not run, {text}",
                "end": f"{stage.name}: {stage.status}" + (f" ({text})" if text else ""),
            }.get(event)
            if line:
                self._print(line)

    def _print(self, line: str) -> None:
        if self.live and self._drawn:
            self.stream.write(f"\x1b[{self._drawn}F\x1b[J")
            self._drawn = 0
        self.stream.write(line + "\n")
        self.stream.flush()

    def _refresh(self) -> None:
        while not self._done.wait(0.5):
            self._draw()

    def _draw(self) -> None:
        if self.record is None:
            return
        with self._lock:
            rows = []
            for stage in self.record.stages.values():
                elapsed = ""
                if stage.name in self._started:
                    seconds = stage.seconds or time.monotonic() - self._started[stage.name]
                    elapsed = f"{seconds:6.1f}s"
                shown = _shown_attempt(stage)
                tail = _last_line(shown.log) if shown is not None else ""
                if stage.status == "running":
                    tail = tail or "..."
                rows.append(f" {_SYMBOL.get(stage.status, '?')} {stage.name:<20} "
                            f"{stage.status:<11} {_attempt_text(stage):<24} {elapsed:>8}  "
                            f"{(stage.reason or tail)[:60]}")
            if self._drawn:
                self.stream.write(f"\x1b[{self._drawn}F\x1b[J")
            self.stream.write("\n".join(rows) + "\n")
            self.stream.flush()
            self._drawn = len(rows)


def summary(record: RunRecord) -> str:
    """The final table: one row per stage, then one per attempt with its verdict."""
    lines = [f"run {record.run_id}: {record.status}"
             + (f" (resuming {record.resumed_from})" if record.resumed_from else ""),
             f"{'stage':<20} {'status':<11} {'attempts':>8} {'seconds':>8}  detail"]
    for stage in record.stages.values():
        detail = stage.reason
        last = stage.attempts[-1] if stage.attempts else None
        if stage.status == "failed" and last is not None and last.verdict not in detail:
            detail = f"{last.verdict}: {detail}" if detail else last.verdict
        lines.append(f"{stage.name:<20} {stage.status:<11} {len(stage.attempts):>8} "
                     f"{stage.seconds:>8.1f}  {detail}")
        if stage.status == "failed" and last is not None and last.tail:
            # Why it failed, without opening the attempt log.
            lines.append(f"    last output of #{last.number} ({last.log}):")
            lines.extend(f"    | {line}" for line in last.tail.splitlines())
        for attempt in stage.attempts:
            memory = f" memory {attempt.memory}" if attempt.memory else ""
            resumed = (f", resumed from checkpoint {attempt.resumed_from}"
                       if attempt.resumed_from else "")
            fault = f" [injected {attempt.fault}]" if attempt.fault else ""
            lines.append(f"    #{attempt.number} rung {attempt.rung}{memory}: {attempt.verdict}"
                         f" after {attempt.seconds:.1f}s{fault}{resumed}")
    lines.append(f"logs: .durapipe/runs/{record.run_id}/")
    return "\n".join(lines)
