"""Fixtures for compiler tests: a single-file YAML snapshot extension and the strict validator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from syrupy.assertion import SnapshotAssertion
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode


class YamlSnapshot(SingleFileSnapshotExtension):
    """One ``.yaml`` file per snapshot: the compiled output exactly as `durapipe compile` writes it."""

    _write_mode = WriteMode.TEXT
    file_extension = "yaml"


@pytest.fixture
def snapshot_yaml(snapshot: SnapshotAssertion) -> SnapshotAssertion:
    return snapshot.use_extension(YamlSnapshot)


@pytest.fixture(scope="session")
def validator(shared_dir: Path) -> Any:
    """Argo v4.1.2's full CRD schemas, made strict (unknown fields rejected)."""
    from argo_schema.strict import StrictValidator

    return StrictValidator.for_crd_dir(shared_dir / "argo" / "v4.1.2" / "crds")
