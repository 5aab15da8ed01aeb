"""Build the single-file runtime every pod runs (shipped in the compiled output's ConfigMap).

    python -m durapipe.runtime.build_zipapp dist/durapipe-runtime.pyz

The archive holds ``durapipe/__init__.py`` and ``durapipe/runtime`` only (no DSL, no compiler,
no third-party code) and runs under any Python >= 3.10 of the user's image:
``python /var/run/durapipe/bin/durapipe-runtime.pyz exec -- CMD...``.  S3 uses ``obstore`` when
the image has it and the runtime's own stdlib client otherwise (docs/runtime.md).  BLAKE3 is
used when the image has the ``blake3`` wheel, SHA-256 otherwise.

The bytes depend on the runtime's sources only: entries sorted, one fixed timestamp and mode,
and stored uncompressed (deflate output differs between zlib builds, e.g. zlib-ng), so every
machine compiles the same ConfigMap under the same content-hash name.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import sys
import zipfile
from pathlib import Path

import durapipe
import durapipe.runtime

ENTRY = """\
import sys

if sys.version_info < (3, 10):
    sys.exit("durapipe runtime: needs Python >= 3.10 in the stage's image, found "
             + sys.version.split()[0])

from durapipe.runtime.__main__ import main

sys.exit(main())
"""
INTERPRETER = "/usr/bin/env python3"
#: The earliest time a zip entry can carry; any fixed value would do.
FIXED_DATE = (1980, 1, 1, 0, 0, 0)
FILE_MODE = 0o100644


def sources() -> dict[str, bytes]:
    """Archive name -> content of every file the runtime needs, read from this installation."""
    package_root = Path(durapipe.__file__).parent
    runtime_root = Path(durapipe.runtime.__file__).parent
    files = {"__main__.py": ENTRY.encode(),
             "durapipe/__init__.py": (package_root / "__init__.py").read_bytes()}
    for dirpath, dirnames, filenames in os.walk(runtime_root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if name.endswith(".py"):
                path = Path(dirpath) / name
                files[f"durapipe/runtime/{path.relative_to(runtime_root).as_posix()}"] = (
                    path.read_bytes())
    return files


def archive_bytes(*, interpreter: str = INTERPRETER) -> bytes:
    """The zipapp itself: a shebang line, then a zip of :func:`sources` in sorted order."""
    buffer = io.BytesIO()
    buffer.write(f"#!{interpreter}\n".encode())
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in sorted(sources().items()):
            info = zipfile.ZipInfo(name, date_time=FIXED_DATE)
            info.external_attr = FILE_MODE << 16
            info.create_system = 3  # Unix, whatever machine builds it
            archive.writestr(info, data)
    return buffer.getvalue()


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def build(output: str | Path, *, interpreter: str = INTERPRETER) -> Path:
    """Write the zipapp to ``output`` (write-then-rename) and return its path."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_name(f".{output.name}.tmp")
    temporary.write_bytes(archive_bytes(interpreter=interpreter))
    temporary.chmod(0o755)
    os.replace(temporary, output)
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("output", help="path of the .pyz to write")
    parser.add_argument("--interpreter", default=INTERPRETER)
    options = parser.parse_args(argv)
    path = build(options.output, interpreter=options.interpreter)
    data = path.read_bytes()
    print(f"{path} ({len(data)} bytes, sha256 {content_hash(data)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
