from __future__ import annotations

import re

import pytest

from durapipe.dsl import units


@pytest.mark.parametrize(("text", "expected"), [
    ("256Gi", 256 * 2**30), ("1Ti", 2**40), ("512Mi", 512 * 2**20), ("1.5Gi", 3 * 2**29),
    ("500M", 500_000_000), ("1k", 1000),
])
def test_parse_bytes(text: object, expected: int) -> None:
    assert units.parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["16GB", "Gi", "-1Gi", "1.1", True, 1.5])
def test_parse_bytes_rejects(bad: object) -> None:
    with pytest.raises(units.UnitError):
        units.parse_bytes(bad)


@pytest.mark.parametrize("bare", [64, "64", " 64 ", 0])
def test_a_bare_number_is_not_a_memory_size(bare: object) -> None:
    """`memory = 64` would reach Kubernetes as 64 bytes: refused with the units as the fix,
    from a .pipe file (int token or string) and from the builder (int) alike."""
    with pytest.raises(units.UnitError) as caught:
        units.parse_bytes(bare)
    assert "needs a unit" in str(caught.value)
    assert caught.value.help is not None and "Gi" in caught.value.help


def test_format_bytes_picks_the_largest_exact_unit() -> None:
    assert [units.format_bytes(v) for v in (2**40, 3 * 2**29, 1000, 0)] == \
        ["1Ti", "1536Mi", "1000", "0"]


@pytest.mark.parametrize(("text", "expected"), [
    ("30s", 30), ("30m", 1800), ("12h", 43200), ("7d", 604800), ("1h30m", 5400), ("90", 90),
])
def test_parse_seconds(text: str, expected: int) -> None:
    assert units.parse_seconds(text) == expected


@pytest.mark.parametrize("bad", ["30x", "m30", "1h 30m", "", "1.5h"])
def test_parse_seconds_rejects(bad: str) -> None:
    with pytest.raises(units.UnitError):
        units.parse_seconds(bad)


def test_format_seconds_never_emits_days() -> None:
    # Go's time.ParseDuration (used by Argo) rejects "d".
    assert units.format_seconds(604800) == "168h"
    assert units.format_seconds(5430) == "1h30m30s"


@pytest.mark.parametrize(("value", "milli"), [(8, 8000), (0.5, 500), ("500m", 500), ("2", 2000)])
def test_parse_millicpu(value: object, milli: int) -> None:
    assert units.parse_millicpu(value) == milli
    assert units.parse_millicpu(units.format_millicpu(milli)) == milli


@pytest.mark.parametrize(("parse", "largest", "too_large", "message"), [
    (units.parse_bytes, "7Ei", "8Ei", "a memory size must be less than 8Ei"),
    (units.parse_bytes, "9223372036854775k", "9223372036854776k",
     "a memory size must be less than 8Ei"),
    (units.parse_millicpu, 9223372036854775, 9223372036854776,
     "a CPU amount must be at most 9223372036854775 cores"),
    (units.parse_seconds, "106751d", "106752d",
     "a duration can be at most 106751d (about 292 years)"),
])
def test_amounts_stop_where_kubernetes_and_go_stop(
        parse: object, largest: object, too_large: object, message: str) -> None:
    """Kubernetes quantities are at most 2^63 - 1; Argo parses durations as Go's int64 ns."""
    assert callable(parse)
    parse(largest)
    with pytest.raises(units.UnitError, match=re.escape(message)):
        parse(too_large)


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_cpu_rejects_non_finite_numbers(bad: float) -> None:
    with pytest.raises(units.UnitError, match="is not a CPU amount"):
        units.parse_millicpu(bad)


@pytest.mark.parametrize(("items", "expected"), [
    (["lr=0.1", "name=a=b", "lr=0.2"], {"lr": "0.2", "name": "a=b"}),
    (["empty="], {"empty": ""}),
    (["=x"], "-p '=x': expected NAME=VALUE"),
    (["novalue"], "-p 'novalue': expected NAME=VALUE"),
])
def test_one_parser_reads_p_for_run_and_submit(items: list[str],
                                               expected: dict[str, str] | str) -> None:
    from durapipe.dsl.arguments import parse_assignments

    assert parse_assignments(items) == expected
