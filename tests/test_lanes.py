"""The full tier's lanes under xdist (``pytest --full -n 3``, tests/conftest.py).

The control plane and the real node are each started once by a package-scoped fixture: if
xdist split either package over two workers, each worker would start its own, and the two
real nodes would fight over the machine. These tests drive the scheduler that conftest hands
xdist, as xdist's controller does (collections in, ``send_runtest_some`` out, completions
back), and check that each lane goes whole, in order, to a worker of its own, before anything
else is handed out, and that everything else still runs exactly once.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import conftest as suite

pytest.importorskip("xdist", reason="the lanes are xdist's scheduling (pip install -e '.[test]')")

CONTROL_PLANE = [f"tests/e2e/test_cli.py::test_{i}" for i in range(3)] + \
    [f"tests/e2e/test_scenarios.py::test_scenario[case{i}]" for i in range(4)]
REAL_NODE = ["tests/e2e/test_images.py::test_layout",
             "tests/e2e/test_images.py::test_every_image_imports_into_containerd",
             "tests/realnode/test_node.py::test_ready",
             "tests/realnode/test_prep_train_eval.py::test_runs",
             "tests/realnode/test_zz_node_lost.py::test_lost"]
#: Modules larger than either lane: xdist alone would hand these out first.
REST = [f"tests/compiler/test_big.py::test_{i}" for i in range(40)] + \
    [f"tests/dsl/test_parse.py::test_{i}" for i in range(12)] + \
    ["tests/argo/test_harness.py::test_a", "tests/argo/test_harness.py::test_b",
     "tests/runner/test_local_examples.py::test_torch"]
#: Collection order under --full: the fast tier first, the lanes' tests last.
COLLECTION = [REAL_NODE[0], *REST, *CONTROL_PLANE, *REAL_NODE[1:]]


class Worker:
    """What the scheduler sees of one of xdist's workers."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.queue: list[int] = []  # indexes sent and not yet run
        self.ran: list[str] = []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.queue.extend(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True


def scheduler(workers: int) -> Any:
    options = {"tx": [f"{workers}*popen"], "numprocesses": workers}
    config = SimpleNamespace(getoption=lambda name: name == "--full",
                             getvalue=options.__getitem__,
                             option=SimpleNamespace(loadscopereorder=True))
    return suite.pytest_xdist_make_scheduler(config, None)  # type: ignore[arg-type]


def run_all(workers: int) -> list[Worker]:
    """Every test to its end, each worker running its queue in order, one test at a time."""
    sched = scheduler(workers)
    nodes = [Worker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, COLLECTION)
    sched.schedule()
    while any(node.queue for node in nodes):
        for node in nodes:
            if node.queue:
                index = node.queue.pop(0)
                node.ran.append(COLLECTION[index])
                sched.mark_test_complete(node, index, 0.0)
    assert sched.tests_finished
    return nodes


@pytest.mark.parametrize("workers", [2, 3])
def test_each_lane_runs_whole_in_order_first_on_a_worker_of_its_own(workers: int) -> None:
    nodes = run_all(workers)
    control, real = nodes[0], nodes[1]
    assert control.ran[:len(CONTROL_PLANE)] == CONTROL_PLANE
    assert real.ran[:len(REAL_NODE)] == REAL_NODE  # the image test before the node starts
    for lane, worker in ((CONTROL_PLANE, control), (REAL_NODE, real)):
        assert not [t for node in nodes if node is not worker for t in node.ran if t in lane]


@pytest.mark.parametrize("workers", [2, 3])
def test_everything_else_runs_once_and_a_module_stays_on_one_worker(workers: int) -> None:
    nodes = run_all(workers)
    ran = [t for node in nodes for t in node.ran]
    assert sorted(ran) == sorted(COLLECTION)
    for module in {t.split("::")[0] for t in REST}:
        assert len({node.gateway.id for node in nodes for t in node.ran
                    if t.startswith(module + "::")}) == 1, module
    if workers == 3:  # the third worker starts on the rest at once, largest module first
        assert nodes[2].ran[0].startswith("tests/compiler/test_big.py::")


def test_the_fast_tier_keeps_xdists_own_scheduling() -> None:
    config = SimpleNamespace(getoption=lambda name: False)
    assert suite.pytest_xdist_make_scheduler(config, None) is None  # type: ignore[arg-type]


def test_every_test_file_of_the_two_packages_is_in_its_lane() -> None:
    tests = suite.REPO_ROOT / "tests"
    for path in sorted((tests / "e2e").glob("test_*.py")):
        expected = "real node" if path.name == "test_images.py" else "control plane"
        assert suite.serial_lane(f"tests/e2e/{path.name}::t") == expected, path
    for path in sorted((tests / "realnode").glob("test_*.py")):
        assert suite.serial_lane(f"tests/realnode/{path.name}::t") == "real node", path
    assert suite.serial_lane("tests/compiler/test_lowering.py::t") is None


def test_a_test_that_starts_a_machine_outside_its_lane_is_refused() -> None:
    items = [SimpleNamespace(nodeid="tests/cluster/test_x.py::test_a", fixturenames=["e2e"]),
             SimpleNamespace(nodeid="tests/e2e/test_images.py::test_b", fixturenames=["real"]),
             SimpleNamespace(nodeid="tests/e2e/test_cli.py::test_c", fixturenames=["real"]),
             SimpleNamespace(nodeid="tests/e2e/test_cli.py::test_d", fixturenames=["e2e"])]
    misplaced = suite.misplaced_in_lanes(items)  # type: ignore[arg-type]
    assert len(misplaced) == 2
    assert misplaced[0].startswith("tests/cluster/test_x.py::test_a uses the fixture 'e2e' "
                                   "but runs in lane None, not 'control plane'")
    assert misplaced[1].startswith("tests/e2e/test_cli.py::test_c uses the fixture 'real'")
