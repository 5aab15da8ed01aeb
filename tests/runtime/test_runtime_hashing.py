"""Content digests of files and trees, cache keys, and the cgroup readers."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from durapipe.runtime import hashing
from durapipe.runtime.cachekey import (
    CACHE_KEY_SCHEMA_VERSION,
    cache_key,
    canonical_json,
    make_record,
)
from durapipe.runtime.cgroup import MemoryCgroup, find_memory_cgroup
from tests.runtime.runtime_helpers import child_env, runtime_cmd


def make_tree(root: Path) -> Path:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "a.txt").write_text("alpha")
    (root / "sub" / "b.bin").write_bytes(bytes(range(256)) * 100)
    (root / "sub" / "deeper" / "c").write_text("gamma")
    (root / "empty").mkdir()
    return root


@pytest.mark.parametrize("algorithm", ["sha256", "blake3"])
def test_file_digest_matches_the_reference_implementation(tmp_path: Path, algorithm: str) -> None:
    if algorithm == "blake3":
        blake3 = pytest.importorskip("blake3", reason="blake3 is part of the test extra")
    data = os.urandom(20 * 1024 * 1024 + 17)  # above the mmap threshold, odd length
    target = tmp_path / "f"
    target.write_bytes(data)
    expected = (
        hashlib.sha256(data).hexdigest()
        if algorithm == "sha256"
        else blake3.blake3(data).hexdigest()
    )
    assert hashing.hash_file(target, algorithm) == f"{algorithm}:{expected}"
    assert hashing.hash_bytes(data, algorithm) == f"{algorithm}:{expected}"


def test_tree_digest_is_independent_of_creation_order_and_timestamps(tmp_path: Path) -> None:
    first = make_tree(tmp_path / "one")
    second = tmp_path / "two"
    (second / "empty").mkdir(parents=True)
    (second / "sub" / "deeper").mkdir(parents=True)
    (second / "sub" / "deeper" / "c").write_text("gamma")
    (second / "sub" / "b.bin").write_bytes(bytes(range(256)) * 100)
    (second / "a.txt").write_text("alpha")
    os.utime(second / "a.txt", (0, 0))
    assert hashing.hash_tree(first) == hashing.hash_tree(second)


@pytest.mark.parametrize(
    "change",
    ["content", "rename", "executable", "empty_dir", "symlink"],
)
def test_tree_digest_changes_with_content_names_exec_bit_dirs_and_links(
    tmp_path: Path, change: str
) -> None:
    tree = make_tree(tmp_path / "t")
    before = hashing.hash_tree(tree)
    if change == "content":
        (tree / "sub" / "deeper" / "c").write_text("gammA")
    elif change == "rename":
        (tree / "a.txt").rename(tree / "A.txt")
    elif change == "executable":
        (tree / "a.txt").chmod(0o755)
    elif change == "empty_dir":
        (tree / "empty2").mkdir()
    else:
        (tree / "link").symlink_to("a.txt")
    assert hashing.hash_tree(tree) != before


def test_group_and_other_permission_bits_do_not_change_the_digest(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t")
    before = hashing.hash_tree(tree)
    (tree / "a.txt").chmod(0o600)
    assert hashing.hash_tree(tree) == before


def test_algorithm_prefix_and_forced_algorithm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(hashing.ENV_CONTENT_HASH, "sha256")
    assert hashing.hash_path(make_tree(tmp_path / "t")).startswith("sha256:")
    monkeypatch.setenv(hashing.ENV_CONTENT_HASH, "md5")
    with pytest.raises(ValueError, match="DURAPIPE_CONTENT_HASH"):
        hashing.default_algorithm()


def test_hash_cli_prints_the_same_digest(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t")
    out = subprocess.run(
        runtime_cmd("hash", str(tree)), env=child_env(), capture_output=True, text=True, check=True
    ).stdout
    assert out.split()[0] == hashing.hash_path(tree)


# -- cache keys ---------------------------------------------------------------------------------


def base_record() -> dict[str, object]:
    return dict(
        make_record(
            image="ghcr.io/acme/train@sha256:" + "a" * 64,
            command=["python", "train.py", "--epochs", "3"],
            env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
            params={"lr": 0.001, "layers": [64, 64], "name": "résumé"},
            salt="v2",
            upstream={"data": "blake3:" + "b" * 64},
        )
    )


def test_cache_key_is_lowercase_hex_sha256_of_the_canonical_json() -> None:
    record = base_record()
    key = cache_key(record)
    assert key == hashlib.sha256(canonical_json(record)).hexdigest()
    assert len(key) == 64 and key == key.lower()
    assert record["schema_version"] == CACHE_KEY_SCHEMA_VERSION


def test_cache_key_ignores_mapping_order() -> None:
    record = base_record()
    shuffled = {k: record[k] for k in reversed(list(record))}
    shuffled["params"] = dict(reversed(list(record["params"].items())))  # type: ignore[union-attr]
    assert cache_key(shuffled) == cache_key(record)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("image", "ghcr.io/acme/train@sha256:" + "c" * 64),
        ("command", ["python", "train.py", "--epochs", "4"]),
        ("env", {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}),
        ("params", {"lr": 0.002, "layers": [64, 64], "name": "résumé"}),
        ("salt", "v3"),
        ("upstream", {"data": "blake3:" + "d" * 64}),
        ("schema_version", CACHE_KEY_SCHEMA_VERSION + 1),
    ],
)
def test_every_field_enters_the_key(field: str, value: object) -> None:
    changed = base_record()
    changed[field] = value
    assert cache_key(changed) != cache_key(base_record())


def test_int_and_float_params_differ_but_equal_floats_agree() -> None:
    as_int, as_float, again = base_record(), base_record(), base_record()
    as_int["params"] = {"n": 1}
    as_float["params"] = {"n": 1.0}
    again["params"] = {"n": float("1.0")}
    assert cache_key(as_int) != cache_key(as_float)
    assert cache_key(as_float) == cache_key(again)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda r: r.pop("salt"),
        lambda r: r.update(extra=1),
        lambda r: r.update(params={"x": float("nan")}),
        lambda r: r.update(params={"x": object()}),
        lambda r: r.update(command="python train.py"),
        lambda r: r.update(env={"A": 1}),
    ],
)
def test_malformed_records_are_rejected(mutate: object) -> None:
    record = base_record()
    mutate(record)  # type: ignore[operator]
    with pytest.raises((ValueError, TypeError)):
        cache_key(record)


def test_cache_key_cli_agrees_with_the_function(tmp_path: Path) -> None:
    record_file = tmp_path / "record.json"
    record_file.write_text(json.dumps(base_record()))
    out = subprocess.run(
        runtime_cmd("cache-key", str(record_file)),
        env=child_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == cache_key(base_record())


# -- cgroups ------------------------------------------------------------------------------------


def test_v2_counters_usage_and_limit_from_files(tmp_path: Path) -> None:
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 2\n")
    (tmp_path / "memory.current").write_text("1000\n")
    (tmp_path / "memory.stat").write_text("anon 600\ninactive_file 300\n")
    (tmp_path / "memory.max").write_text("4096\n")
    cgroup = MemoryCgroup(tmp_path, 2)
    assert (cgroup.oom_kills(), cgroup.usage_bytes(), cgroup.limit_bytes()) == (2, 700, 4096)
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup.limit_bytes() is None


def test_v1_counters_usage_and_limit_from_files(tmp_path: Path) -> None:
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    (tmp_path / "memory.usage_in_bytes").write_text("5000\n")
    (tmp_path / "memory.stat").write_text("cache 10\ntotal_inactive_file 1000\n")
    (tmp_path / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    cgroup = MemoryCgroup(tmp_path, 1)
    assert (cgroup.oom_kills(), cgroup.usage_bytes(), cgroup.limit_bytes()) == (3, 4000, None)


def test_find_memory_cgroup_resolves_v2_paths_inside_and_outside_a_namespace(
    tmp_path: Path,
) -> None:
    nested = tmp_path / "kubepods" / "pod1" / "ctr"
    nested.mkdir(parents=True)
    (nested / "memory.events").write_text("oom_kill 0\n")
    mountinfo = f"30 23 0:26 / {tmp_path} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    found = find_memory_cgroup("0::/kubepods/pod1/ctr\n", mountinfo)
    assert found == MemoryCgroup(nested, 2)
    # Inside a cgroup namespace the path reads "/" and the mount is the container's own.
    (tmp_path / "memory.events").write_text("oom_kill 0\n")
    assert find_memory_cgroup("0::/\n", mountinfo) == MemoryCgroup(tmp_path, 2)


def test_find_memory_cgroup_prefers_v1_memory_on_hybrid_hosts(tmp_path: Path) -> None:
    v1 = tmp_path / "memory"
    (v1 / "job").mkdir(parents=True)
    (v1 / "job" / "memory.oom_control").write_text("oom_kill 0\n")
    unified = tmp_path / "unified"
    unified.mkdir()
    mountinfo = (
        f"35 31 0:32 / {v1} rw - cgroup cgroup rw,memory\n"
        f"41 31 0:38 / {unified} rw - cgroup2 cgroup2 rw\n"
    )
    found = find_memory_cgroup("4:memory:/job\n0::/\n", mountinfo)
    assert found == MemoryCgroup(v1 / "job", 1)
