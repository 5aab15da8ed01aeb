"""Build what the full tier's Go tools, control plane and real node need, ahead of the tests.

``.ci/run`` starts this in the background (``nice``) just before the test command, and the
tests run the fast tier first (``conftest.py``): the serial fast tier keeps one of CI's two
cores busy while the Go builds and the image builds, which a cold machine spends about half its
CI time on, take the other.  Nothing here is required: every builder caches its result under a
lock (``argo_tools._cached_build``, ``images._cached``), so a test that needs a tool before this
has built it waits on the lock and then reads the cache, and a build that fails here is built
again by the test that needs it, which then reports the failure where it belongs.

Usage: ``python3 tests/prebuild.py`` (prints one line per build with its seconds).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from argo.argo_tools import build_argo_check, build_argo_sim  # noqa: E402
from e2e.cluster import build_binaries  # noqa: E402
from e2e.images import build_images  # noqa: E402

#: In the order the full tier first needs them: the harness tier, then the control plane
#: (e2e), then the real node's images.
BUILDS: list[tuple[str, Callable[[], object]]] = [
    ("argo-check", build_argo_check),
    ("argo-sim", build_argo_sim),
    ("control plane and kubelet", build_binaries),
    ("real-node images", build_images),
]


def main() -> int:
    failed = 0
    for name, build in BUILDS:
        start = time.monotonic()
        try:
            build()
        # pytest.skip raises an exception outside Exception's tree; a skip here (no Go, no
        # ../shared, not root) is the tests' to report.
        except BaseException as exc:  # noqa: BLE001
            if isinstance(exc, KeyboardInterrupt):
                raise
            failed += 1
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            print(f"prebuild: {name}: not built ({type(exc).__name__}: {first_line[:300]}); "
                  "the tests that need it build it again", flush=True)
            continue
        print(f"prebuild: {name}: ready in {time.monotonic() - start:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
