"""Build and run the Go tools under ``tools/`` that execute Argo Workflows' own code.

``argo_check(paths)`` runs Argo's offline validation (``argo lint --offline``) and
``run_scenario(scenario)`` runs a scenario through Argo's workflow controller (see
docs/argo-harness.md). Both build their Go program on first use and cache the binary under
``$DURAPIPE_TOOLS_CACHE`` (default ``~/.cache/durapipe/go-tools``), keyed by a hash of the Go
sources and the Go version, so only a change to ``tools/`` pays for a rebuild. Where Go is
missing or too old they call ``pytest.skip``; CI's ``DURAPIPE_STRICT_SKIPS=1`` turns that into a
failure.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS = REPO_ROOT / "tools"
ARGO_MODULE = "github.com/argoproj/argo-workflows/v4"
CONTROLLER_PKG = f"{ARGO_MODULE}/workflow/controller"
EXECUTOR_PKG = f"{ARGO_MODULE}/workflow/executor"
#: Our Go files (dir under tools/argo-sim) -> the Argo package dir they are overlaid into.
OVERLAYS = {
    "harness": "workflow/controller",
    "conditions": "workflow/executor",
    "podqueue": "workflow/controller/pod",
}
#: Argo v4.1.2's go.mod says go 1.26.5, so older toolchains cannot build it.
MIN_GO = (1, 26, 5)
BUILD_TIMEOUT_S = 1500


class ToolError(RuntimeError):
    """A Go tool failed to build or crashed (as opposed to reporting a finding)."""


@dataclass(frozen=True)
class CheckResult:
    """One Argo object as judged by Argo's validator."""

    file: str
    index: int
    kind: str
    name: str
    ok: bool
    error: str = ""


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    # The checkout may have no commit yet, and VCS stamping would then fail the build.
    env["GOFLAGS"] = (env.get("GOFLAGS", "") + " -buildvcs=false").strip()
    # Never let `go` fetch another toolchain on its own: a too-old Go must skip, not download.
    env["GOTOOLCHAIN"] = "local"
    return env


