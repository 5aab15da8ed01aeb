"""``-p NAME=VALUE`` on the command line: one parser for `durapipe run` and `durapipe submit`."""

from __future__ import annotations

from collections.abc import Sequence


def parse_assignments(items: Sequence[str]) -> dict[str, str] | str:
    """The ``NAME=VALUE`` pairs (a later one wins), or the message naming the malformed one.

    Only the first ``=`` splits: a value may hold ``=`` itself (``-p filter=a=b``)."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            return f"-p {item!r}: expected NAME=VALUE"
        out[name] = value
    return out
