"""Build the single-file runtime every pod runs (shipped in the compiled output's ConfigMap).

    python -m durapipe.runtime.build_zipapp dist/durapipe-runtime.pyz

The archive holds ``durapipe/__init__.py`` and ``durapipe/runtime`` only (no DSL, no compiler,
no third-party code) and runs under any Python >= 3.10 of the user's image:
``python /var/run/durapipe/bin/durapipe-runtime.pyz exec -- CMD...``.  S3 uses ``obstore`` when
the image has it and the runtime's own stdlib client otherwise (docs/runtime.md).  BLAKE3 is
used when the image has the ``blake3`` wheel, SHA-256 otherwise.

The bytes depend on the runtime's sources only: entries sorted, one fixed timestamp and mode,
and compressed by this module's own deflate (zlib's output differs between zlib builds, e.g.
zlib-ng), so every machine compiles the same ConfigMap under the same content-hash name.
Comments and docstrings are blanked first, every line kept where it was (:func:`stripped`), so
the archive is about 68 KB (104 KB unstripped) and the ConfigMap's client-side-apply annotation
stays under half of the 262,144 bytes Kubernetes allows (docs/lowering.md, "Apply modes").
This module itself is left out: the pod never imports it.
"""

from __future__ import annotations

import argparse
import ast
import bisect
import hashlib
import io
import os
import struct
import sys
import tokenize
import zlib
from pathlib import Path

import durapipe
import durapipe.runtime

ENTRY = """\
import sys

if sys.version_info < (3, 10):
    sys.exit("durapipe runtime: needs Python >= 3.10 in the stage's image, found "
             + sys.version.split()[0])
try:
    import zlib  # noqa: F401  (zipimport inflates the archive's modules with it)
except ImportError:
    sys.exit("durapipe runtime: needs the zlib module in the stage's Python")

from durapipe.runtime.__main__ import main

sys.exit(main())
"""
INTERPRETER = "/usr/bin/env python3"
#: Not in the archive: the pod never imports them.
LEFT_OUT = frozenset({"build_zipapp.py"})
#: The earliest time a zip entry can carry; any fixed value would do.
FIXED_DATE = (1980, 1, 1, 0, 0, 0)
FILE_MODE = 0o100644


#: Whose module docstring is kept: it reads its own as its ``--help`` text.
KEEPS_MODULE_DOCSTRING = frozenset({"durapipe/runtime/__main__.py"})


def stripped(data: bytes, *, keep_module_docstring: bool = False) -> bytes:
    """A module's source with its comments and docstrings blanked and every line where it was,
    so a traceback from a pod names the repository's lines.  A third smaller once deflated,
    which keeps the runtime ConfigMap's client-side-apply annotation under half of its limit
    as the runtime grows (``tests/compiler/test_managed_dir.py``).  Positions come from
    ``ast`` (docstrings) and ``tokenize`` (comments), which every Python >= 3.10 reports
    alike for the same source, so the archive stays the same on every machine."""
    text = data.decode("utf-8")
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line.encode("utf-8")))
    spans: list[tuple[int, int, bytes]] = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef)) or not node.body:
            continue
        first = node.body[0]
        if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)):
            continue
        if keep_module_docstring and isinstance(node, ast.Module):
            continue
        assert first.end_lineno is not None and first.end_col_offset is not None
        begin = starts[first.lineno - 1] + first.col_offset  # ast columns count bytes
        end = starts[first.end_lineno - 1] + first.end_col_offset
        spans.append((begin, end, b'""' + b"\n" * data[begin:end].count(b"\n")))
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type != tokenize.COMMENT:
            continue
        row, column = token.start  # tokenize columns count characters
        before = lines[row - 1][:column]
        begin = starts[row - 1] + len(before.rstrip().encode("utf-8"))
        spans.append((begin, starts[row - 1] + len(before.encode("utf-8"))
                      + len(token.string.encode("utf-8")), b""))
    out = bytearray(data)
    for begin, end, replacement in sorted(spans, reverse=True):
        out[begin:end] = replacement
    return bytes(out)


def sources() -> dict[str, bytes]:
    """Archive name -> content of every file the runtime needs, read from this installation
    (each module :func:`stripped`)."""
    package_root = Path(durapipe.__file__).parent
    runtime_root = Path(durapipe.runtime.__file__).parent
    files = {"__main__.py": ENTRY.encode(),
             "durapipe/__init__.py": (package_root / "__init__.py").read_bytes()}
    for dirpath, dirnames, filenames in os.walk(runtime_root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if name.endswith(".py") and not (dirpath == str(runtime_root) and
                                             name in LEFT_OUT):
                path = Path(dirpath) / name
                archived = f"durapipe/runtime/{path.relative_to(runtime_root).as_posix()}"
                files[archived] = stripped(
                    path.read_bytes(), keep_module_docstring=archived in KEEPS_MODULE_DOCSTRING)
    return files


def _dos_time() -> tuple[int, int]:
    year, month, day, hour, minute, second = FIXED_DATE
    return hour << 11 | minute << 5 | second // 2, (year - 1980) << 9 | month << 5 | day


def archive_bytes(*, interpreter: str = INTERPRETER) -> bytes:
    """The zipapp itself: a shebang line, then a zip of :func:`sources` in sorted order, each
    entry deflated by :func:`deflate` (``__main__.py`` stored, so that it can say when the
    image's Python lacks zlib)."""
    out = bytearray(f"#!{interpreter}\n".encode())
    central = bytearray()
    dos_time, dos_date = _dos_time()
    entries = sorted(sources().items())
    for name, data in entries:
        method, body = (0, data) if name == "__main__.py" else (8, deflate(data))
        encoded = name.encode()
        fields = struct.pack("<HHHHHIIIH", 20, 0, method, dos_time, dos_date,
                             zlib.crc32(data), len(body), len(data), len(encoded))
        central += struct.pack("<IBB", 0x02014B50, 20, 3) + fields + struct.pack(
            "<HHHHII", 0, 0, 0, 0, FILE_MODE << 16, len(out)) + encoded
        out += struct.pack("<I", 0x04034B50) + fields + struct.pack("<H", 0) + encoded + body
    offset = len(out)
    out += central + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries),
                                 len(central), offset, 0)
    return bytes(out)


