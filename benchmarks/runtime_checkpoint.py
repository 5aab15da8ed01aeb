"""Checkpoint store performance, every ratio measured within one run of this script.

    python benchmarks/runtime_checkpoint.py [--size-mib 1024] [--dir-mib 256] [--skip-s3]
    python benchmarks/runtime_checkpoint.py --soak [--kills 1000] [--seed 1]

1. ``import durapipe.runtime`` wall time (target < 50 ms over a bare interpreter).
2. Local filesystem, a directory of fp32-like shards (--dir-mib): committed save and restore
   versus a plain ``shutil.copytree`` of the same directory (targets: within 2x).
3. S3 on a moto server in a separate process on 127.0.0.1 (--size-mib of state):
   - time the training loop is blocked by ``save()`` versus a plain synchronous upload of the
     same bytes with obstore (target <= 15%);
   - committed upload and restore throughput versus obstore alone (target >= 70%);
   - re-saving unchanged files uploads nothing.
``--soak`` runs only the crash harness of the tests (tests/runtime/crash.py) for ``--kills``
SIGKILLs over the local store and S3 (moto), uploads in-process and by the sidecar agent, and
prints the counts; the target is ``0 torn, 0 lost``.

Moto is pure Python and shares the CPUs with the client: absolute MB/s say little about real
S3, the ratios are the point.  Every timing is the best of --repeats runs, so a busy machine
distorts the ratios less.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from timing import timed

from durapipe.runtime.checkpoint import Checkpoint
from durapipe.runtime.store import LocalStore

SHARD_MIB = 32
RESULTS: list[tuple[str, float, str, bool]] = []


def report(name: str, value: float, target: str, ok: bool) -> None:
    RESULTS.append((name, value, target, ok))
    print(f"{name:58s} {value:8.3f}   target {target:10s} {'ok' if ok else 'MISSED'}", flush=True)


def make_shards(root: Path, total_mib: int, shard_mib: int = SHARD_MIB) -> Path:
    root.mkdir(parents=True)
    for index in range(max(1, total_mib // shard_mib)):
        with open(root / f"shard-{index:04d}.bin", "wb") as handle:
            handle.write(os.urandom(shard_mib * 1024 * 1024))
    (root / "meta.json").write_text('{"step": 1}')
    return root


def bench_import() -> None:
    """Cumulative import time of ``durapipe.runtime`` from ``-X importtime`` (best of 15).

    Timing whole interpreter start-ups is too noisy on a shared machine; the interpreter's
    own per-module accounting is not.
    """
    samples = []
    for _ in range(15):
        completed = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", "import durapipe.runtime.contract"],
            check=True,
            capture_output=True,
            text=True,
        )
        total = 0
        for line in completed.stderr.splitlines():
            fields = line.split("|")
            # Unindented names are the imports the statement triggered directly; their
            # cumulative time covers everything they imported in turn.
            if len(fields) == 3 and fields[2].startswith(" durapipe"):
                total += int(fields[1])
        samples.append(total / 1e6)
    best = min(samples)
    report("import durapipe.runtime (ms, -X importtime)", best * 1000, "< 50", best < 0.05)


def bench_local(work: Path, dir_mib: int, repeats: int) -> None:
    source = make_shards(work / "local-src", dir_mib)
    copies = []
    for index in range(repeats):
        copies.append(timed(partial(shutil.copytree, source, work / f"plain-copy-{index}")))
        shutil.rmtree(work / f"plain-copy-{index}")
    copy_time = min(copies)
    print(f"  local {dir_mib} MiB: plain copy {copy_time:.3f} s (best of {repeats})")
    for fsync in (True, False):
        saves, loads = [], []
        for index in range(repeats):
            root = work / f"local-{fsync}-{index}"
            store = LocalStore(root / "store", fsync=fsync)
            checkpoint = Checkpoint(store.uri, path=root / "w", store=store)
            saves.append(timed(partial(checkpoint.save_sync, source)))
            checkpoint.close()
            reader = Checkpoint(store.uri, path=root / "r", store=store)
            loads.append(timed(reader.load_sync))
            shutil.rmtree(root)
        save_time, load_time = min(saves), min(loads)
        print(
            f"  local, fsync={fsync}: committed save {save_time:.3f} s, restore {load_time:.3f} s"
        )
        report(
            f"local (fsync={fsync}) committed save / plain copy",
            save_time / copy_time,
            "<= 2",
            save_time <= 2 * copy_time,
        )
        report(
            f"local (fsync={fsync}) restore / plain copy",
            load_time / copy_time,
            "<= 2",
            load_time <= 2 * copy_time,
        )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys\n"
                "from moto.server import ThreadedMotoServer\n"
                f"ThreadedMotoServer(ip_address='127.0.0.1', port={port}, verbose=False).start()\n"
                "sys.stdin.read()\n"
            ),
        ],
        stdin=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(500):
        try:
            urllib.request.urlopen(endpoint, timeout=1)
            break
        except OSError:
            time.sleep(0.05)
    return server, endpoint


def bench_s3(work: Path, size_mib: int, repeats: int) -> None:
    import obstore
    from obstore.store import from_url

    server, endpoint = start_moto()
    try:
        os.environ.update(
            AWS_ENDPOINT_URL=endpoint,
            AWS_ACCESS_KEY_ID="bench",
            AWS_SECRET_ACCESS_KEY="bench",
            AWS_REGION="us-east-1",
        )
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{bucket}", method="PUT"))
        state = make_shards(work / "s3-state", size_mib, shard_mib=128)
        files = sorted(state.iterdir())
        total = sum(f.stat().st_size for f in files)
        raw = from_url(f"s3://{bucket}/raw", client_options={"allow_http": True})

        def plain_upload() -> None:
            with ThreadPoolExecutor(4) as pool:
                list(
                    pool.map(
                        lambda f: obstore.put(
                            raw, f.name, f, chunk_size=16 << 20, max_concurrency=8
                        ),
                        files,
                    )
                )

        def plain_download() -> None:
            def fetch(f: Path) -> None:
                size = f.stat().st_size
                starts = list(range(0, size, 16 << 20))
                ends = [min(size, s + (16 << 20)) for s in starts]
                with open(work / "raw-dl" / f.name, "wb") as out:
                    out.writelines(obstore.get_ranges(raw, f.name, starts=starts, ends=ends))

            (work / "raw-dl").mkdir(exist_ok=True)
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(fetch, files))

        sync_upload = min(timed(plain_upload) for _ in range(repeats))
        sync_download = min(timed(plain_download) for _ in range(repeats))
        print(
            f"  obstore alone (best of {repeats}): upload {total / sync_upload / 1e6:.0f} MB/s,"
            f" download {total / sync_download / 1e6:.0f} MB/s ({total >> 20} MiB)"
        )

        blocked_times, committed_times, restore_times = [], [], []
        for index in range(repeats):
            uri = f"s3://{bucket}/ckpt-{index}"
            checkpoint = Checkpoint(uri, path=work / f"s3-w-{index}")
            start = time.perf_counter()
            handle = checkpoint.save(state)
            blocked_times.append(time.perf_counter() - start)
            commit = handle.wait()
            committed_times.append(time.perf_counter() - start)
            assert commit.uploaded_bytes >= total
            if index == 0:
                again = checkpoint.save_sync(state)
                report(
                    "S3 re-save of unchanged files: bytes uploaded",
                    float(again.uploaded_bytes),
                    "== 0",
                    again.uploaded_bytes == 0,
                )
            checkpoint.close()
            reader = Checkpoint(uri, path=work / f"s3-r-{index}")
            restore_times.append(timed(reader.load_sync))
            shutil.rmtree(work / f"s3-r-{index}")
        blocked, committed, restore = min(blocked_times), min(committed_times), min(restore_times)
        report(
            "S3 save(): time blocked / plain sync upload",
            blocked / sync_upload,
            "<= 0.15",
            blocked <= 0.15 * sync_upload,
        )
        report(
            "S3 committed upload throughput / obstore alone",
            sync_upload / committed,
            ">= 0.7",
            sync_upload / committed >= 0.7,
        )
        report(
            "S3 restore throughput / obstore alone",
            sync_download / restore,
            ">= 0.7",
            sync_download / restore >= 0.7,
        )
        print(
            f"  durapipe (best of {repeats}): blocked {blocked:.3f} s, committed {committed:.2f} s"
            f" ({total / committed / 1e6:.0f} MB/s), restore {restore:.2f} s"
            f" ({total / restore / 1e6:.0f} MB/s)"
        )
    finally:
        server.kill()
        server.wait()


def soak(work: Path, kills: int, seed: int) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.runtime.crash import child_env, run_kills

    server, endpoint = start_moto()
    try:
        env = dict(
            AWS_ENDPOINT_URL=endpoint,
            AWS_ACCESS_KEY_ID="soak",
            AWS_SECRET_ACCESS_KEY="soak",
            AWS_REGION="us-east-1",
        )
        os.environ.update(env)
        bucket = f"soak-{uuid.uuid4().hex[:8]}"
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{bucket}", method="PUT"))
        started = time.perf_counter()
        counts = run_kills(
            work, kills, seed, s3_bucket_uri=f"s3://{bucket}/soak", env=child_env(env)
        )
        elapsed = time.perf_counter() - started
    finally:
        server.kill()
        server.wait()
    for problem in counts.problems:
        print(f"  {problem}")
    print(f"soak, seed {seed}: {counts.summary()}; {elapsed:.0f} s")
    print(f"{counts.torn} torn, {counts.lost} lost")
    return 0 if counts.torn == counts.lost == 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--dir-mib", type=int, default=256)
    parser.add_argument("--skip-s3", action="store_true")
    parser.add_argument(
        "--workdir",
        default=None,
        help="where to put the data (e.g. /dev/shm to keep a busy disk out of the ratios)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="best of N for every timing")
    parser.add_argument("--soak", action="store_true", help="only the SIGKILL soak")
    parser.add_argument("--kills", type=int, default=1000, help="SIGKILLs of the soak")
    parser.add_argument("--seed", type=int, default=1, help="seed of the soak")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="durapipe-bench-", dir=options.workdir) as directory:
        work = Path(directory)
        if options.soak:
            return soak(work, options.kills, options.seed)
        bench_import()
        bench_local(work, options.dir_mib, options.repeats)
        if not options.skip_s3:
            bench_s3(work, options.size_mib, options.repeats)
    missed = [name for name, _, _, ok in RESULTS if not ok]
    print(
        f"{len(RESULTS) - len(missed)}/{len(RESULTS)} targets met"
        + (f"; missed: {', '.join(missed)}" if missed else "")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
