"""Cron schedules and time zones as Argo's CronWorkflow controller reads them.

Argo parses `schedule` with robfig/cron's standard parser (five fields, or a descriptor) and
`timezone` with Go's `time.LoadLocation` (the IANA database). These checks follow the same
rules, so that `durapipe check` rejects what the cluster would, e.g. ``"99 99 * * *"`` or
``"Europe/Berln"``.
"""

from __future__ import annotations

import re
import zoneinfo

DESCRIPTORS = frozenset({"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight",
                         "@hourly"})
_EVERY_RE = re.compile(r"^@every\s+(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$")
_MONTHS = {m: i for i, m in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1)}
_DAYS = {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
#: (name, lowest, highest, names) of the five fields, in order.
_NO_NAMES: dict[str, int] = {}
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (("minute", 0, 59, _NO_NAMES), ("hour", 0, 23, _NO_NAMES),
           ("day of month", 1, 31, _NO_NAMES),
           ("month", 1, 12, _MONTHS), ("day of week", 0, 6, _DAYS))
_TZ_PREFIX_RE = re.compile(r"^(CRON_TZ|TZ)=(\S+)\s+")


def cron_problem(schedule: str) -> str | None:
    """Why Argo would refuse ``schedule``, or None if it parses."""
    text = schedule.strip()
    prefix = _TZ_PREFIX_RE.match(text)
    if prefix:
        problem = timezone_problem(prefix[2])
        if problem:
            return problem
        text = text[prefix.end():]
    if text.startswith("@"):
        if text in DESCRIPTORS or _EVERY_RE.match(text):
            return None
        return f"unknown descriptor {text.split()[0]!r}"
    fields = text.split()
    if len(fields) != 5:
        return f"expected 5 fields (minute hour day-of-month month day-of-week), got {len(fields)}"
    for field, (name, lo, hi, names) in zip(fields, _FIELDS):
        problem = _field_problem(field, lo, hi, names)
        if problem:
            return f"{name} {field!r}: {problem}"
    return None


def _field_problem(field: str, lo: int, hi: int, names: dict[str, int]) -> str | None:
    for part in field.split(","):
        base, _, step = part.partition("/")
        if step and (not step.isdigit() or int(step) == 0):
            return f"step {step!r} must be a positive number"
        if base in ("*", "?"):
            continue
        start, _, end = base.partition("-")
        bounds = []
        for value in (start, end) if end else (start,):
            number = names.get(value.lower()) if not value.isdigit() else int(value)
            if number is None:
                return f"{value!r} is not a number" + (" or a name" if names else "")
            if not lo <= number <= hi:
                return f"{number} is outside {lo}-{hi}"
            bounds.append(number)
        if len(bounds) == 2 and bounds[0] > bounds[1]:
            return f"range {base!r} runs backwards"
    return None


def timezones() -> set[str]:
    """Every zone name this machine's IANA database knows (for a did-you-mean hint)."""
    return zoneinfo.available_timezones()


def timezone_problem(name: str) -> str | None:
    """Why ``name`` is not an IANA time zone, or None (also where this machine has no zone
    database to ask: then the cluster is the judge)."""
    if name == "UTC":
        return None
    try:
        zoneinfo.ZoneInfo(name)
    except zoneinfo.ZoneInfoNotFoundError:
        if not zoneinfo.available_timezones():
            return None
        return f"{name!r} is not an IANA time zone"
    except ValueError as exc:
        return f"{name!r} is not a time zone name ({exc})"
    return None
