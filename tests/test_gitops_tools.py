"""The Argo CD Config Management Plugin and the pre-commit hooks, run as those tools run them.

The CMP sidecar (argo-cd ``cmpserver/plugin``) runs ``generate.command`` + ``generate.args``
with the Application's path as cwd and an environment of ``ARGOCD_APP_*`` variables, the
Application's ``plugin.env`` as ``ARGOCD_ENV_<NAME>``, ``KUBE_VERSION`` and
``KUBE_API_VERSIONS``, and parses stdout as a stream of YAML or JSON manifests; discovery
matches ``discover.find.glob`` in the app path.  ``pre-commit try-repo`` installs this checkout
as a hook repository exactly as a user's ``.pre-commit-config.yaml`` would (``language:
python``: a fresh virtualenv with ``pip install .``, which reaches PyPI for lark and the build
backend).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples").glob("*.pipe"))


def durapipe_bin() -> Path:
    found = shutil.which("durapipe", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                         os.environ.get("PATH", "")]))
    if found is None:
        pytest.skip("the `durapipe` script is not installed beside this Python")
    return Path(found)


def test_config_management_plugin_generates_what_argo_cd_applies(tmp_path: Path) -> None:
    plugin = yaml.safe_load((REPO / "examples" / "gitops" / "plugin.yaml").read_text())
    assert plugin["apiVersion"] == "argoproj.io/v1alpha1"
    assert plugin["kind"] == "ConfigManagementPlugin"
    app = tmp_path / "repo" / "pipelines"
    app.mkdir(parents=True)
    for path in EXAMPLES:
        shutil.copy(path, app / path.name)
    glob = plugin["spec"]["discover"]["find"]["glob"]
    assert any(fnmatch.fnmatch(p.name, glob) for p in app.iterdir())
    generate = plugin["spec"]["generate"]
    env = {
        "PATH": os.pathsep.join([str(durapipe_bin().parent), "/usr/bin", "/bin"]),
        "HOME": str(tmp_path),
        "ARGOCD_APP_NAME": "durapipe-pipelines",
        "ARGOCD_APP_NAMESPACE": "ml",
        "ARGOCD_APP_REVISION": "0123456789abcdef0123456789abcdef01234567",
        "ARGOCD_APP_REVISION_SHORT": "0123456",
        "ARGOCD_APP_SOURCE_PATH": "pipelines",
        "ARGOCD_APP_SOURCE_REPO_URL": "https://github.com/acme/ml-pipelines.git",
        "ARGOCD_APP_SOURCE_TARGET_REVISION": "main",
        "ARGOCD_ENV_DURAPIPE_FLAGS": "",
        "KUBE_VERSION": "1.31.0",
        "KUBE_API_VERSIONS": "v1,apps/v1,argoproj.io/v1alpha1,rbac.authorization.k8s.io/v1",
    }
    proc = subprocess.run([*generate["command"], *generate.get("args", [])], cwd=app, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == ["ConfigMap", "CronWorkflow", "Role", "RoleBinding", "ServiceAccount",
                     "WorkflowTemplate"] or kinds == ["ConfigMap", "Role", "RoleBinding",
                                                      "ServiceAccount", "WorkflowTemplate"]
    assert all(d["metadata"].get("name") and "generateName" not in d["metadata"] for d in docs)
    ids = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(ids) == len(set(ids))
    assert sum(d["kind"] == "RoleBinding" for d in docs) == len(EXAMPLES)
    # The Application's plugin env reaches the command: --no-rbac drops the RBAC objects.
    proc = subprocess.run([*generate["command"], *generate.get("args", [])], cwd=app,
                          env={**env, "ARGOCD_ENV_DURAPIPE_FLAGS": "--no-rbac"},
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert {d["kind"] for d in yaml.safe_load_all(proc.stdout) if d} <= {
        "WorkflowTemplate", "CronWorkflow", "ConfigMap"}


def test_the_application_example_uses_the_plugin() -> None:
    app = yaml.safe_load((REPO / "examples" / "gitops" / "application.yaml").read_text())
    plugin = yaml.safe_load((REPO / "examples" / "gitops" / "plugin.yaml").read_text())
    assert app["kind"] == "Application"
    # Argo CD names a versioned plugin `<name>-<version>`.
    assert app["spec"]["source"]["plugin"]["name"] == (
        f"{plugin['metadata']['name']}-{plugin['spec']['version']}")


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, timeout=60,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


@pytest.mark.slow
def test_pre_commit_hooks_run_with_try_repo(tmp_path: Path) -> None:
    pre_commit = shutil.which("pre-commit", path=str(Path(sys.executable).parent)) or \
        shutil.which("pre-commit")
    if pre_commit is None or shutil.which("git") is None:
        pytest.skip("pre-commit (the test extra) or git is not installed")
    hooks = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    assert [h["id"] for h in hooks] == ["durapipe-fmt", "durapipe-check", "durapipe-compile"]
    user = tmp_path / "user"
    user.mkdir()
    _git(user, "init", "-q")
    shutil.copy(REPO / "examples" / "prep_train_eval.pipe", user / "train.pipe")
    subprocess.run([str(durapipe_bin()), "compile", "train.pipe", "-o", "deploy/"], cwd=user,
                   check=True, timeout=60)
    _git(user, "add", "-A")
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "cache")}

    def try_repo(*hook: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([pre_commit, "try-repo", str(REPO), *hook, "--all-files",
                               "--verbose"], cwd=user, env=env, capture_output=True,
                              text=True, timeout=600, check=False)

    # try-repo installs the checkout as it is (uncommitted changes included) ...
    proc = try_repo("durapipe-fmt")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "durapipe fmt --check" in proc.stdout
    # ... durapipe-compile without args finds the directory of compiled output itself (the
    # issue: it failed with `--check needs -o`) ...
    proc = try_repo("durapipe-compile")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # ... and a config gives it the directory as args: the user's `.pre-commit-config.yaml`,
    # at this checkout's HEAD (one more install, shared by the three hooks).
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.strip()
    (user / ".pre-commit-config.yaml").write_text(yaml.safe_dump({"repos": [{
        "repo": str(REPO), "rev": head, "hooks": [
            {"id": "durapipe-fmt"}, {"id": "durapipe-check"},
            {"id": "durapipe-compile", "args": ["-o", "deploy/"]}]}]}))
    _git(user, "add", "-A")

    def run(hook: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([pre_commit, "run", hook, "--all-files", "--verbose"], cwd=user,
                              env=env, capture_output=True, text=True, timeout=600,
                              check=False)

    for hook in ("durapipe-fmt", "durapipe-check", "durapipe-compile"):
        proc = run(hook)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    # A stale compiled file, a badly formatted file and an error each fail their hook.
    (user / "train.pipe").write_text((user / "train.pipe").read_text().replace(
        "attempts = 1", "attempts = 2", 1) + "\n\n\n")
    _git(user, "add", "-A")
    proc = run("durapipe-compile")
    assert proc.returncode == 1 and "stale" in proc.stdout, proc.stdout
    proc = run("durapipe-fmt")
    assert proc.returncode == 1, proc.stdout
    assert run("durapipe-check").returncode == 0
    (user / "train.pipe").write_text("pipeline \"x\" {\n  colour = 1\n}\n")
    _git(user, "add", "-A")
    proc = run("durapipe-check")
    assert proc.returncode == 1 and "P0201" in proc.stdout, proc.stdout


def _pre_commit() -> str:
    found = shutil.which("pre-commit", path=str(Path(sys.executable).parent)) or \
        shutil.which("pre-commit")
    if found is None or shutil.which("git") is None:
        pytest.skip("pre-commit (the test extra) or git is not installed")
    return found


def _local_hook(hook_id: str, args: list[str]) -> dict[str, object]:
    """The project's hook definition as a `repo: local` hook: the same files, always_run and
    serial settings, run with this checkout (`language: system`, no environment to build)."""
    [hook] = [h for h in yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
              if h["id"] == hook_id]
    entry = str(hook["entry"]).replace("durapipe", f"{sys.executable} -m durapipe", 1)
    return {**hook, "entry": entry, "language": "system", "args": args}


def _gitops_repository(root: Path) -> list[Path]:
    """The examples and five more pipelines in pipelines/ (ten files, so that pre-commit
    splits them), compiled into deploy/, committed."""
    _git(root, "init", "-q")
    (root / "pipelines").mkdir()
    files = []
    for path in EXAMPLES:
        files.append(root / "pipelines" / path.name)
        shutil.copy(path, files[-1])
        twin = root / "pipelines" / f"copy_{path.name}"
        text = path.read_text()
        name = text.split('pipeline "', 1)[1].split('"', 1)[0]
        twin.write_text(text.replace(f'pipeline "{name}"', f'pipeline "{name}-copy"', 1))
        files.append(twin)
    subprocess.run([sys.executable, "-m", "durapipe", "compile",
                    *(str(f.relative_to(root)) for f in files), "-o", "deploy/",
                    "--kustomization", "--namespaces"],
                   cwd=root, check=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    return sorted(files)


@pytest.mark.slow
def test_pre_commit_splits_the_files_and_the_compile_hook_still_passes(tmp_path: Path) -> None:
    """The issue: each process of pre-commit saw some of the pipelines and called the shared
    durapipe-runtime.yaml stale.  `TRAVIS` is pre-commit's own switch for two processes
    (lang_base.target_concurrency), so the list is split on a one-core machine too; a
    recorder hook with the same file filter proves it was."""
    pre_commit = _pre_commit()
    user = tmp_path / "user"
    user.mkdir()
    files = _gitops_repository(user)
    recorder = {"id": "record", "name": "record", "language": "system", "files": r"\.pipe$",
                "entry": f"{sys.executable} -c \"import sys; open('{tmp_path}/calls', 'a')"
                         ".write(' '.join(sys.argv[1:]) + chr(10))\""}
    config = {"repos": [{"repo": "local", "hooks": [
        _local_hook("durapipe-compile", ["-o", "deploy/"]),
        {**_local_hook("durapipe-compile", []), "id": "durapipe-compile-found",
         "name": "compile --check, directory found"},
        recorder]}]}
    (user / ".pre-commit-config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    _git(user, "add", "-A")
    _git(user, "commit", "-q", "-m", "pipelines", "--no-verify")
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "cache"), "TRAVIS": "1",
           "PYTHONPATH": str(REPO)}
    proc = subprocess.run([pre_commit, "run", "--all-files"], cwd=user, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) >= 2 and all(len(c.split()) < len(files) for c in calls), calls
    assert sorted(f for c in calls for f in c.split()) == sorted(
        str(f.relative_to(user)) for f in files)
    subprocess.run([pre_commit, "install"], cwd=user, env=env, check=True,
                   capture_output=True, timeout=60)

    def commit(message: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "commit", "-q", "-m", message], cwd=user, env={
            **env, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"},
            capture_output=True, text=True, timeout=600, check=False)

    # A commit touching one .pipe file, not compiled again: refused, deploy/ is stale.
    train = user / "pipelines" / "prep_train_eval.pipe"
    train.write_text(train.read_text().replace("attempts = 1", "attempts = 2", 1))
    _git(user, "add", "-A")
    proc = commit("more attempts")
    assert proc.returncode != 0 and "stale" in proc.stdout + proc.stderr, proc.stdout
    # Compiled again (that file alone, the directory kept whole): accepted.
    compile_ = [sys.executable, "-m", "durapipe", "compile", "-o", "deploy/"]
    subprocess.run([*compile_, "pipelines/prep_train_eval.pipe"], cwd=user, env=env,
                   check=True, timeout=120)
    _git(user, "add", "-A")
    proc = commit("more attempts")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # A commit that deletes a pipeline: its compiled files are orphans until --prune.
    (user / "pipelines" / "copy_gpu_fallback.pipe").unlink()
    _git(user, "add", "-A")
    proc = commit("drop a copy")
    assert proc.returncode != 0 and "orphan" in proc.stdout + proc.stderr, proc.stdout
    subprocess.run([*compile_, "--prune"], cwd=user, env=env, check=True, timeout=120)
    _git(user, "add", "-A")
    proc = commit("drop a copy")
    assert proc.returncode == 0, proc.stdout + proc.stderr


#: Texts that tell people how to install durapipe or one of its extras.
INSTALL_TEXTS = sorted({*REPO.glob("durapipe/**/*.py"), REPO / "README.md",
                        *REPO.glob("docs/*.md"), *REPO.glob("examples/gitops/*.yaml"),
                        REPO / ".pre-commit-hooks.yaml"})


def test_no_install_command_names_a_durapipe_release_that_does_not_exist() -> None:
    """The issue: `pip install durapipe` and `pip install 'durapipe[cluster]'` (not on PyPI),
    `rev: v0.1.0` (no such tag).  durapipe comes from git at a commit or from a wheel."""
    import re

    from_pypi = re.compile(
        r"pip install (?:-[-\w]+ )*['\"]?durapipe(\[[\w,]+\])?(?![\w.[-]|\s*@)")
    assert from_pypi.search("pip install 'durapipe[cluster]'")  # what the code said
    assert from_pypi.search("and `pip install durapipe` (see")
    assert not from_pypi.search('pip install "durapipe[s3] @ git+https://x/durapipe@abc"')
    bad = [f"{p.relative_to(REPO)}: {m.group()}" for p in INSTALL_TEXTS
           for m in from_pypi.finditer(p.read_text(encoding="utf-8"))]
    assert bad == []
    assert not [p for p in INSTALL_TEXTS if re.search(r"rev: v\d", p.read_text())]


def test_the_extras_messages_match_pyproject() -> None:
    tomllib = pytest.importorskip("tomllib", reason="Python >= 3.11 reads pyproject.toml")
    from durapipe.extras import EXTRAS, install_hint

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for name, requirements in EXTRAS.items():
        assert list(requirements) == extras[name]
        assert all(f"'{r}'" in install_hint(name) for r in requirements)


@pytest.mark.slow
def test_a_wheel_built_from_this_checkout_installs_and_compiles(tmp_path: Path) -> None:
    """README, "Install": `pip wheel --no-deps -w dist/ .`, then `pip install` of the wheel
    (here without network: no build isolation, lark from this environment)."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path / "dist"), str(REPO)],
                   check=True, capture_output=True, timeout=300)
    [wheel] = (tmp_path / "dist").glob("durapipe-*.whl")
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(target), str(wheel)], check=True, capture_output=True, timeout=300)
    code = ("import sys, durapipe, durapipe.cli; assert durapipe.__file__.startswith(sys.argv[1]),"
            " durapipe.__file__; sys.exit(durapipe.cli.main(['compile', sys.argv[2]]))")
    proc = subprocess.run([sys.executable, "-c", code, str(target),
                           str(REPO / "examples" / "prep_train_eval.pipe")],
                          env={**os.environ, "PYTHONPATH": str(target)}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("# Generated by durapipe")
