"""The control plane itself: it starts, listens on 127.0.0.1 only, and leaves no process behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .cluster import _DIE_WITH_PARENT, Cluster
from .conftest import E2E

pytestmark = pytest.mark.e2e


def _listening(pid: int) -> list[str]:
    """Local addresses of the TCP sockets process ``pid`` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # 0A: LISTEN
                out.append(_addr(f[1]))
    return out


def _addr(hex_addr: str) -> str:
    ip, port = hex_addr.split(":")
    raw = bytes.fromhex(ip)
    if len(raw) == 4:
        text = ".".join(str(b) for b in reversed(raw))
    else:  # /proc prints IPv6 as four host-order 32-bit words
        words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]
        flat = b"".join(words)
        text = "[" + ":".join(flat[i:i + 2].hex() for i in range(0, 16, 2)) + "]"
    return f"{text}:{int(port, 16)}"


def _loopback(addr: str) -> bool:
    host = addr.rsplit(":", 1)[0]
    return host.startswith("127.") or host in ("[0000:0000:0000:0000:0000:0000:0000:0001]",
                                               "[0000:0000:0000:0000:0000:ffff:7f00:0001]")


def test_start_stop_leaves_no_process(control_plane_binaries: dict[str, Path],
                                      tmp_path: Path) -> None:
    cluster = Cluster.start(tmp_path / "state", control_plane_binaries)
    try:
        assert sorted(cluster.alive()) == sorted(p.name for p in cluster.procs)
        pids = [p.popen.pid for p in cluster.procs]
        t = cluster.timings
        print(f"warm start {t['start']:.1f} s: API server ready at "
              f"{t['apiserver'] - t['t0']:.1f} s, Argo installed at {t['argo-install'] - t['t0']:.1f}"
              f" s, JobSet ready at {t['jobset-ready'] - t['t0']:.1f} s (its install took "
              f"{t['jobset-install']:.1f} s, beside Argo's)")
    finally:
        cluster.stop()
    assert cluster.alive() == []
    left = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
    assert left == [], f"still running: {left}"
    # Nor any process of theirs (a child they forked) still naming the state directory.
    stray = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if str(tmp_path / "state").encode() in cmd:
                stray.append(proc.name)
    assert stray == []


def test_listens_on_loopback_only(e2e: E2E) -> None:
    seen = {}
    for p in e2e.cluster.procs:
        addrs = _listening(p.popen.pid)
        seen[p.name] = addrs
        assert all(_loopback(a) for a in addrs), f"{p.name} listens on {addrs}"
    assert seen["kube-apiserver"] and seen["etcd"], seen
    # JobSet's webhook server is up, on the loopback port the API server calls.
    assert f"127.0.0.1:{e2e.cluster.jobset_webhook_port}" in seen["jobset-controller"], seen


def test_nodes_follow_the_profiles(e2e: E2E) -> None:
    import json

    nodes = json.loads(e2e.cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    by_name = {n["metadata"]["name"]: n for n in nodes}
    spot = by_name["eks-a10g-spot"]
    assert spot["metadata"]["labels"]["eks.amazonaws.com/capacityType"] == "SPOT"
    assert spot["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A10G"
    assert {"key": "eks.amazonaws.com/capacityType", "value": "SPOT",
            "effect": "NoSchedule"} in spot["spec"]["taints"]
    assert spot["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    ready = {n["metadata"]["name"]: any(c["type"] == "Ready" and c["status"] == "True"
                                        for c in n["status"]["conditions"]) for n in nodes}
    assert all(ready.values()), ready


def _running(pid: int) -> bool:
    """Alive and not a zombie (a process whose parent died is reaped by whoever adopts it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not _DIE_WITH_PARENT, reason="no prctl in libc (not Linux)")
def test_a_test_process_killed_outright_takes_its_processes_with_it(tmp_path: Path) -> None:
    # No teardown runs in a pytest killed by CI's timeout or a SIGTERM; what it started must
    # not go on holding ports and CPU.  Spawned exactly as the control plane's processes are.
    tests_dir = Path(__file__).resolve().parents[1]
    code = (
        "import sys, time\n"
        f"sys.path[:0] = [{str(tests_dir)!r}]\n"
        "from pathlib import Path\n"
        "from e2e.cluster import Cluster\n"
        f"cluster = Cluster(state=Path({str(tmp_path)!r}), bins={{}})\n"
        "proc = cluster._spawn('sleeper', ['sleep', '600'])\n"
        "print(proc.popen.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    starter = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert starter.stdout is not None
    sleeper = int(starter.stdout.readline())
    assert _running(sleeper)
    starter.kill()
    starter.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _running(sleeper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(sleeper), f"pid {sleeper} outlived the process that started it"
