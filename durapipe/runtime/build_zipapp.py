"""Build the single-file runtime the init container copies into every pod.

    python -m durapipe.runtime.build_zipapp dist/durapipe-runtime.pyz

The archive holds ``durapipe/__init__.py`` and ``durapipe/runtime`` only (no DSL, no compiler,
no third-party code) and runs under any Python >= 3.10 of the user's image:
``python /var/run/durapipe/bin/durapipe-runtime.pyz exec -- CMD...``.  S3 needs ``obstore`` in
the image; without it the local filesystem backend still works.  BLAKE3 is used when the image
has the ``blake3`` wheel, SHA-256 otherwise.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import zipapp
from pathlib import Path

import durapipe
import durapipe.runtime

ENTRY = """\
import sys

from durapipe.runtime.__main__ import main

sys.exit(main())
"""


def build(output: str | Path, *, interpreter: str = "/usr/bin/env python3") -> Path:
    """Write the zipapp to ``output`` and return its path."""
    output = Path(output)
    package_root = Path(durapipe.__file__).parent
    runtime_root = Path(durapipe.runtime.__file__).parent
    with tempfile.TemporaryDirectory(prefix="durapipe-zipapp-") as staging_name:
        staging = Path(staging_name)
        (staging / "durapipe").mkdir()
        shutil.copy2(package_root / "__init__.py", staging / "durapipe" / "__init__.py")
        shutil.copytree(
            runtime_root,
            staging / "durapipe" / "runtime",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
        (staging / "__main__.py").write_text(ENTRY)
        output.parent.mkdir(parents=True, exist_ok=True)
        zipapp.create_archive(staging, output, interpreter=interpreter, compressed=True)
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", help="path of the .pyz to write")
    parser.add_argument("--interpreter", default="/usr/bin/env python3")
    options = parser.parse_args(argv)
    path = build(options.output, interpreter=options.interpreter)
    print(f"{path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
