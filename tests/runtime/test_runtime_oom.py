"""A real kernel OOM kill inside a memory cgroup is classified as host OOM.

The wrapper runs inside a fresh child memory cgroup with a low limit and its command allocates
far more.  This needs a writable memory cgroup: root, with cgroupfs mounted read-write (a privileged
container, or a VM); elsewhere the test skips with the reason, and CI turns that skip into a
failure.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from durapipe.runtime import contract
from durapipe.runtime.cgroup import MemoryCgroup, find_memory_cgroup
from durapipe.runtime.verdict import parse_verdict_line
from tests.runtime.runtime_helpers import child_env, runtime_cmd

LIMIT = 96 * 1024 * 1024


def _make_child_cgroup(parent: MemoryCgroup) -> tuple[Path, str]:
    """Create a child cgroup with a ``LIMIT`` memory limit; returns it and its procs file."""
    child = parent.path / f"durapipe-test-{uuid.uuid4().hex[:8]}"
    if parent.version == 1:
        child.mkdir()
        (child / "memory.limit_in_bytes").write_text(str(LIMIT))
        swap_limit = child / "memory.memsw.limit_in_bytes"
        if swap_limit.exists():
            swap_limit.write_text(str(LIMIT))
        return child, "cgroup.procs"
    _enable_memory_controller_v2(parent.path)
    child.mkdir()
    (child / "memory.max").write_text(str(LIMIT))
    if (child / "memory.swap.max").exists():
        (child / "memory.swap.max").write_text("0")
    # oom.group would kill the wrapper together with the command, as the kubelet configures
    # it; the classification from inside needs the wrapper to survive, so keep it off here.
    return child, "cgroup.procs"


def _enable_memory_controller_v2(parent: Path) -> None:
    """Let children of ``parent`` have memory limits.

    cgroup v2 refuses to enable a controller for the children of a cgroup that holds
    processes itself (EBUSY, the "no internal processes" rule): inside a container that is
    the container's own cgroup, with this test process in it.  The processes then move to a
    leaf child first, as systemd does in containers; CI machines are disposable.
    """
    if "memory" not in (parent / "cgroup.controllers").read_text().split():
        raise OSError(errno.ENOTSUP, "the memory controller is not delegated to this cgroup")
    control = parent / "cgroup.subtree_control"
    if "memory" in control.read_text().split():
        return
    try:
        control.write_text("+memory")
    except OSError as error:
        if error.errno != errno.EBUSY:
            raise
        leaf = parent / "durapipe-test-leaf"
        leaf.mkdir(exist_ok=True)
        for pid in (parent / "cgroup.procs").read_text().split():
            try:
                (leaf / "cgroup.procs").write_text(pid)
            except OSError:
                pass  # exited meanwhile
        control.write_text("+memory")


@pytest.fixture
def memory_cgroup() -> Iterator[tuple[Path, str]]:
    parent = find_memory_cgroup()
    if parent is None:
        pytest.skip("no readable memory cgroup on this machine")
    try:
        child, procs = _make_child_cgroup(parent)
    except OSError as error:
        pytest.skip(f"cannot create a child memory cgroup under {parent.path}: {error}")
    try:
        yield child, procs
    finally:
        try:
            child.rmdir()
        except OSError:
            pass


def test_kernel_oom_kill_is_host_oom(memory_cgroup: tuple[Path, str], tmp_path: Path) -> None:
    cgroup_dir, procs = memory_cgroup
    log = tmp_path / "termination-log"

    def join_cgroup() -> None:
        (cgroup_dir / procs).write_text(str(os.getpid()))

    completed = subprocess.run(
        runtime_cmd(
            "exec",
            "--termination-log",
            str(log),
            "--",
            sys.executable,
            "-c",
            "x = bytearray(512 * 1024 * 1024); print(len(x))",
        ),
        env=child_env(),
        preexec_fn=join_cgroup,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    verdict, details = parse_verdict_line(log.read_text().strip())
    assert verdict == contract.VERDICT_HOST_OOM, (details, completed.stderr[-2000:])
    assert completed.returncode == contract.EXIT_HOST_OOM
    assert details["returncode"] == -9
    assert isinstance(details["oom_kills_delta"], int) and details["oom_kills_delta"] >= 1
    assert details["memory_limit"] == LIMIT
