"""Fixtures for compiler tests: the strict validator (snapshot fixtures are in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def validator(shared_dir: Path) -> Any:
    """Argo v4.1.2's full CRD schemas, made strict (unknown fields rejected)."""
    from argo_schema.strict import StrictValidator

    return StrictValidator.for_crd_dir(shared_dir / "argo" / "v4.1.2" / "crds")
