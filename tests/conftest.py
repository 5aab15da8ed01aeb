"""Shared test configuration.

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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
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
