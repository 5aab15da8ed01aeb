"""The images the real node runs, built here and imported into containerd, never pulled.

- ``PAUSE_IMAGE``: the pod sandbox, a static C program (``pause.c``, ``gcc -static``);
- ``PYTHON_IMAGE``: Debian bookworm's ``python3`` (``mmdebstrap --variant=essential``: its tar
  is the one layer), with ``python`` meaning ``python3`` (``python-is-python3``);
- ``EXAMPLES_IMAGE``: that Python with the examples' stage programs on top (the ``churn`` and
  ``features`` packages importable, ``train.py`` and the rest in the working directory
  ``/app``), answering to every image name the compiled ``examples/*.pipe`` use
  (``example_image_names``, ``tag_names_for``) but those that launch ``torchrun``, so the
  examples' output runs unchanged;
- ``TORCH_IMAGE``: the same programs over Debian trixie's ``python3-torch`` (PyTorch 2.6 and
  its real ``torchrun``), answering to the images whose compiled command launches ``torchrun``
  (``torchrun_image_names``: the multi-node example's, whose pods rendezvous over cluster DNS,
  and gpu_fallback's, whose own command is torchrun);
  one file of Debian's torch is mended (``TORCH_MENDS``);
- ``ARGOEXEC_IMAGE``: Argo's ``argoexec`` v4.1.2 built from ``../shared``'s source
  (``CGO_ENABLED=0``) at ``/bin/argoexec``, as Argo's own image has it.

Each is an OCI image layout in a tar (``oci-layout``, ``index.json`` naming the image with the
``io.containerd.image.name`` annotation, a manifest, a config with the layers' ``diff_ids``),
written with the standard library and cached under ``~/.cache/durapipe/images/<inputs>``; an
archive is renamed into place when whole, and a lock makes parallel sessions build it once.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest
import yaml

from argo.argo_tools import ToolError, _locked, argo_source_or_skip, build_go_command

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"
PAUSE_SOURCE = Path(__file__).with_name("pause.c")

#: containerd's sandbox image (its config names it; the kubelet 1.35 default tag).
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.1"
PYTHON_IMAGE = "durapipe.local/python:bookworm"
EXAMPLES_IMAGE = "durapipe.local/examples:latest"
ARGOEXEC_IMAGE = "quay.io/argoproj/argoexec:v4.1.2"
TORCH_IMAGE = "durapipe.local/examples-torch:latest"
#: Every image ``build_images`` makes, by role.
IMAGE_NAMES = {"pause": PAUSE_IMAGE, "python": PYTHON_IMAGE, "examples": EXAMPLES_IMAGE,
               "torch": TORCH_IMAGE, "argoexec": ARGOEXEC_IMAGE}
#: Debian's suite and the packages of the Python image.
SUITE = "bookworm"
PACKAGES = ("python3", "ca-certificates", "python-is-python3")
#: The torch image's: trixie, whose python3-torch is 2.6.  Bookworm's 1.13 cannot launch
#: anything on bookworm's own Python 3.11: torchrun's default ``--redirects=0`` becomes None in
#: ``Std.from_str`` (3.11's Flag no longer holds a zero pseudo-member), and the agent fails on
#: ``None.get`` before any worker starts.
TORCH_SUITE = "trixie"
TORCH_PACKAGES = (*PACKAGES, "python3-torch")
#: Where each suite's python3 looks for packages installed outside Debian.
SITE_PACKAGES = {"bookworm": "usr/local/lib/python3.11/dist-packages",
                 "trixie": "usr/local/lib/python3.13/dist-packages"}
#: Debian's torch 2.6 is built without libuv, and torchrun's static rendezvous (the one a
#: JobSet's launch line uses) creates its TCPStore without saying which backend, so 2.6's
#: default (libuv) is refused: "use_libuv was requested but PyTorch was build without libuv
#: support", on every node, before any worker starts.  PyPI's and conda's builds have libuv.
#: The image carries that file with the backend named: file -> (line, replacement).
TORCH_MENDS = {
    "usr/lib/python3/dist-packages/torch/distributed/elastic/rendezvous/"
    "static_tcp_rendezvous.py": ("                multi_tenant=True,\n",
                                "                multi_tenant=True,\n"
                                "                use_libuv=False,  # durapipe's test image: "
                                "Debian builds torch without libuv\n"),
}
#: The examples' Python packages (``python -m churn.prep``) and their top-level files.
EXAMPLE_PACKAGES = ("churn", "features")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def images_root() -> Path:
    root = os.environ.get("DURAPIPE_IMAGES_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "durapipe" / "images"


def requirements_or_skip() -> None:
    for tool, package in (("mmdebstrap", "mmdebstrap"), ("gcc", "gcc")):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (Debian package {package}); the real node's "
                        "images are built with it")


def tag_names_for(pipes: Iterable[Path], launching: str | None = None) -> list[str]:
    """Every image the compiled output of ``pipes`` runs (with ``launching``, those whose
    container's command or args has that word), sorted.

    Read from what the compiler emits, not from the source's ``image = "..."`` lines, so an
    image that only appears inside a resource template's manifest (a multi-node stage's JobSet
    is a YAML string there) is named too."""
    from durapipe.compiler import CompileOptions, compile_pipeline
    from durapipe.dsl import load_path
    from durapipe.dsl.diagnostics import render

    names: set[str] = set()
    for pipe in pipes:
        loaded = load_path(pipe)
        if loaded.pipeline is None:
            raise ToolError(f"{pipe} does not load:\n{render(loaded.diagnostics)}")
        # The runtime's bytes change no image; a placeholder spares building the zipapp.
        result = compile_pipeline(loaded.pipeline, CompileOptions(runtime_archive=b"-"))
        if not result.ok:
            raise ToolError(f"{pipe} does not compile:\n{render(result.diagnostics)}")
        # A pinned image (`name:tag@sha256:...`) answers here to its tag: the digest names a
        # registry's manifest, which an image built here does not have, so the real-node
        # overlay runs the tag (tests/realnode/pipelines.py).
        for doc in result.documents:
            names.update(image.partition("@")[0] for image in _images_in(doc, launching))
    return sorted(names)


def _images_in(node: object, launching: str | None = None) -> Iterator[str]:
    if isinstance(node, dict):
        image = node.get("image")
        words = [*(node.get("command") or []), *(node.get("args") or [])]
        if isinstance(image, str) and (launching is None or launching in words):
            yield image
        for key, value in node.items():
            if key == "manifest" and isinstance(value, str):
                for doc in yaml.safe_load_all(value):
                    yield from _images_in(doc, launching)
            elif key != "image":
                yield from _images_in(value, launching)
    elif isinstance(node, list):
        for item in node:
            yield from _images_in(item, launching)


def example_image_names() -> list[str]:
    """Every image the compiled examples/*.pipe run, which the examples image answers to."""
    return tag_names_for(sorted(EXAMPLES.glob("*.pipe")))


def torchrun_image_names() -> list[str]:
    """The images of the compiled examples that launch ``torchrun`` (the multi-node
    stage's launch line, or a command of the user's), which the torch image answers to."""
    return tag_names_for(sorted(EXAMPLES.glob("*.pipe")), launching="torchrun")


# -- OCI image layouts -------------------------------------------------------------------------

def _digest_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _tar_bytes(members: Iterable[tuple[str, bytes, int]]) -> bytes:
    """A layer of regular files (name, content, mode), directories implied; fixed times and
    owners, so the same content is the same layer."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        for name, data, mode in sorted(members):
            parts = name.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_oci_archive(out: Path, name: str, layers: list[Path], config: dict[str, object]) -> None:
    """An OCI image layout tar at ``out`` for ``name``: ``layers`` (uncompressed tars, base
    first) with the image ``config`` (Entrypoint, Cmd, Env, WorkingDir)."""
    layer_digests = [(_digest_file(p), p.stat().st_size, p) for p in layers]
    cfg = json.dumps({
        "architecture": "amd64", "os": "linux", "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{d}" for d, _, _ in layer_digests]},
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": f"sha256:{hashlib.sha256(cfg).hexdigest()}", "size": len(cfg)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": f"sha256:{d}", "size": size} for d, size, _ in layer_digests],
    }, sort_keys=True).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": f"sha256:{hashlib.sha256(manifest).hexdigest()}", "size": len(manifest),
        "annotations": {"io.containerd.image.name": name},
    }]}, sort_keys=True).encode()
    tmp = out.with_name(f".{out.name}.tmp")
    with tarfile.open(tmp, "w") as tar:
        def put(member: str, data: bytes) -> None:
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        put("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        put("index.json", index)
        for blob in (cfg, manifest):
            put(f"blobs/sha256/{hashlib.sha256(blob).hexdigest()}", blob)
        for digest, _, path in layer_digests:
            tar.add(path, arcname=f"blobs/sha256/{digest}")
    tmp.replace(out)


# -- the images ----------------------------------------------------------------------------------

def _cached(key: str, inputs: bytes, build: Callable[[Path], None],
            artifact: str = "image.tar") -> Path:
    """``build(dir)`` once per content of ``inputs``; what it made, ``dir/<artifact>``."""
    out_dir = images_root() / f"{key}-{hashlib.sha256(inputs).hexdigest()[:16]}"
    archive = out_dir / artifact
    if archive.exists():
        return archive
    with _locked(images_root() / f"{key}.lock"):
        if not archive.exists():
            out_dir.mkdir(parents=True, exist_ok=True)
            build(out_dir)
    return archive


def _run(args: list[str], cwd: Path | None = None, timeout: float = 900) -> None:
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          check=False)
    if proc.returncode != 0:
        raise ToolError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")


def pause_image() -> Path:
    source = PAUSE_SOURCE.read_bytes()

    def build(out: Path) -> None:
        _run(["gcc", "-static", "-O2", "-o", str(out / "pause"), str(PAUSE_SOURCE)])
        layer = out / "layer.tar"
        layer.write_bytes(_tar_bytes([("pause", (out / "pause").read_bytes(), 0o755)]))
        write_oci_archive(out / "image.tar", PAUSE_IMAGE, [layer], {"Entrypoint": ["/pause"]})

    return _cached("pause", source, build)


def _debian_rootfs(out: Path, suite: str, packages: tuple[str, ...]) -> Path:
    rootfs = out / "rootfs.tar"
    tmp = out / ".rootfs.partial.tar"  # mmdebstrap picks the format by the suffix
    _run(["mmdebstrap", "--quiet", "--variant=essential", f"--include={','.join(packages)}",
          suite, str(tmp)], timeout=1800)
    tmp.replace(rootfs)
    return rootfs


def python_rootfs() -> Path:
    """The bookworm rootfs tar (the Python image's only layer)."""
    def build(out: Path) -> None:
        rootfs = _debian_rootfs(out, SUITE, PACKAGES)
        write_oci_archive(out / "image.tar", PYTHON_IMAGE, [rootfs],
                          {"Env": [f"PATH={PATH}"], "Cmd": ["python3"]})

    archive = _cached("python", f"{SUITE} {' '.join(PACKAGES)}".encode(), build)
    return archive.with_name("rootfs.tar")


def python_image() -> Path:
    return python_rootfs().with_name("image.tar")


def torch_rootfs() -> Path:
    """The trixie rootfs with Debian's PyTorch (the torch image's first layer, 1.2 GB)."""
    def build(out: Path) -> None:
        _debian_rootfs(out, TORCH_SUITE, TORCH_PACKAGES)

    return _cached("torch-rootfs", f"{TORCH_SUITE} {' '.join(TORCH_PACKAGES)}".encode(), build,
                   artifact="rootfs.tar")


def _mended_torch_files(rootfs: Path) -> list[tuple[str, bytes, int]]:
    """``TORCH_MENDS`` applied to the files as the rootfs has them; an error where a file no
    longer has the line (a new torch: see whether the mend is still needed)."""
    files = []
    with tarfile.open(rootfs) as tar:
        for name, (line, replacement) in TORCH_MENDS.items():
            member = tar.getmember(f"./{name}")
            text = tar.extractfile(member).read().decode()  # type: ignore[union-attr]
            if text.count(line) != 1:
                raise ToolError(f"{name} in {TORCH_SUITE}'s python3-torch no longer has the "
                                f"line the torch image mends: {line!r}")
            files.append((name, text.replace(line, replacement).encode(), 0o644))
    return files


def _example_files(site_packages: str) -> list[tuple[str, bytes, int]]:
    files: list[tuple[str, bytes, int]] = []
    for package in EXAMPLE_PACKAGES:
        for path in sorted((EXAMPLES / package).rglob("*.py")):
            rel = path.relative_to(EXAMPLES).as_posix()
            files.append((f"{site_packages}/{rel}", path.read_bytes(), 0o644))
    for path in sorted(EXAMPLES.glob("*.py")):
        files.append((f"app/{path.name}", path.read_bytes(), 0o644))
    for path in sorted((EXAMPLES / "configs").glob("*")):
        files.append((f"app/configs/{path.name}", path.read_bytes(), 0o644))
    return files


def _programs_image(key: str, name: str, rootfs: Path, files: list[tuple[str, bytes, int]]
                    ) -> Path:
    """``rootfs`` with ``files`` as a second layer, run in ``/app``."""
    layer_bytes = _tar_bytes(files)

    def build(out: Path) -> None:
        layer = out / "examples.tar"
        layer.write_bytes(layer_bytes)
        write_oci_archive(out / "image.tar", name, [rootfs, layer],
                          {"Env": [f"PATH={PATH}"], "Cmd": ["python3"], "WorkingDir": "/app"})

    return _cached(key, rootfs.parent.name.encode() + layer_bytes, build)


def examples_image() -> Path:
    return _programs_image("examples", EXAMPLES_IMAGE, python_rootfs(),
                           _example_files(SITE_PACKAGES[SUITE]))


def torch_image() -> Path:
    rootfs = torch_rootfs()
    return _programs_image("examples-torch", TORCH_IMAGE, rootfs,
                           _mended_torch_files(rootfs) + _example_files(SITE_PACKAGES[TORCH_SUITE]))


def argoexec_image() -> Path:
    argo_dir = REPO_ROOT / "tools" / "cluster" / "argo"
    argo_source_or_skip(argo_dir)
    # Static: the image has no C library. Argo's own image is distroless (CA certificates, /tmp).
    binary = build_go_command("cluster/argo", "argoexec",
                              "github.com/argoproj/argo-workflows/v4/cmd/argoexec",
                              env={"CGO_ENABLED": "0"})
    certs = Path("/etc/ssl/certs/ca-certificates.crt")

    def build(out: Path) -> None:
        members = [("bin/argoexec", binary.read_bytes(), 0o755)]
        if certs.exists():
            members.append(("etc/ssl/certs/ca-certificates.crt", certs.read_bytes(), 0o644))
        layer = out / "layer.tar"
        layer.write_bytes(_tar_bytes(members))
        with tarfile.open(layer, "a") as tar:  # argoexec writes temporary files
            info = tarfile.TarInfo("tmp")
            info.type, info.mode = tarfile.DIRTYPE, 0o1777
            tar.addfile(info)
        write_oci_archive(out / "image.tar", ARGOEXEC_IMAGE, [layer],
                          {"Env": [f"PATH={PATH}"], "Entrypoint": ["argoexec"]})

    # The host's CA bundle goes into the layer, so a changed bundle is a new image.
    inputs = [binary.parent.name, _digest_file(binary),
              _digest_file(certs) if certs.exists() else ""]
    return _cached("argoexec", " ".join(inputs).encode(), build)


def build_images() -> dict[str, Path]:
    """Every image the real node runs: name -> OCI archive (built once, then cached)."""
    requirements_or_skip()
    return {PAUSE_IMAGE: pause_image(), PYTHON_IMAGE: python_image(),
            EXAMPLES_IMAGE: examples_image(), TORCH_IMAGE: torch_image(),
            ARGOEXEC_IMAGE: argoexec_image()}


def import_images(ctr: Callable[..., str], archives: dict[str, Path]) -> None:
    """Import each archive with ``ctr`` (a ``ctr -n k8s.io`` runner) and give the examples
    image every name the examples use, the torch image those that launch ``torchrun``."""
    for archive in archives.values():
        ctr("images", "import", str(archive))
    launching = set(torchrun_image_names())
    for name in example_image_names():
        ctr("images", "tag", "--force", TORCH_IMAGE if name in launching else EXAMPLES_IMAGE,
            name)
