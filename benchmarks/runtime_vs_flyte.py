"""Side by side with Flyte 2's checkpoint on the same 256 MiB directory of fp32 shards.

Needs the ``flyte`` package (and numpy for realistic fp32 data), which durapipe does not depend
on; run it from a separate virtual environment with this checkout on PYTHONPATH:

    python -m venv /tmp/flytevenv && /tmp/flytevenv/bin/pip install flyte numpy blake3
    PYTHONPATH=. /tmp/flytevenv/bin/python benchmarks/runtime_vs_flyte.py

Both use a local ``file://`` destination.  Flyte's ``save_sync`` of a directory writes a gzip
tarball, its ``load_sync`` extracts it; ours commits blobs + manifest and restores them with
digest verification.  Targets: our committed save >= 5x faster than Flyte's and within 2x of a
plain copy; our restore within 2x of a plain copy.  Best of --repeats for every timing.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from timing import best_of

from durapipe.runtime.checkpoint import Checkpoint


def make_fp32_shards(root: Path, total_mib: int, shard_mib: int = 32) -> None:
    root.mkdir(parents=True)
    try:
        import numpy

        rng = numpy.random.default_rng(0)
        for index in range(total_mib // shard_mib):
            shard = (rng.standard_normal(shard_mib * 1024 * 1024 // 4) * 0.02).astype("float32")
            (root / f"shard-{index:03d}.bin").write_bytes(shard.tobytes())
    except ImportError:
        import os

        for index in range(total_mib // shard_mib):
            (root / f"shard-{index:03d}.bin").write_bytes(os.urandom(shard_mib * 1024 * 1024))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir-mib", type=int, default=256)
    parser.add_argument(
        "--workdir",
        default=None,
        help="where to put the data (e.g. /dev/shm to keep a busy disk out of the ratios)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    import flyte

    with tempfile.TemporaryDirectory(prefix="durapipe-vs-flyte-", dir=options.workdir) as name:
        work = Path(name)
        source = work / "state"
        make_fp32_shards(source, options.dir_mib)
        counter = iter(range(10**6))

        def plain_copy() -> None:
            shutil.copytree(source, work / f"copy-{next(counter)}")

        def flyte_save() -> None:
            flyte.Checkpoint((work / f"flyte-{next(counter)}" / "ckpt").as_uri()).save_sync(source)

        flyte_src = (work / "flyte-src" / "ckpt").as_uri()
        flyte.Checkpoint(flyte_src).save_sync(source)

        def flyte_load() -> None:
            loader = flyte.Checkpoint((work / f"flyte-dst-{next(counter)}").as_uri(), flyte_src)
            assert loader.load_sync() is not None

        def our_save() -> None:
            index = next(counter)
            Checkpoint((work / f"ours-{index}").as_uri(), path=work / f"ours-w-{index}").save_sync(
                source
            )

        our_src = (work / "ours-src").as_uri()
        Checkpoint(our_src, path=work / "ours-src-w").save_sync(source)

        def our_load() -> None:
            assert Checkpoint(our_src, path=work / f"ours-r-{next(counter)}").load_sync()

        timings = {
            "plain copy": best_of(options.repeats, plain_copy),
            "flyte save_sync": best_of(options.repeats, flyte_save),
            "flyte load_sync": best_of(options.repeats, flyte_load),
            "durapipe save_sync (committed)": best_of(options.repeats, our_save),
            "durapipe load_sync (verified)": best_of(options.repeats, our_load),
        }
    for label, seconds in timings.items():
        print(f"{label:34s} {seconds:8.3f} s")
    copy = timings["plain copy"]
    save_speedup = timings["flyte save_sync"] / timings["durapipe save_sync (committed)"]
    print(f"our save is {save_speedup:.1f}x faster than Flyte's (target >= 5x)")
    print(
        f"our save / plain copy: {timings['durapipe save_sync (committed)'] / copy:.2f} (target <= 2)"
    )
    print(
        f"our load / plain copy: {timings['durapipe load_sync (verified)'] / copy:.2f} (target <= 2)"
    )
    print(
        f"Flyte save / plain copy: {timings['flyte save_sync'] / copy:.1f};"
        f" Flyte load / plain copy: {timings['flyte load_sync'] / copy:.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
