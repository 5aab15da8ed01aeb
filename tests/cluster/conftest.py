"""The fake Kubernetes API every cluster test talks to (tests/cluster/fake_api.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.fake_api import FakeApi, fake_api


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with fake_api() as server:
        yield server
