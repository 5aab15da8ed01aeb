"""The real node's images (``images.py``), checked apart from any node.

The layout and the names the examples image answers to are checked in the fast tier.  The
``realnode`` case builds every image, imports it into a private containerd (its own root, state,
sockets, runc root and FIFO directory under a temporary directory, the CRI plugin off, so it
fights no machine-wide containerd or kubelet over ``/run/containerd`` or the CNI directory) and
runs each image's program with runc, then stops that containerd and checks it left no process,
mount, cgroup or directory.  An image fault then shows here, not as a pod stuck in
ContainerCreating on the real node.  The build and import times are printed (``pytest -s``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from argo.argo_tools import ToolError

from . import images

EXAMPLES = sorted(images.EXAMPLES.glob("*.pipe"))
#: containerd puts every shim's socket here whatever its own paths are (1.6: fixed).
SHIM_SOCKETS = Path("/run/containerd/s")


# -- fast tier ---------------------------------------------------------------------------------

def test_the_examples_image_answers_to_every_image_the_compiled_examples_run() -> None:
    names = set(images.example_image_names())
    declared = {line.split('"')[1] for pipe in EXAMPLES for line in pipe.read_text().splitlines()
                if line.strip().startswith("image") and '"' in line}
    # A pinned image answers by its tag (prep_train_eval's is pinned, W0005).
    assert any("@sha256:" in d for d in declared)
    assert declared and {d.partition("@")[0] for d in declared} <= names
    assert not [n for n in names if "@" in n]
    # A multi-node stage's pods are in its JobSet, a YAML string in a resource template.
    multinode = images.EXAMPLES / "multinode_pretrain.pipe"
    assert images.tag_names_for([multinode]) == ["ghcr.io/acme/pretrain:0.9.1"]
    # The torch image answers to the images that launch torchrun: the multi-node stage's
    # (its launch line is the compiler's) and gpu_fallback's (the user's own command).
    assert images.torchrun_image_names() == ["ghcr.io/acme/llm:2025.06",
                                             "ghcr.io/acme/pretrain:0.9.1"]


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
                for m in tar.getmembers() if m.isfile()}


def _blob(members: dict[str, bytes], digest: str) -> bytes:
    data = members[f"blobs/sha256/{digest.removeprefix('sha256:')}"]
    assert hashlib.sha256(data).hexdigest() == digest.removeprefix("sha256:")
    return data


def test_an_archive_is_an_oci_layout_that_names_its_image_and_is_the_same_each_time(
        tmp_path: Path) -> None:
    layer = tmp_path / "layer.tar"
    layer.write_bytes(images._tar_bytes([("bin/hello", b"#!/bin/sh\necho hi\n", 0o755)]))
    config: dict[str, object] = {"Entrypoint": ["/bin/hello"], "Env": [f"PATH={images.PATH}"]}
    first, second = tmp_path / "a.tar", tmp_path / "b.tar"
    images.write_oci_archive(first, "example.test/hello:1", [layer], config)
    images.write_oci_archive(second, "example.test/hello:1", [layer], config)
    members = _members(first)
    assert json.loads(members["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    (entry,) = json.loads(members["index.json"])["manifests"]
    assert entry["annotations"] == {"io.containerd.image.name": "example.test/hello:1"}
    manifest = json.loads(_blob(members, entry["digest"]))
    cfg = json.loads(_blob(members, manifest["config"]["digest"]))
    (layer_desc,) = manifest["layers"]
    assert _blob(members, layer_desc["digest"]) == layer.read_bytes()
    assert cfg["rootfs"]["diff_ids"] == [layer_desc["digest"]]  # uncompressed: the same digest
    assert cfg["config"] == config and (cfg["os"], cfg["architecture"]) == ("linux", "amd64")
    assert members == _members(second)
    assert not list(tmp_path.glob(".*.tmp"))  # the temporary archive was renamed into place


# -- realnode tier -----------------------------------------------------------------------------

def _containerd_or_skip() -> None:
    for tool, package in (("containerd", "containerd"), ("ctr", "containerd"),
                          ("containerd-shim-runc-v2", "containerd"), ("runc", "runc")):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (Debian package {package}); the real node's "
                        "images are run with it")


def _config(d: Path) -> str:
    return f"""\
version = 2
root = "{d / 'root'}"
state = "{d / 'state'}"
# Images and runc only: the CRI would claim the CNI directory and a node's sandbox image.
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{d / 'c.sock'}"
[ttrpc]
  address = "{d / 'c.sock.ttrpc'}"
[debug]
  address = ""
[metrics]
  address = ""
