"""The session's control plane (tests/e2e/cluster.py) with its nodes and the pod-fate watcher.

Started once per run by the first e2e test that asks for it, and stopped as soon as the last
test of this package is done (package scope). Under ``--full -n 3`` the whole package is one
lane on one xdist worker (tests/conftest.py, SERIAL_LANES), so the fate watcher, whose re-list of
every workflow pod each 30 s (thousands after the 2,000-stage case) costs seconds of Python,
shares its process with no other test: in one process with the suite it once made a runtime
test's grace-period wait 2.7 s late. The teardown fails if any process outlives it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .cluster import Cluster, build_binaries
from .nodes import busy_pods, fleet, spot_labels


@dataclass
class E2E:
    cluster: Cluster
    fates: Any  # fates.FateWatcher, imported once the `kubernetes` client is known to be there


def _requirements_or_skip(shared_dir: Path) -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed; the e2e tests apply manifests with it")
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed; the e2e API server's keys are made with it")
    pytest.importorskip("kubernetes", reason="the e2e tests need the `kubernetes` client "
                                             "(pip install -e '.[test]')")


@pytest.fixture(scope="session")
def control_plane_binaries(shared_dir: Path) -> dict[str, Path]:
    _requirements_or_skip(shared_dir)
    return build_binaries()


@pytest.fixture(scope="package")
def e2e(control_plane_binaries: dict[str, Path],
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    from .fates import FateWatcher

    state = tmp_path_factory.mktemp("cluster")
    cluster = Cluster.start(state, control_plane_binaries)
    watcher = FateWatcher(str(cluster.kubeconfig), spot_labels=spot_labels())
    try:
        t0 = time.monotonic()
        cluster.kubectl("create", "-f", "-", input=_dump(fleet()))
        cluster.kubectl("wait", "--for=condition=Ready", "--timeout=60s", "node", "--all")
        cluster.kubectl("create", "-f", "-", input=_dump(busy_pods()))
        cluster.timings["nodes"] = time.monotonic() - t0
        watcher.start()
        yield E2E(cluster, watcher)
    finally:
        watcher.stop()
        cluster.stop()
    left = cluster.alive()
    assert not left, f"control-plane processes outlived the session: {left}"


def _dump(docs: list[dict[str, object]]) -> str:
    import yaml

    return yaml.safe_dump_all(docs)
