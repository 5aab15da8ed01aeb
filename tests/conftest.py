"""Shared test configuration.

Two tiers.  ``pytest -q`` is the fast tier: unit, snapshot, property and validator tests, no Go
build and no control plane.  ``pytest -q --full`` adds the tests marked with a ``FULL_TIER_MARKERS``
marker: Argo's own Go code in-process (``harness``), the control plane (``e2e``), the real node
(``realnode``) and whole framework trainings (``training``); CI runs that.  The fast tier says how many it deselected, and a test that builds a
Go tool without such a marker fails there (``tests/argo/argo_tools.py``), so it cannot slow the
fast tier down unnoticed.

Tests that need something optional (Go, ``../shared``, a memory cgroup, torch) skip with a
reason.  CI sets ``DURAPIPE_STRICT_SKIPS=1`` because it is expected to have all of those, and
then every such skip becomes a failure.  Only tests marked ``gpu`` may still skip there: CI has
no accelerator.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from syrupy.assertion import SnapshotAssertion
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED = REPO_ROOT.parent / "shared"
STRICT_SKIPS = os.environ.get("DURAPIPE_STRICT_SKIPS") == "1"
#: Markers of the tests that only ``--full`` runs, with why each is not in the fast tier.
FULL_TIER_MARKERS = {
    "harness": "runs Argo's Go code (tools/argo-check, tools/argo-sim), built from source on first use",
    "e2e": "runs on the control plane of tests/e2e, built from source on first use",
    "realnode": "runs real containers on a kubelet and containerd started by the test",
    "training": "trains a real model end to end with a framework, interrupted and resumed (minutes)",
}
#: Read by the Go tool builders: in the fast tier a build means a test lacks its marker.
TIER_ENV = "DURAPIPE_TEST_TIER"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--full", action="store_true", default=False,
                     help="run every tier: also the tests marked "
                          + ", ".join(sorted(FULL_TIER_MARKERS)) + " (what CI runs)")


def pytest_configure(config: pytest.Config) -> None:
    os.environ[TIER_ENV] = "full" if config.getoption("--full") else "fast"


#: The order ``--full`` runs the tiers in: the fast tier first, so that it runs while
#: ``tests/prebuild.py`` (started by ``.ci/run``) builds the Go tools, the control plane and the
#: real node's images on the other core, then each tier in the order its builds finish.  Within a
#: tier the order stays the files' (``test_zz_node_lost.py`` last on its node).
TIER_ORDER = ("fast", "harness", "training", "e2e", "realnode")


def _tier_rank(item: pytest.Item) -> int:
    return max((TIER_ORDER.index(m) for m in FULL_TIER_MARKERS if item.get_closest_marker(m)),
               default=0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--full"):
        items.sort(key=_tier_rank)
        misplaced = misplaced_in_lanes(items)
        if misplaced:
            raise pytest.UsageError("\n".join(misplaced))
        return
    keep: list[pytest.Item] = []
    full_only: list[pytest.Item] = []
    for item in items:
        marked = any(item.get_closest_marker(m) for m in FULL_TIER_MARKERS)
        (full_only if marked else keep).append(item)
    if full_only:
        config.hook.pytest_deselected(items=full_only)
        items[:] = keep
        config.stash[_FULL_ONLY] = len(full_only)


_FULL_ONLY = pytest.StashKey[int]()


#: The lanes of ``--full -n 3`` (what CI runs): tests that must run one after another on one
#: xdist worker, by node id prefix, the first match winning. The control plane and the real
#: node are each started by a package-scoped fixture and stopped after the package's last test:
#: split over two workers, each would start its own. The image test's private containerd puts
#: its shims' sockets under /run/containerd, which the real node's teardown sweeps and its
#: leftover check reads, so it runs in the real node's lane, before the node starts. The rest
#: of the suite (fast, harness, training) is spread over the workers by module, so it runs
#: beside the two lanes, which mostly wait on the controllers' clocks.
SERIAL_LANES: tuple[tuple[str, str], ...] = (
    ("tests/e2e/test_images.py", "real node"),
    ("tests/e2e/", "control plane"),
    ("tests/realnode/", "real node"),
)
#: The order the lanes are handed out in: the longest first.
LANE_ORDER = ("control plane", "real node")
#: The fixtures that start one of those machines, with the lane every test using one must be in.
LANE_FIXTURES = {"e2e": "control plane", "real": "real node"}


def serial_lane(nodeid: str) -> str | None:
    return next((lane for prefix, lane in SERIAL_LANES if nodeid.startswith(prefix)), None)


def misplaced_in_lanes(items: list[pytest.Item]) -> list[str]:
    """Tests that start a control plane or a node outside that machine's lane."""
    return [f"{item.nodeid} uses the fixture {fixture!r} but runs in lane "
            f"{serial_lane(item.nodeid)!r}, not {lane!r} (tests/conftest.py, SERIAL_LANES)"
            for item in items
            for fixture, lane in LANE_FIXTURES.items()
            if fixture in getattr(item, "fixturenames", ()) and serial_lane(item.nodeid) != lane]


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """xdist's `loadgroup` would do this with ``xdist_group`` marks, but xdist 3.8 marks a group
    by rewriting ``item._nodeid``, which pytest 9 no longer reads (a node's id is ``_id``): the
    mark is silently ignored and every worker starts its own control plane. The lane is read
    off the node id instead, which is all the scheduler is given."""
    if not config.getoption("--full"):
        return None  # the fast tier: xdist's default per-test load balancing
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class LaneScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return serial_lane(nodeid) or nodeid.split("::", 1)[0]

        def _assign_work_unit(self, node: object) -> None:
            # The lanes first, each to a worker of its own: they are the run's longest chains
            # (the rest goes out largest module first, xdist's own order).
            lane = next((lane for lane in LANE_ORDER if lane in self.workqueue), None)
            if lane is not None:
                self.workqueue.move_to_end(lane, last=False)
            super()._assign_work_unit(node)

    return LaneScheduling(config, log)


