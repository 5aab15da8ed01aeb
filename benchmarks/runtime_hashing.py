"""Content hashing speed: BLAKE3 (what durapipe uses when installed) vs SHA-256 on 1 GiB.

    python benchmarks/runtime_hashing.py [--size-mib 1024]

Prints the throughput of each and the ratio measured in this one run (target: >= 2x).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from functools import partial
from pathlib import Path

from timing import best_of

from durapipe.runtime.hashing import hash_bytes, hash_file


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    size = options.size_mib * 1024 * 1024
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "data.bin"
        with open(path, "wb") as handle:
            handle.writelines(os.urandom(64 * 1024 * 1024) for _ in range(options.size_mib // 64))
        path.read_bytes()  # warm the page cache, as for re-hashing freshly written outputs
        results = {}
        for algorithm in ("sha256", "blake3"):
            seconds = best_of(options.runs, partial(hash_file, path, algorithm))
            results[f"file/{algorithm}"] = seconds
        buffer = path.read_bytes()
        for algorithm in ("sha256", "blake3"):
            seconds = best_of(options.runs, partial(hash_bytes, buffer, algorithm))
            results[f"memory/{algorithm}"] = seconds
    for name, seconds in results.items():
        print(f"{name:16s} {seconds:7.3f} s  {size / seconds / 1e9:6.2f} GB/s")
    for kind in ("file", "memory"):
        ratio = results[f"{kind}/sha256"] / results[f"{kind}/blake3"]
        verdict = "ok" if ratio >= 2 else "BELOW TARGET"
        print(f"{kind}: blake3 is {ratio:.2f}x sha256 (target >= 2x: {verdict})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
