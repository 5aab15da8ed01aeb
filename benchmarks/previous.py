"""Another git revision of durapipe, for benchmarks that compare before and after in one run."""

from __future__ import annotations

import contextlib
import io
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def resolve(rev: str) -> str:
    """The short commit id of ``rev``, for the report."""
    out = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, check=True,
                         capture_output=True, text=True)
    return out.stdout.strip()


@contextlib.contextmanager
def tree(rev: str) -> Iterator[Path]:
    """A temporary directory holding the ``durapipe`` package as it is at ``rev``.

    Put it first on ``sys.path`` (or ``PYTHONPATH``) of a child process: it then shadows the
    checkout, whose editable install is found after ``sys.path``.
    """
    archive = subprocess.run(["git", "archive", "--format=tar", rev, "durapipe"], cwd=REPO,
                             check=True, capture_output=True).stdout
    with tempfile.TemporaryDirectory(prefix="durapipe-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        yield Path(tmp)
