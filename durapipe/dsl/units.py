"""Unit literals: memory quantities, CPU amounts and durations.

A unit literal (``256Gi``, ``30m``) is one token in the grammar; the field it is assigned to
decides what it means.  These functions turn the literal (or the equivalent Python value given
to the builder) into one canonical integer, so that ``memory = 256Gi`` and
``memory = "274877906944"`` build equal models, and render canonical text back.
"""

from __future__ import annotations

import math
import re

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400}

_QUANTITY_RE = re.compile(r"^(?P<num>\d+(?:\.\d+)?)(?P<unit>[A-Za-z]*)$")
_DURATION_PART_RE = re.compile(r"(\d+)([smhd])")

MEMORY_UNITS = tuple(_BINARY) + tuple(_DECIMAL)
#: How memory units are often misspelt, and the Kubernetes unit meant: ``gb`` and ``GB`` as
#: ``Gi``, as memory is sized in binary units (``16GB`` of RAM is 16 GiB).
_MEMORY_SPELLINGS = {**{f"{u[0].lower()}ib": u for u in _BINARY},
                     **{f"{u[0].lower()}b": u for u in _BINARY},
                     **{u[0].lower(): u for u in _BINARY if u[0] not in "mk"}}
DURATION_UNITS = tuple(_DURATION)


class UnitError(ValueError):
    """A literal that is not a valid quantity for the field; the message is user-facing, and
    ``help`` (when set) is the fix to suggest."""

    def __init__(self, message: str, help: str | None = None) -> None:
        super().__init__(message)
        self.help = help


#: Kubernetes quantities hold at most 2^63 - 1 (8Ei of memory); Argo reads durations with Go's
#: ``time.ParseDuration``, whose nanoseconds stop at 2^63 - 1 (about 292 years).
MAX_QUANTITY = 2**63 - 1
MAX_SECONDS = MAX_QUANTITY // 10**9


def _at_most(amount: int, limit: int, too_large: str) -> int:
    if amount > limit:
        raise UnitError(too_large)
    return amount


def parse_bytes(value: object) -> int:
    """Bytes from ``256Gi``, ``1.5Gi`` or ``500M``: a number *and* a unit.

    A bare number is refused, in ``.pipe`` files and from the Python builder alike: Kubernetes
    reads ``memory: 64`` as 64 bytes, which is never what ``memory = 64`` meant, and the pod
    would be OOM-killed at start.  Accepting ``int`` in the builder alone would make the same
    value mean two things depending on where it was written.
    """
    return _at_most(_bytes(value), MAX_QUANTITY, "a memory size must be less than 8Ei")


def _bytes(value: object) -> int:
    if isinstance(value, bool):
        raise UnitError("expected a memory size such as 16Gi, not a boolean")
    if isinstance(value, int):
        raise _unitless(str(value))
    if not isinstance(value, str):
        raise UnitError(f"expected a memory size such as 16Gi, got {type(value).__name__}")
    match = _QUANTITY_RE.match(value.strip())
    if match is None:
        raise UnitError(f"{value!r} is not a memory size; write a number and a unit, e.g. 16Gi")
    unit = match["unit"]
    if unit == "":
        raise _unitless(match["num"])
    if unit in _BINARY:
        factor = _BINARY[unit]
    elif unit in _DECIMAL:
        factor = _DECIMAL[unit]
    else:
        near = _MEMORY_SPELLINGS.get(unit.lower())
        raise UnitError(
            f"unknown memory unit {unit!r}; use one of {', '.join(MEMORY_UNITS)}",
            help=f"did you mean `{match['num']}{near}`?" if near else None,
        )
    number: str = match["num"]
    if "." in number:
        whole, frac = number.split(".")
        denominator: int = 10 ** len(frac)
        scaled = int(whole) * factor + (int(frac) * factor) // denominator
        if (int(frac) * factor) % denominator:
            raise UnitError(f"{value!r} is not a whole number of bytes")
        return scaled
    return int(number) * factor


def _unitless(number: str) -> UnitError:
    return UnitError(f"a memory size needs a unit: `{number}` alone would be {number} bytes",
                     help=f"units are required: write {number}Gi, {number}Mi or {number}M")


def format_bytes(value: int) -> str:
    """Canonical Kubernetes quantity: the largest binary unit that divides exactly."""
    for unit, factor in reversed(_BINARY.items()):
        if value and value % factor == 0:
            return f"{value // factor}{unit}"
    return str(value)


def parse_millicpu(value: object) -> int:
    """Millicores from ``8``, ``0.5`` or ``"500m"``.

    A bare unit literal ``500m`` would read as 500 minutes in a duration field, so CPU takes
    plain numbers or the quoted Kubernetes form.
    """
    return _at_most(_millicpu(value), MAX_QUANTITY,
                    f"a CPU amount must be at most {MAX_QUANTITY // 1000} cores")


def _millicpu(value: object) -> int:
    if isinstance(value, bool):
        raise UnitError("expected a CPU count such as 8 or 0.5, not a boolean")
    if isinstance(value, (int, float)) and math.isfinite(value):
        milli = round(value * 1000)
    elif isinstance(value, str) and re.fullmatch(r"\d+m", value.strip()):
        milli = int(value.strip()[:-1])
    elif isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)?", value.strip()):
        milli = round(float(value) * 1000)
    else:
        raise UnitError(f"{value!r} is not a CPU amount; write cores (8, 0.5) or \"500m\"")
    if milli <= 0:
        raise UnitError("a CPU amount must be positive")
    return milli


def format_millicpu(milli: int) -> str:
    """Canonical Kubernetes CPU quantity."""
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def parse_seconds(value: object) -> int:
    """Seconds from ``30s``, ``30m``, ``12h``, ``7d``, ``1h30m`` or a plain integer."""
    return _at_most(_seconds(value), MAX_SECONDS,
                    "a duration can be at most 106751d (about 292 years)")


def _seconds(value: object) -> int:
    if isinstance(value, bool):
        raise UnitError("expected a duration such as 30m, not a boolean")
    if isinstance(value, int):
        if value < 0:
            raise UnitError("a duration cannot be negative")
        return value
    if not isinstance(value, str):
        raise UnitError(f"expected a duration such as 30m, got {type(value).__name__}")
    text = value.strip()
    if text.isdigit():
        return int(text)
    parts = _DURATION_PART_RE.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise UnitError(
            f"{value!r} is not a duration; write a number and one of s, m, h, d (e.g. 30m, 12h)"
        )
    return sum(int(n) * _DURATION[u] for n, u in parts)


def format_seconds(seconds: int) -> str:
    """Canonical duration text that Go's ``time.ParseDuration`` also accepts (no ``d``)."""
    if seconds == 0:
        return "0s"
    out = []
    for unit, factor in (("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= factor:
            out.append(f"{seconds // factor}{unit}")
            seconds %= factor
    return "".join(out)


def format_duration_literal(seconds: int) -> str:
    """The shortest ``.pipe`` literal for a duration (``d`` allowed), used by ``durapipe fmt``."""
    for unit, factor in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % factor == 0:
            return f"{seconds // factor}{unit}"
    return f"{seconds}s"