"""


class Containerd:
    """A running private containerd: ``ctr(...)`` in its ``k8s.io`` namespace, and ``run``,
    which starts a container with runc under this instance's own paths."""

    def __init__(self, d: Path, popen: subprocess.Popen[bytes]) -> None:
        self.dir, self.popen = d, popen

    def ctr(self, *args: str, timeout: float = 300) -> str:
        proc = subprocess.run(["ctr", "--address", str(self.dir / "c.sock"), "-n", "k8s.io", *args],
                              capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise ToolError(f"ctr {' '.join(args)} failed ({proc.returncode}): "
                            f"{proc.stderr.strip()}\n{proc.stdout[-2000:]}")
        return proc.stdout

    def run_args(self, image: str, cid: str, *command: str) -> list[str]:
        # Without these, ctr keeps FIFOs and runc's state under /run/containerd, and runc makes
        # the cgroup /k8s.io/<id> whose parent it never removes.
        return ["run", "--rm", "--fifo-dir", str(self.dir / "fifo"),
                "--runc-root", str(self.dir / "runc"), "--cgroup", f"/{self.cgroup(cid)}",
                image, cid, *command]

    def run(self, image: str, cid: str, *command: str) -> str:
        return self.ctr(*self.run_args(image, cid, *command), timeout=120)

    def cgroup(self, cid: str) -> str:
        return f"{self.dir.name}-{cid}"


@contextmanager
def private_containerd() -> Iterator[Containerd]:
    _containerd_or_skip()
    # Unix socket paths are short (108 bytes): not under pytest's long tmp_path.
    d = Path(tempfile.mkdtemp(prefix="dp-ctrd-"))
    had_run_containerd = SHIM_SOCKETS.parent.exists()
    (d / "config.toml").write_text(_config(d))
    log = open(d / "containerd.log", "wb")
    popen = subprocess.Popen(["containerd", "--config", str(d / "config.toml")],
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    node = Containerd(d, popen)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(["ctr", "--address", str(d / "c.sock"), "version"],
                             capture_output=True, check=False).returncode != 0:
            if popen.poll() is not None or time.monotonic() > deadline:
                raise ToolError(f"containerd did not serve:\n{(d / 'containerd.log').read_text()}")
            time.sleep(0.2)
        yield node
    finally:
        _stop(popen)
        log.close()
        left = _leftovers(d)
        for path in (SHIM_SOCKETS, SHIM_SOCKETS.parent):
            if not had_run_containerd:  # never a directory another containerd uses
                try:
                    path.rmdir()
                except OSError:
                    pass
        if not left:
            shutil.rmtree(d)
    assert not left, f"the private containerd left: {left}"


def _stop(popen: subprocess.Popen[bytes]) -> None:
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(timeout=30)


def _leftovers(d: Path) -> list[str]:
    left = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(d) in cmd:  # containerd itself, and its shims by their -address
                left.append(f"process {entry.name} {cmd[:200]}")
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    left += [f"mount {m.split()[4]}" for m in mounts if m.split()[4].startswith(str(d))]
    left += [f"cgroup {c}" for c in Path("/sys/fs/cgroup").glob(f"*/{d.name}-*")]
    return left


def _timed(what: str, timings: dict[str, float], fn: Callable[[], Any]) -> Any:
    t0 = time.monotonic()
    try:
        return fn()
    finally:
        timings[what] = round(time.monotonic() - t0, 1)


@pytest.mark.realnode
def test_every_image_imports_into_containerd_and_runs_its_program() -> None:
    timings: dict[str, float] = {}
    archives = _timed("build (cached after the first)", timings, images.build_images)
    assert set(archives) == set(images.IMAGE_NAMES.values())
    sizes = {name: f"{path.stat().st_size / 2**20:.1f} MiB" for name, path in archives.items()}
    with private_containerd() as node:
        _timed("import", timings, lambda: images.import_images(node.ctr, archives))
        listed = set(node.ctr("images", "ls", "-q").split())
        assert listed >= set(archives) | set(images.example_image_names())

        assert node.run(images.PYTHON_IMAGE, "py", "python3", "-c", "print(1)") == "1\n"
        # Under a name an example uses: its stage programs import from the working directory.
        script = ("import os, churn.prep, features.build; "
                  "print(os.getcwd(), os.path.exists('train.py'))")
        assert node.run("ghcr.io/acme/churn:4.1.0", "ex", "python3", "-c", script) == "/app True\n"
        # Argo's init container runs `argoexec init` by PATH, and emissary copies the binary it
        # finds there into the shared volume: it must be found as `argoexec`.
        # The multi-node example's image: Debian's torch with its torchrun, the static
        # rendezvous mended to name its store's backend (images.TORCH_MENDS).
        script = ("import torch, inspect, torch.distributed.elastic.rendezvous."
                  "static_tcp_rendezvous as r; print(torch.__version__.split('+')[0], "
                  "'use_libuv=False' in inspect.getsource(r))")
        assert node.run("ghcr.io/acme/pretrain:0.9.1", "torch", "python3", "-c",
                        script) == "2.6.0 True\n"
        usage = node.run("ghcr.io/acme/pretrain:0.9.1", "torchrun", "torchrun", "--help")
        assert "--nproc_per_node" in usage and "--master_addr" in usage, usage[:2000]
        out = node.run(images.ARGOEXEC_IMAGE, "exec", "argoexec", "version")
        assert "argoexec" in out, out
        assert node.run(images.ARGOEXEC_IMAGE, "exec2", "/bin/argoexec", "version") == out
        _pause_ends_on_sigterm(node)
    print(f"\nimage timings (s): {timings}\narchive sizes: {sizes}")


def _pause_ends_on_sigterm(node: Containerd) -> None:
    """The sandbox is PID 1 of its namespace, where a signal without a handler is ignored:
    a pause that installed none would never stop when the kubelet ends a pod."""
    ctr = subprocess.Popen(["ctr", "--address", str(node.dir / "c.sock"), "-n", "k8s.io",
                            *node.run_args(images.PAUSE_IMAGE, "pause")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while "RUNNING" not in _task(node, "pause"):
            assert ctr.poll() is None and time.monotonic() < deadline, ctr.communicate()
            time.sleep(0.2)
        node.ctr("tasks", "kill", "--signal", "SIGTERM", "pause")
        try:
            code = ctr.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the pause image did not end within 30 s of SIGTERM (PID 1 ignores a "
                        "signal it has no handler for)", pytrace=False)
        assert code == 0, ctr.communicate()
    finally:
        if ctr.poll() is None:
            node.ctr("tasks", "kill", "--signal", "SIGKILL", "pause")
            ctr.wait(timeout=30)


def _task(node: Containerd, cid: str) -> str:
    for line in node.ctr("tasks", "ls").splitlines():
        if line.split()[:1] == [cid]:
            return line
    return ""

