"""Reading this process's memory cgroup: OOM-kill counters, usage and limit.

Both hierarchies are supported.  cgroup v2 exposes ``memory.events`` (``oom_kill``) and
``memory.current``/``memory.max``; v1 exposes ``memory.oom_control`` (``oom_kill``) and
``memory.usage_in_bytes``/``memory.limit_in_bytes``.  Inside a container the cgroup namespace
makes ``/proc/self/cgroup`` say ``/``; outside one it names a path below the mount, so both
``<mount>/<path>`` and ``<mount>`` are tried.

Counters must be read before the child starts and after it is reaped: the cgroup disappears with
the container, so nobody can read them afterwards.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: v1 reports "no limit" as a huge page-aligned number; anything above this is unlimited.
_V1_UNLIMITED = 1 << 60


@dataclass(frozen=True)
class MemoryCgroup:
    """The memory cgroup directory of a process and its hierarchy version (1 or 2)."""

    path: Path
    version: int

    def _read(self, name: str) -> str | None:
        try:
            return (self.path / name).read_text()
        except OSError:
            return None

    def oom_kills(self) -> int | None:
        """Processes in this cgroup killed by the OOM killer so far (``None``: unknown)."""
        text = self._read("memory.events" if self.version == 2 else "memory.oom_control")
        if text is None:
            return None
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return None

    def usage_bytes(self) -> int | None:
        """Working set: usage minus inactive page cache, as the kubelet counts it."""
        text = self._read("memory.current" if self.version == 2 else "memory.usage_in_bytes")
        if text is None:
            return None
        usage = int(text.strip())
        stat_text = self._read("memory.stat") or ""
        inactive_key = "inactive_file" if self.version == 2 else "total_inactive_file"
        for line in stat_text.splitlines():
            key, _, value = line.partition(" ")
            if key == inactive_key:
                return max(0, usage - int(value))
        return usage

    def limit_bytes(self) -> int | None:
        """The hard memory limit (``None``: unlimited or unknown)."""
        text = self._read("memory.max" if self.version == 2 else "memory.limit_in_bytes")
        if text is None:
            return None
        text = text.strip()
        if text == "max":
            return None
        limit = int(text)
        return None if limit >= _V1_UNLIMITED else limit


def _mounts(mountinfo: str) -> list[tuple[str, str, str, str]]:
    """``(fstype, mount root, mount point, super options)`` of every cgroup mount."""
    found = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        right_fields = right.split()
        if len(fields) < 5 or len(right_fields) < 3:
            continue
        fstype = right_fields[0]
        if fstype in ("cgroup", "cgroup2"):
            found.append((fstype, fields[3], fields[4], right_fields[2]))
    return found


def find_memory_cgroup(
    proc_cgroup: str | None = None, mountinfo: str | None = None
) -> MemoryCgroup | None:
    """The memory cgroup of this process, or ``None`` when it has none we can read.

    The arguments exist for tests; by default they are read from ``/proc/self``.
    """
    try:
        if proc_cgroup is None:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        if mountinfo is None:
            mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return None
    v1_path = v2_path = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2_path = parts[2]
        elif "memory" in parts[1].split(","):
            v1_path = parts[2]
    candidates: list[MemoryCgroup] = []
    for fstype, root, point, options in _mounts(mountinfo):
        if fstype == "cgroup" and v1_path is not None and "memory" in options.split(","):
            candidates += _candidates(point, root, v1_path, 1)
        elif fstype == "cgroup2" and v2_path is not None:
            candidates += _candidates(point, root, v2_path, 2)
    # v1's memory controller wins on hybrid hosts: there v2 has no memory files at all.
    for candidate in sorted(candidates, key=lambda c: c.version):
        marker = "memory.oom_control" if candidate.version == 1 else "memory.events"
        if (candidate.path / marker).is_file():
            return candidate
    return None


def _candidates(point: str, root: str, path: str, version: int) -> list[MemoryCgroup]:
    relative = path
    if root != "/" and (path == root or path.startswith(root.rstrip("/") + "/")):
        relative = path[len(root) :]
    mount = Path(point)
    return [
        MemoryCgroup(mount / relative.lstrip("/"), version),
        MemoryCgroup(mount, version),
    ]


def memory_limit_from_env(value: str | None = None) -> int | None:
    """The limit the compiler declared (``DURAPIPE_MEMORY_LIMIT_BYTES``), if any."""
    from durapipe.runtime import contract

    text = os.environ.get(contract.ENV_MEMORY_LIMIT, "") if value is None else value
    text = text.strip()
    return int(text) if text.isdigit() and int(text) > 0 else None
