"""The examples as a user runs them on a small cluster: the example's own pipeline, loaded and
resized by a builder module (what `durapipe compile` accepts), compiled for GitOps, applied,
then started with `durapipe submit --template` and read with `durapipe status`/`watch`.

Nothing here edits compiled YAML: what the cluster runs is what `durapipe compile` wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from .conftest import STORE_SECRET, Real

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"

#: The overlay a user writes to try an example on a 2-core node: every stage asks for `cpu`
#: and `memory` (each rung of a ladder scaled to `ladder`), and the store's Secret is named.
OVERLAY = '''\
"""{example} on a small development cluster (2 cores): the example's pipeline, resized."""
from dataclasses import replace
from durapipe.dsl.load import load_path

_example = load_path({path!r}).pipeline
assert _example is not None, "the example does not load"


def _small(stage):
    resources = replace(stage.resources, cpu={cpu!r},
                        memory={memory!r} if stage.resources.memory is not None else None)
    retry = stage.retry
    ladder = {ladder!r}
    if ladder and retry is not None and retry.on_oom is not None:
        retry = replace(retry, on_oom=replace(retry.on_oom, memory=tuple(ladder)))
    preemptions = {preemptions!r}
    if preemptions is not None and retry is not None:
        retry = replace(retry, preemptions=preemptions)
    # The node's images are built here and imported by tag (tests/e2e/images.py): a digest
    # names a registry's manifest, which a locally built image does not have, so the overlay
    # runs the tag, as on a development cluster with images loaded into its nodes.
    return replace(stage, image=stage.image.partition("@")[0], resources=resources,
                   retry=retry)


pipeline = replace(_example, storage_secret={secret!r},
                   stages=tuple(_small(s) for s in _example.stages))
'''


def overlay(tmp: Path, example: str, *, cpu: int = 100, memory: int = 256 * 2**20,
            ladder: tuple[int, ...] = (), preemptions: int | None = None) -> Path:
    """A builder module resizing ``examples/<example>``: ``cpu`` in millicores, ``memory``
    and the ``ladder`` rungs in bytes (the model's units); ``preemptions``, where given, is
    every retried stage's preemption budget."""
    module = tmp / f"small_{Path(example).stem}.py"
    module.write_text(OVERLAY.format(example=example, path=str(EXAMPLES / example), cpu=cpu,
                                     memory=memory, ladder=list(ladder), secret=STORE_SECRET,
                                     preemptions=preemptions))
    return module


def durapipe(*args: str, real: Real, check: bool = True,
             timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(real.cluster.kubeconfig),
           # the examples' stage programs (churn, features) for `durapipe run` comparisons
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "durapipe", *args], capture_output=True,
                          text=True, env=env, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"durapipe {' '.join(args)} exited {proc.returncode}:\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


def deploy(real: Real, module: Path, out: Path) -> list[dict[str, Any]]:
    """`durapipe compile --gitops -o out/` and a server-side apply of everything it wrote."""
    import yaml

    durapipe("compile", str(module), "--gitops", "-o", f"{out}/", real=real)
    docs = [d for f in sorted(out.glob("*.yaml")) if f.name != "kustomization.yaml"
            for d in yaml.safe_load_all(f.read_text()) if d]
    for doc in docs:
        ns = doc.get("metadata", {}).get("namespace")
        if ns:
            real.namespace(ns)
    real.cluster.apply(docs)
    return docs


def submit(real: Real, template: str, namespace: str, *params: str) -> str:
    args = ["submit", "--template", template, "-n", namespace]
    for p in params:
        args += ["-p", p]
    return durapipe(*args, real=real).stdout.strip()


def run_to_end(real: Real, source: Path, tmp: Path, template: str, namespace: str,
               *params: str, timeout: float) -> tuple[str, dict[str, Any], float]:
    """Deploy ``source`` (a .pipe or builder module), start one run and wait for its end:
    the run's name, its final Workflow and the seconds from submission to that end."""
    deploy(real, source, tmp / "deploy")
    t0 = time.monotonic()
    name = submit(real, template, namespace, *params)
    wf = wait_finished(real, name, namespace, timeout)
    took = time.monotonic() - t0
    print(f"{name} {wf['status']['phase']} in {took:.0f} s")
    return name, wf, took


def wait_finished(real: Real, name: str, namespace: str, timeout: float) -> dict[str, Any]:
    """The Workflow once Argo says it finished; fails with its status after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        wf = json.loads(real.cluster.kubectl("get", "workflow", name, "-n", namespace,
                                             "-o", "json").stdout)
        if wf.get("status", {}).get("phase") in ("Succeeded", "Failed", "Error"):
            return wf  # type: ignore[no-any-return]
        if time.monotonic() > deadline:
            nodes = {n.get("displayName"): (n.get("phase"), n.get("message"))
                     for n in wf.get("status", {}).get("nodes", {}).values()}
            raise AssertionError(f"{name} still {wf.get('status', {}).get('phase')} after "
                                 f"{timeout:.0f} s: {json.dumps(nodes, indent=1)}")
        time.sleep(1)


def assert_succeeded(wf: dict[str, Any]) -> None:
    """The run Succeeded; else every node's phase and message, which is what tells why."""
    assert wf["status"]["phase"] == "Succeeded", json.dumps(
        {n["displayName"]: (n["phase"], n.get("message")) for n in wf["status"]["nodes"].values()},
        indent=1)


def pods_of(real: Real, workflow: str, namespace: str) -> list[dict[str, Any]]:
    got = json.loads(real.cluster.kubectl(
        "get", "pods", "-n", namespace, "-l", f"workflows.argoproj.io/workflow={workflow}",
        "-o", "json").stdout)
    return got["items"]  # type: ignore[no-any-return]


def dedent(text: str) -> str:
    return textwrap.dedent(text).strip() + "\n"
