"""Run the Node checks in ``tools/node-checks`` (installed by ``npm ci`` there; .ci/run does).

Where Node or the installed packages are missing the caller's test skips with the reason
(a failure under ``DURAPIPE_STRICT_SKIPS=1``, as in CI).
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.conftest import REPO_ROOT

NODE_CHECKS = REPO_ROOT / "tools" / "node-checks"


def run_node(script: str, *args: str) -> dict[str, object]:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (CI has it)")
    if not (NODE_CHECKS / "node_modules").is_dir():
        pytest.skip(f"run `npm ci` in {NODE_CHECKS} first (.ci/run does)")
    done = subprocess.run([node, str(NODE_CHECKS / script), *args], capture_output=True,
                          text=True, cwd=NODE_CHECKS, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert isinstance(result, dict)
    return result