# -- deflate ------------------------------------------------------------------------------
# zlib's output differs between zlib builds (zlib-ng, Intel's, Cloudflare's), so the archive
# is compressed here: greedy LZ77 over hash chains of at most CHAIN candidates, one block of
# fixed Huffman codes (RFC 1951, 3.2.6).  Every inflate reads it; the bytes are the same on
# every machine and Python.  About 2.4x on the runtime's sources, in a third of a second.
WINDOW = 32768
MIN_MATCH, MAX_MATCH = 3, 258
CHAIN = 8

_LEN_BASE = [3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83,
             99, 115, 131, 163, 195, 227, 258]
_LEN_EXTRA = [0] * 8 + [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4 + [5] * 4 + [0]
_DIST_BASE = [1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769,
              1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577]
_DIST_EXTRA = [0, 0, 0, 0] + [n for n in range(1, 14) for _ in (0, 1)]


def _reverse(code: int, bits: int) -> int:
    out = 0
    for _ in range(bits):
        out = (out << 1) | (code & 1)
        code >>= 1
    return out


def _fixed_code(symbol: int) -> tuple[int, int]:
    if symbol < 144:
        return _reverse(0x30 + symbol, 8), 8
    if symbol < 256:
        return _reverse(0x190 + symbol - 144, 9), 9
    if symbol < 280:
        return _reverse(symbol - 256, 7), 7
    return _reverse(0xC0 + symbol - 280, 8), 8


_LIT = [_fixed_code(s) for s in range(288)]
_DIST = [(_reverse(d, 5), 5) for d in range(30)]
_LEN_SYMBOL = [0] * 259
_DIST_SYMBOL: list[int] = []
for _i, _base in enumerate(_LEN_BASE):
    for _n in range(_base, min(_base + (1 << _LEN_EXTRA[_i]), 259)):
        _LEN_SYMBOL[_n] = _i
_LEN_SYMBOL[258] = 28


def _dist_symbol(d: int) -> int:
    return bisect.bisect_right(_DIST_BASE, d) - 1


def _longest(data: bytes, i: int, end: int, candidates: list[int]) -> tuple[int, int]:
    best_len, best_pos = 0, 0
    limit = min(MAX_MATCH, end - i)
    for p in reversed(candidates[-CHAIN:]):
        if i - p > WINDOW:
            break
        if best_len and data[p + best_len:p + best_len + 1] != data[i + best_len:i + best_len + 1]:
            continue
        lo, hi = MIN_MATCH - 1, limit  # data[p:p+lo] == data[i:i+lo] (the 3-byte key)
        if best_len >= lo and data[p:p + best_len + 1] == data[i:i + best_len + 1]:
            lo = best_len + 1
        elif best_len:
            continue
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if data[p:p + mid] == data[i:i + mid]:
                lo = mid
            else:
                hi = mid - 1
        if lo > best_len:
            best_len, best_pos = lo, p
            if lo == limit:
                break
    return best_len, best_pos


def deflate(data: bytes) -> bytes:
    """Raw deflate of ``data``: one final block of fixed Huffman codes."""
    out = bytearray()
    acc = 3  # BFINAL=1, BTYPE=01
    nbits = 3
    chains: dict[bytes, list[int]] = {}
    end = len(data)
    i = 0

    def put(value: int, bits: int) -> None:
        nonlocal acc, nbits
        acc |= value << nbits
        nbits += bits
        while nbits >= 8:
            out.append(acc & 0xFF)
            acc >>= 8
            nbits -= 8

    while i < end:
        key = data[i:i + MIN_MATCH]
        length = 0
        if len(key) == MIN_MATCH:
            candidates = chains.setdefault(key, [])
            if candidates:
                length, pos = _longest(data, i, end, candidates)
            candidates.append(i)
        if length >= MIN_MATCH:
            sym = _LEN_SYMBOL[length]
            put(*_LIT[257 + sym])
            if _LEN_EXTRA[sym]:
                put(length - _LEN_BASE[sym], _LEN_EXTRA[sym])
            dist = i - pos
            dsym = _dist_symbol(dist)
            put(*_DIST[dsym])
            if _DIST_EXTRA[dsym]:
                put(dist - _DIST_BASE[dsym], _DIST_EXTRA[dsym])
            for j in range(i + 1, min(i + length, end - MIN_MATCH + 1)):
                chains.setdefault(data[j:j + MIN_MATCH], []).append(j)
            i += length
        else:
            put(*_LIT[data[i]])
            i += 1
    put(*_LIT[256])
    if nbits:
        out.append(acc & 0xFF)
    return bytes(out)


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
