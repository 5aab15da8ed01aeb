"""Memory cgroups for local attempts: a real kernel memory limit, as a container would have.

cgroup v2 (a writable unified hierarchy with the memory controller) is preferred; v1 (a
writable ``memory`` hierarchy) works too.  Where neither can be created (no root, a read-only
cgroupfs) the limit is reported but not enforced, and the caller warns once.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from durapipe.runtime.cgroup import MemoryCgroup

_V2_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")
_V1_ROOT = "/sys/fs/cgroup/memory"
_PARENT = "durapipe"


@dataclass
class AttemptCgroup:
    path: Path
    version: int

    @property
    def procs_file(self) -> str:
        return str(self.path / "cgroup.procs")

    def oom_kills(self) -> int:
        """How many processes the kernel killed for exceeding this cgroup's limit (0 where the
        counter cannot be read: the runtime's reader, which the pod uses too)."""
        return MemoryCgroup(self.path, self.version).oom_kills() or 0

    def remove(self) -> None:
        """Delete the cgroup once its processes are gone (retries briefly while they exit)."""
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.02)


class CgroupFactory:
    """Creates one child cgroup per attempt under ``<hierarchy>/durapipe/<run>``."""

    def __init__(self) -> None:
        self.version, self.root = self._detect()
        self.reason = "" if self.root else (
            "memory limits are not enforced: no writable memory cgroup (v1 or v2) on this machine")

    @property
    def available(self) -> bool:
        return self.root is not None

    @staticmethod
    def _detect() -> tuple[int, Path | None]:
        for root in _V2_ROOTS:
            base = Path(root)
            controllers = base / "cgroup.controllers"
            if controllers.exists() and "memory" in controllers.read_text().split():
                probe = base / _PARENT
                try:
                    probe.mkdir(exist_ok=True)
                    (base / "cgroup.subtree_control").write_text("+memory")
                    (probe / "cgroup.subtree_control").write_text("+memory")
                    return 2, probe
                except OSError:
                    continue
        v1 = Path(_V1_ROOT)
        if (v1 / "memory.limit_in_bytes").exists():
            probe = v1 / _PARENT
            try:
                probe.mkdir(exist_ok=True)
                return 1, probe
            except OSError:
                pass
        return 0, None

    def create(self, name: str, limit_bytes: int) -> AttemptCgroup | None:
        if self.root is None:
            return None
        path = self.root / name
        try:
            path.mkdir(parents=True, exist_ok=True)
            if self.version == 2:
                (path / "memory.max").write_text(str(limit_bytes))
                swap = path / "memory.swap.max"
                if swap.exists():
                    swap.write_text("0")
            else:
                (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
                swappiness = path / "memory.swappiness"
                if swappiness.exists():
                    try:
                        swappiness.write_text("0")
                    except OSError:
                        pass
        except OSError:
            return None
        return AttemptCgroup(path, self.version)