def pytest_report_header(config: pytest.Config) -> str:
    if config.getoption("--full"):
        return "tier: full (every test)"
    return ("tier: fast (tests marked " + ", ".join(sorted(FULL_TIER_MARKERS))
            + " are deselected; --full runs them)")


#: Seconds spent per tier (setup, call and teardown: a control plane's start and a Go build
#: count where they happen) and tests per tier, so CI's report says where its budget goes.
_TIER_SECONDS: dict[str, float] = {}
_TIER_TESTS: dict[str, int] = {}


def _tier_of(item: pytest.Item) -> str:
    for marker in sorted(FULL_TIER_MARKERS):
        if item.get_closest_marker(marker) is not None:
            return marker
    return "fast"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # The tier travels in the report (xdist's workers send it): keywords would also hold
    # directory names such as tests/e2e's.
    tier = dict(report.user_properties).get("tier", "fast")
    _TIER_SECONDS[tier] = _TIER_SECONDS.get(tier, 0.0) + report.duration
    if report.when == "call":
        _TIER_TESTS[tier] = _TIER_TESTS.get(tier, 0) + 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    count = terminalreporter.config.stash.get(_FULL_ONLY, 0)
    if count:
        terminalreporter.write_line(f"fast tier: {count} tests of the full tier deselected "
                                    "(python3 -m pytest -q --full runs everything)")
    if _TIER_SECONDS:
        terminalreporter.write_line("time by tier: " + ", ".join(
            f"{tier} {int(seconds) // 60} min {int(seconds) % 60:02d} s "
            f"({_TIER_TESTS.get(tier, 0)} tests)"
            for tier, seconds in sorted(_TIER_SECONDS.items(), key=lambda kv: -kv[1])))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    report.user_properties.append(("tier", _tier_of(item)))
    if STRICT_SKIPS and report.skipped and item.get_closest_marker("gpu") is None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under DURAPIPE_STRICT_SKIPS=1 (CI must have this): {reason}"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``../shared`` beside the checkout; skips (fails in CI) where it is absent."""
    if not (SHARED / "argo").is_dir():
        pytest.skip(f"{SHARED} is absent (a user's clone); CI always has it")
    return SHARED


class TextSnapshot(SingleFileSnapshotExtension):
    """One ``.txt`` file per snapshot, so a diff of rendered diagnostics reads as text."""

    _write_mode = WriteMode.TEXT
    file_extension = "txt"


class YamlSnapshot(SingleFileSnapshotExtension):
    """One ``.yaml`` file per snapshot: compiled output exactly as `durapipe compile` writes it."""

    _write_mode = WriteMode.TEXT
    file_extension = "yaml"


@pytest.fixture
def snapshot_text(snapshot: SnapshotAssertion) -> SnapshotAssertion:
    return snapshot.use_extension(TextSnapshot)


@pytest.fixture
def snapshot_yaml(snapshot: SnapshotAssertion) -> SnapshotAssertion:
    return snapshot.use_extension(YamlSnapshot)
