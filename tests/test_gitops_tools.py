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
    # ... and durapipe-compile needs its output directory as args, which only a config
    # gives: the user's `.pre-commit-config.yaml`, at this checkout's HEAD (one more install,
    # shared by the three hooks).
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