def go_or_skip() -> str:
    """Path of a usable ``go``, or ``pytest.skip`` with the reason."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("Go is not installed; the Argo tools under tools/ need Go >= 1.26.5")
    out = subprocess.run(
        [go, "env", "GOVERSION"], capture_output=True, text=True, env=_go_env(), check=False
    ).stdout.strip()
    m = re.match(r"go(\d+)\.(\d+)(?:\.(\d+))?", out)
    if m is None or (int(m[1]), int(m[2]), int(m[3] or 0)) < MIN_GO:
        pytest.skip(f"Go {out or '?'} is too old for the Argo tools (need >= 1.26.5)")
    return go


def cache_root() -> Path:
    root = os.environ.get("DURAPIPE_TOOLS_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "durapipe" / "go-tools"


def _replaces_argo(tool_dir: Path) -> bool:
    return re.search(rf"^replace\s+{re.escape(ARGO_MODULE)}\s+=>",
                     (tool_dir / "go.mod").read_text(), re.M) is not None


def argo_source_or_skip(tool_dir: Path) -> Path:
    """The Argo v4.1.2 module source that the tool's go.mod ``replace``s Argo with.

    The Go module proxy serves no v4.1.x of Argo, so the source lives in ``../shared`` beside
    the checkout (always there in CI); a user's clone without it skips with the reason.
    """
    for line in (tool_dir / "go.mod").read_text().splitlines():
        m = re.match(rf"replace\s+{re.escape(ARGO_MODULE)}\s+=>\s+(\S+)\s*$", line.strip())
        if m:
            src = (tool_dir / m[1]).resolve()
            if not (src / "go.mod").is_file():
                pytest.skip(f"Argo's v4.1.2 source is not at {src} (../shared is absent); "
                            f"the Argo tools build from it")
            return src
    raise ToolError(f"{tool_dir / 'go.mod'} does not replace {ARGO_MODULE}")


def go_module_dir(tool_dir: Path, module: str = ARGO_MODULE) -> Path:
    """Where Go itself reads ``module`` from when building ``tool_dir``: a ``replace`` path
    joined to the module root without resolving links, so with ``../shared`` a symlink it is
    not :func:`argo_source_or_skip`'s resolved path.  ``-overlay`` targets must use this one:
    an overlay keyed by another spelling of the same file is silently ignored."""
    env = _go_env()
    env["GOWORK"] = "off"
    proc = subprocess.run(
        [go_or_skip(), "list", "-m", "-f", "{{.Dir}}", module], cwd=tool_dir, env=env,
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise ToolError(f"go list -m {module} failed in {tool_dir}:\n{proc.stderr}")
    return Path(proc.stdout.strip())


def source_hash(tool_dir: Path, go: str) -> str:
    """Hash of everything that decides the build: our Go sources and module files, the
    replaced Argo source they build against (if any), and Go's version. Other dependencies are
    pinned by go.sum, which is hashed."""
    h = hashlib.sha256()
    h.update(subprocess.run([go, "version"], capture_output=True, check=True).stdout)
    roots = [tool_dir]
    if _replaces_argo(tool_dir):
        roots.append(argo_source_or_skip(tool_dir))
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.is_file() and (path.suffix == ".go" or path.name in ("go.mod", "go.sum")
                                   or "testdata" in path.parts):
                h.update(str(path.relative_to(root)).encode() + b"\0")
                h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise builds of one tool across concurrent pytest processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run_go(args: list[str], cwd: Path, env: dict[str, str],
            timeout: float = BUILD_TIMEOUT_S) -> None:
    proc = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise ToolError(f"{' '.join(args)} failed in {cwd}:\n{proc.stdout}\n{proc.stderr}")


def _cached_build(name: str, build: Any, tool: str | None = None) -> Path:
    """``name`` built by ``build(go, tool_dir, out_dir, tmp)`` from ``tools/<tool>`` (default
    ``tools/<name>``), cached under ``<tool>-<hash>/<name>``."""
    if os.environ.get("DURAPIPE_TEST_TIER") == "fast":
        # The fast tier promises no Go build: a test that needs one lacks its full-tier marker.
        pytest.fail(f"this test needs tools/{tool or name} (Go) but is in the fast tier: mark it "
                    "`harness` (or `e2e`) so that only `pytest --full` runs it", pytrace=False)
    go = go_or_skip()
    tool = tool or name
    tool_dir = TOOLS / tool
    out_dir = cache_root() / f"{tool.replace('/', '-')}-{source_hash(tool_dir, go)}"
    binary = out_dir / name
    if binary.exists():
        return binary
    with _locked(cache_root() / f"{tool.replace('/', '-')}.lock"):
        if not binary.exists():
            out_dir.mkdir(parents=True, exist_ok=True)
            tmp = out_dir / f".{name}.tmp"
            build(go, tool_dir, out_dir, tmp)
            tmp.replace(binary)  # atomic: a half-written binary is never picked up
    return binary


def build_go_command(tool: str, name: str, package: str,
                     overlay: dict[str, Path] | None = None, ldflags: str = "",
                     env: dict[str, str] | None = None) -> Path:
    """The command ``package`` built from the module ``tools/<tool>`` as ``name`` (cached).

    ``overlay`` adds files to packages of the build, as ``go build -overlay`` does:
    target path (inside a replaced module's source) -> our file."""

    extra_env = env or {}

    def build(go: str, tool_dir: Path, out_dir: Path, tmp: Path) -> None:
        env = {**_go_env(), **extra_env}
        env["GOWORK"] = "off"
        args = [go, "build", f"-ldflags=-s {ldflags}".strip()]
        if overlay:
            spec = out_dir / f"{name}.overlay.json"
            spec.write_text(json.dumps({"Replace": {k: str(v) for k, v in overlay.items()}}))
            args += ["-overlay", str(spec)]
        # kube-apiserver alone took 22 min on a loaded 2-core machine with an empty build cache.
        _run_go([*args, "-o", str(tmp), package], tool_dir, env, timeout=3 * BUILD_TIMEOUT_S)

    return _cached_build(name, build, tool=tool)


def build_argo_check() -> Path:
    def build(go: str, tool_dir: Path, _out: Path, tmp: Path) -> None:
        _run_go([go, "build", "-o", str(tmp), "."], tool_dir, _go_env())

    return _cached_build("argo-check", build)


def harness_overlay(tool_dir: Path, argo_dir: Path) -> dict[str, str]:
    """Where in Argo's source (``argo_dir``) ``go test -overlay`` adds each of our Go files
    (``OVERLAYS``, under ``tool_dir``)."""
    return {str(argo_dir / pkg_dir / f.name): str(f)
            for src, pkg_dir in OVERLAYS.items()
            for f in sorted((tool_dir / src).glob("*.go"))}


def compile_test_binary(go: str, tool_dir: Path, overlay: Path, package: str, out: Path) -> None:
    """``package``'s test binary with the files ``overlay`` (a ``-overlay`` JSON) replaces."""
    _run_go([go, "test", "-c", "-vet=off", "-overlay", str(overlay), "-o", str(out), package],
            tool_dir, {**_go_env(), "GOWORK": "off"})


def build_argo_sim() -> Path:
    """Compile Argo's workflow/controller and workflow/executor test binaries with our
    harness files added to them (``argo-sim`` and, beside it, ``argo-conditions``).

    go.mod replaces Argo with its v4.1.2 source in ``../shared``; ``go test -overlay`` adds
    ``harness/zz_argosim_test.go`` (and the pod-cleanup hooks of ``podqueue/``) to that source's
    packages at build time, so no Argo file is copied or edited and nothing is written into the
    (read-only) source tree.
    """

    def build(go: str, tool_dir: Path, out_dir: Path, tmp: Path) -> None:
        argo_dir = go_module_dir(tool_dir)  # _cached_build's source hash skipped without it
        overlay = out_dir / "overlay.json"
        overlay.write_text(json.dumps({"Replace": harness_overlay(tool_dir, argo_dir)}))
        # The executor's binary first: argo-sim appearing last marks the build complete.
        compile_test_binary(go, tool_dir, overlay, EXECUTOR_PKG, out_dir / "argo-conditions")
        compile_test_binary(go, tool_dir, overlay, CONTROLLER_PKG, tmp)

    return _cached_build("argo-sim", build)


def argo_check(paths: Iterable[str | os.PathLike[str]], namespace: str = "") -> list[CheckResult]:
    """Validate every Argo object in ``paths`` (files or directories) with Argo's own linter.

    WorkflowTemplates and ClusterWorkflowTemplates among ``paths`` resolve ``templateRef``s.
    Returns one result per object; a non-empty ``error`` says why Argo rejected it.
    """
    binary = build_argo_check()
    args = [str(binary)]
    if namespace:
        args += ["-namespace", namespace]
    args += [str(p) for p in paths]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode not in (0, 1):
        raise ToolError(f"argo-check exited {proc.returncode}:\n{proc.stderr}")
    results = [CheckResult(**json.loads(line)) for line in proc.stdout.splitlines() if line]
    if (proc.returncode == 1) != any(not r.ok for r in results):
        raise ToolError(f"argo-check exit code {proc.returncode} disagrees with its results")
    return results


#: Informer lags every scenario must give the same result under (see ``run_scenario``), by test id.
INFORMER_LAGS = {"prompt-informer": "", "lagging-informer": "5ms"}


def run_scenario(
    scenario: dict[str, Any], timeout: float = 300, informer_lag: str = "",
    binary: Path | None = None,
) -> dict[str, Any]:
    """Run one scenario (see tests/argo/scenarios/) through Argo's controller; return its report.

    ``timeout`` bounds the run in wall-clock seconds (large workflows need more).
    ``informer_lag`` (a Go duration, e.g. ``"5ms"``) delays every pod event the controller's
    informer receives, as a loaded machine does; a scenario's result must not depend on it.
    ``binary``: another build of argo-sim (benchmarks/operate_cost.py's patched Argo)."""
    binary = binary or build_argo_sim()
    with tempfile.TemporaryDirectory(prefix="argosim-") as tmp:
        inp = Path(tmp) / "in.json"
        out = Path(tmp) / "out.json"
        inp.write_text(json.dumps(scenario))
        # Without INFORMER_WRITE_BACK Argo sleeps 1 s after every workflow update (v4.0).
        env = dict(os.environ, ARGOSIM_IN=str(inp), ARGOSIM_OUT=str(out), INFORMER_WRITE_BACK="true",
                   ARGOSIM_WATCH_LAG=informer_lag)
        proc = subprocess.run(
            [str(binary), "-test.run", "^TestArgoSim$", "-test.count=1"],
            cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout, check=False,
        )
        if not out.exists():
            raise ToolError(f"argo-sim wrote no report (exit {proc.returncode}):\n"
                            f"{proc.stdout[-8000:]}\n{proc.stderr[-4000:]}")
        report: dict[str, Any] = json.loads(out.read_text())
        report["_log"] = proc.stdout[-20000:]
        return report


def resource_conditions(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Evaluate resource-template success/failure conditions with Argo's executor code.

    Each case: ``name``, ``successCondition``, ``failureCondition``, ``object`` (the resource
    as the API server returns it). Returns ``{name, verdict, error}`` with verdict
    ``succeeded``, ``failed``, ``waiting`` (neither matched yet) or ``invalid``.
    """
    binary = build_argo_sim().parent / "argo-conditions"
    with tempfile.TemporaryDirectory(prefix="argocond-") as tmp:
        inp = Path(tmp) / "in.json"
        out = Path(tmp) / "out.json"
        inp.write_text(json.dumps(cases))
        env = dict(os.environ, ARGOSIM_IN=str(inp), ARGOSIM_OUT=str(out))
        proc = subprocess.run(
            [str(binary), "-test.run", "^TestArgoSimConditions$", "-test.count=1"],
            cwd=tmp, env=env, capture_output=True, text=True, timeout=120, check=False,
        )
        if proc.returncode != 0 or not out.exists():
            raise ToolError(f"argo-conditions failed ({proc.returncode}):\n{proc.stdout[-4000:]}")
        result: list[dict[str, Any]] = json.loads(out.read_text())
        return result
