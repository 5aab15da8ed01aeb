"""What an attempt's first restore found, said by the runtime itself: the line it restored
from, the commit and its step.  The cluster reads the file as the pod's ``resumed-from``
output parameter (``durapipe status``), the local runner from the attempt's directory; both
print it with :func:`describe`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from durapipe.runtime import contract


def _progress(value: object) -> int | float | str | None:
    return value if isinstance(value, (int, float, str)) and not isinstance(value, bool) else None


def write(path: str | os.PathLike[str], line: str, seq: int | None,
          metadata: dict[str, Any] | None) -> None:
    """Write the report atomically: a reader (Argo's wait container collecting outputs as the
    pod ends) sees the whole object or none."""
    target = Path(path)
    metadata = metadata or {}
    record = dict(zip(contract.RESUME_REPORT_KEYS, (
        line, seq, _progress(metadata.get("step")), _progress(metadata.get("epoch")))))
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary.write_text(json.dumps(record, sort_keys=True))
    os.replace(temporary, target)


def parse(text: str) -> dict[str, Any] | None:
    """The report in ``text``, or ``None`` when it is empty or not one (an older runtime,
    an output Argo defaulted to "")."""
    try:
        record = json.loads(text)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("line"), str):
        return None
    return record


def describe(record: dict[str, Any] | None) -> str:
    """``#12 (step 8)`` or ``#12 (epoch 3)``; ``""`` when nothing was restored (a fresh line)."""
    if record is None or not isinstance(record.get("seq"), int):
        return ""
    progress = [f"{key} {record[key]}" for key in ("step", "epoch")
                if record.get(key) is not None]
    return f"#{record['seq']}" + (f" ({', '.join(progress)})" if progress else "")


def read_text(path: Path) -> str | None:
    """:func:`describe` of the report at ``path``; ``None`` when the attempt wrote none."""
    try:
        record = parse(path.read_text())
    except OSError:
        return None
    return None if record is None else describe(record)
