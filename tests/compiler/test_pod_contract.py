"""The compiled pods, run as processes: not a re-creation of them.

For every example, each pod of the compiled YAML (Argo container templates and the pods of
JobSet manifests) is run the way the kubelet would run it: its init container, then its main
container and upload sidecar side by side, with ``command``/``args``/``env``/``volumeMounts``
taken verbatim from the YAML.  Only what a cluster provides is stood in for:

- every volume is a temporary directory, and each container's mount paths are rewritten to
  it (the longest mount path first, so nested mounts resolve as in the pod); the ConfigMap's
  ``binaryData`` is written into its directory, the runtime image's (``--runtime-image``)
  zipapp into ``/opt/durapipe``; a container's own paths (``/out``, ``/dev/termination-log``)
  go to a directory of its own;
- ``python3`` is the test's interpreter under ``-S``: no site-packages, so no durapipe but the
  one the pod mounts, and no obstore (S3 goes through the runtime's stdlib client);
- the user's command becomes a small script that imports ``durapipe.runtime``, saves and
  restores a checkpoint and writes the stage's outputs;
- Argo's placeholders are substituted as Argo would (``SUBSTITUTIONS``); an unknown one fails;
- the storage secret (``envFrom``) becomes the moto server's credentials, or the pipeline's
  ``s3://`` storage a ``file://`` directory for the local-store case.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from durapipe.compiler import CompileOptions, compile_pipeline, memo
from durapipe.dsl import load_path
from durapipe.runtime import contract
from durapipe.runtime.build_zipapp import archive_bytes
from durapipe.runtime.hashing import hash_path
from tests.runtime.conftest import S3_CREDENTIALS, s3_endpoint  # noqa: F401 (a fixture)

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.pipe"))
RUN_NAME = "wf-contract"
IMAGE_ZIPAPP_DIR = "/opt/durapipe"

USER_SCRIPT = r'''
import json, os, sys
from pathlib import Path
import durapipe.runtime as runtime

report = {"runtime": runtime.__file__}
ctx = runtime.context()
if ctx.checkpoint is not None:
    report["restored_before"] = ctx.checkpoint.load() is not None
    commit = ctx.checkpoint.save_sync(b"state of " + os.environ["DURAPIPE_STAGE"].encode(),
                                      metadata={"step": 1})
    report["commit"] = commit.seq
    again = runtime.Checkpoint.from_env()
    path = Path(again.load_sync())
    files = [p for p in sorted(path.rglob("*")) if p.is_file()] if path.is_dir() else [path]
    report["restored"] = b"".join(p.read_bytes() for p in files).decode()
for name, target in json.loads(os.environ.get("DURAPIPE_OUTPUTS") or "{}").items():
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    Path(target).write_text(f"{name} of {os.environ['DURAPIPE_STAGE']}\n")
Path(os.environ["CONTRACT_REPORT"]).write_text(json.dumps(report))
'''


def substitute(text: str, workflow_params: dict[str, str],
               inputs: dict[str, str] | None = None) -> str:
    """Argo's substitution of the placeholders the lowering writes, for one first attempt:
    the run's name, workflow parameters, the input parameters the first task calling the
    template passes (``inputs``), and the attempt expressions (sums) evaluated for retry 0;
    a count of preemptions that a predecessor task passes on is taken as none."""
    fixed = {"workflow.name": RUN_NAME, "retries": "0"}

    def value(name: str) -> int:
        if name == "retries":
            return 0
        param = re.fullmatch(r"inputs\.parameters(?:\.([\w-]+)|\['([\w-]+)'\])", name)
        assert param, f"{name} is not a parameter this test knows"
        given = (inputs or {})[param.group(1) or param.group(2)]
        return 0 if given.startswith("{{") and "tasks" in given else int(given)

    def total(expression: str) -> str:
        terms = [t.strip() for t in expression.split(" + ")]
        return str(sum(int(t) if t.isdigit() else value(t[len("asInt("):-1]) for t in terms))

    def one(match: re.Match[str]) -> str:
        inner = match.group(1).strip()
        if inner in fixed:
            return fixed[inner]
        if re.fullmatch(r"=(asInt\([^()]+\)|\d+)( \+ (asInt\([^()]+\)|\d+))*", inner):
            return total(inner[1:])
        if inner.startswith("=sprig.sha256sum(toJson(") and inner.endswith("))"):
            return inputs_key(inner, workflow_params)
        if inner.startswith("workflow.parameters.") and inner[20:] in workflow_params:
            return workflow_params[inner[20:]]
        if inner.startswith("inputs.parameters.") and inner[18:] in (inputs or {}):
            return substitute((inputs or {})[inner[18:]], workflow_params)
        raise AssertionError(f"placeholder {match.group(0)} has no substitution in this test")

    return re.sub(r"\{\{(.*?)\}\}", one, text)


class _NoUpstreamPods(dict[str, str]):
    """Every input parameter, empty: a first attempt's pod runs here without its upstream
    pods, so the content hashes they would publish are ""."""

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, key: str) -> str:
        return ""


def inputs_key(expression: str, workflow_params: dict[str, str]) -> str:
    """What Argo makes of a stage's key expression (a checkpoint line's name), by the
    compiler's own evaluator of it."""
    key = memo.evaluate_key_expression("{{" + expression + "}}", workflow_params,
                                       _NoUpstreamPods())
    assert key is not None, expression
    return key


@dataclass
class Pod:
    where: str
    spec: dict[str, Any]
    inputs: dict[str, str]


def pods_of(documents: list[dict[str, Any]]) -> list[Pod]:
    """The first-attempt pod of each template, and the pod of each JobSet manifest (of the
    pipeline's own objects: the checkpoint collector's pod lists Workflows from the API
    server, so it runs on the real node, tests/realnode/test_checkpoint_gc.py)."""
    from durapipe.compiler.checkpoint_gc import is_collector

    documents = [d for d in documents if not is_collector(d)]
    out: list[Pod] = []
    passed: dict[str, dict[str, str]] = {}
    for doc in documents:
        for template in doc["spec"]["templates"]:
            for task in template.get("dag", {}).get("tasks", []):
                passed.setdefault(task["template"], {
                    p["name"]: str(p["value"])
                    for p in task.get("arguments", {}).get("parameters", []) if "value" in p})
    for doc in documents:
        for template in doc["spec"]["templates"]:
            inputs = passed.get(template["name"], {})
            if "container" in template:
                spec = {"initContainers": template.get("initContainers", []),
                        "containers": [dict(template["container"], name="main"),
                                       *template.get("sidecars", [])],
                        "volumes": template.get("volumes", [])}
                out.append(Pod(template["name"], spec, inputs))
            manifest = template.get("resource", {}).get("manifest")
            if manifest and "JobSet" in manifest:
                jobset = yaml.safe_load(manifest)
                for job in jobset["spec"]["replicatedJobs"]:
                    out.append(Pod(f"{template['name']}/{job['name']}",
                                   job["template"]["spec"]["template"]["spec"], inputs))
    return out


class PodRun:
    def __init__(self, root: Path, pod: Pod, runtime_objects: list[dict[str, Any]],
                 workflow_params: dict[str, str], store_env: dict[str, str],
                 store_rewrite: tuple[str, str] | None) -> None:
        self.root, self.pod = root, pod
        self.params, self.store_env, self.store_rewrite = workflow_params, store_env, store_rewrite
        self.volumes: dict[str, Path] = {}
        configmaps = {d["metadata"]["name"]: d for d in runtime_objects}
        for volume in pod.spec["volumes"]:
            path = root / "volumes" / volume["name"]
            path.mkdir(parents=True)
            if "configMap" in volume:
                configmap = configmaps[volume["configMap"]["name"]]
                for key, value in configmap["binaryData"].items():
                    (path / key).write_bytes(base64.b64decode(value))
            self.volumes[volume["name"]] = path
        image = root / "image"
        (image / IMAGE_ZIPAPP_DIR.strip("/")).mkdir(parents=True)
        (image / IMAGE_ZIPAPP_DIR.strip("/") / contract.RUNTIME_ZIPAPP_NAME).write_bytes(
            archive_bytes())
        self.bin = root / "bin"
        self.bin.mkdir()
        for name in ("python3", "python"):
            shim = self.bin / name
            shim.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
            shim.chmod(0o755)
        self.user_script = root / "user" / "train.py"
        self.user_script.parent.mkdir()
        self.user_script.write_text(USER_SCRIPT)

    def mapping(self, container: dict[str, Any]) -> list[tuple[str, str]]:
        own = self.root / "containers" / container["name"]
        pairs = [(IMAGE_ZIPAPP_DIR, str(self.root / "image" / IMAGE_ZIPAPP_DIR.strip("/"))),
                 ("/out", str(own / "out")), ("/dev/termination-log", str(own / "termination-log"))]
        for mount in container.get("volumeMounts", []):
            target = self.volumes[mount["name"]]
            if mount.get("subPath"):
                target = target / mount["subPath"]
                target.mkdir(parents=True, exist_ok=True)
            pairs.append((mount["mountPath"], str(target)))
        return sorted(pairs, key=lambda p: len(p[0]), reverse=True)

    def rewrite(self, text: str, pairs: list[tuple[str, str]]) -> str:
        text = substitute(text, self.params, self.pod.inputs)
        if self.store_rewrite is not None:
            text = text.replace(*self.store_rewrite)
        for prefix, target in pairs:
            text = re.sub(rf"(?<![\w/.-]){re.escape(prefix)}(?=/|$|[\"\s,}}])",
                          lambda _m, t=target: t, text)
        return text

    def argv_env(self, container: dict[str, Any], main: bool) -> tuple[list[str], dict[str, str]]:
        pairs = self.mapping(container)
        argv = [*container.get("command", []), *container.get("args", [])]
        if main and "--" in argv:  # the wrapper verbatim; the user's command: the script
            argv = [*argv[: argv.index("--") + 1], "python3", str(self.user_script)]
        argv = [self.rewrite(a, pairs) for a in argv]
        env = {"PATH": f"{self.bin}:/usr/bin:/bin", "HOME": str(self.root)}
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = self.rewrite(item["value"], pairs)
            else:
                source = item["valueFrom"]
                if "secretKeyRef" in source:  # the Secret's value, as the kubelet reads it
                    ref = source["secretKeyRef"]
                    env[item["name"]] = f"secret {ref['name']}/{ref['key']}"
                    continue
                field = source["fieldRef"]["fieldPath"]
                env[item["name"]] = "0" if field.startswith(("metadata.annotations[", "metadata.labels[")) else {
                    "metadata.name": f"{RUN_NAME}-pod", "metadata.namespace": "contract"}[field]
        # The storage secret (envFrom) or, without one, the node's own credentials.
        env.update(self.store_env)
        env["CONTRACT_REPORT"] = str(self.root / "report.json")
        (self.root / "containers" / container["name"] / "out").mkdir(parents=True, exist_ok=True)
        return argv, env

    def run(self) -> dict[str, Any]:
        def start(container: dict[str, Any], main: bool = False) -> subprocess.Popen[str]:
            argv, env = self.argv_env(container, main)
            return subprocess.Popen(argv, env=env, cwd=self.user_script.parent, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)

        results: dict[str, Any] = {}
        running: list[tuple[str, subprocess.Popen[str]]] = []
        for init in self.pod.spec.get("initContainers", []):
            if init.get("restartPolicy") == "Always":
                # A native sidecar: the kubelet starts it and goes on to the next container,
                # and stops it once the regular containers have ended.
                running.append((init["name"], start(init)))
                continue
            process = start(init)
            out, err = process.communicate(timeout=60)
            results[init["name"]] = (process.returncode, err)
            assert process.returncode == 0, f"{self.pod.where}: {init['name']}: {err}"
        main, *sidecars = self.pod.spec["containers"]
        running += [(s["name"], start(s)) for s in sidecars]
        process = start(main, main=True)
        _, err = process.communicate(timeout=120)
        results["main"] = (process.returncode, err)
        for name, sidecar in running:  # Argo stops sidecars once the main container ends
            sidecar.send_signal(signal.SIGTERM)
            _, side_err = sidecar.communicate(timeout=60)
            results[name] = (sidecar.returncode, side_err)
        return results


def agent_verdicts(stderr: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for line in stderr.splitlines():
        if line.startswith(contract.AGENT_VERDICT_TAG):
            verdict, _, details = line[len(contract.AGENT_VERDICT_TAG):].partition(" ")
            out.append((verdict, json.loads(details)))
    return out


def s3_keys(endpoint: str, bucket: str) -> list[str]:
    with urllib.request.urlopen(f"{endpoint}/{bucket}?list-type=2", timeout=30) as response:
        return re.findall(r"<Key>([^<]+)</Key>", response.read().decode())


@pytest.mark.parametrize("delivery", ["configmap", "image"])
@pytest.mark.parametrize("store", ["s3", "local"])
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_compiled_pods_run_with_nothing_but_python(path: Path, store: str, delivery: str,
                                                    tmp_path: Path, s3_endpoint: str) -> None:
    loaded = load_path(path)
    assert loaded.pipeline is not None
    pipeline = loaded.pipeline
    image = None if delivery == "configmap" else "registry.example/durapipe-runtime:test"
    result = compile_pipeline(pipeline, CompileOptions(runtime_image=image))
    assert result.ok
    assert (len(result.runtime_objects) == 1) == (image is None)
    params = {p["name"]: str(p.get("value", "")) for doc in result.documents
              for p in doc["spec"].get("arguments", {}).get("parameters", [])}
    storage = pipeline.storage or ""
    assert storage.startswith("s3://"), "every example stores on S3"
    bucket = storage[5:].split("/")[0]
    if store == "s3":
        bucket = f"{bucket}-{uuid.uuid4().hex[:8]}"
        urllib.request.urlopen(urllib.request.Request(f"{s3_endpoint}/{bucket}", method="PUT"),
                               timeout=30).read()
        rewrite = (f"s3://{storage[5:].split('/')[0]}/", f"s3://{bucket}/")
        store_env = dict(S3_CREDENTIALS, AWS_ENDPOINT_URL=s3_endpoint)
    else:
        rewrite = (storage, (tmp_path / "store").as_uri())
        store_env = {}
    pods = pods_of(result.documents)
    assert pods
    checkpointing = 0
    lines: set[str] = set()
    for index, pod in enumerate(pods):
        run = PodRun(tmp_path / f"pod-{index}", pod, result.runtime_objects, params, store_env,
                     rewrite)
        results = run.run()
        code, err = results["main"]
        if "--" not in pod.spec["containers"][0]["command"]:
            # The pod-less ladder's end: a pod that only fails, with the reason as its message.
            assert code == 1 and "ran out of memory at every size" in err, (pod.where, err)
            continue
        assert "ModuleNotFoundError" not in err, f"{pod.where}: {err}"
        assert code == 0, f"{pod.where}: {err}"
        main = pod.spec["containers"][0]
        log = tmp_path / f"pod-{index}" / "containers" / "main" / "termination-log"
        assert log.read_text().startswith(f"{contract.VERDICT_TAG}{contract.VERDICT_SUCCESS} ")
        report = json.loads((tmp_path / f"pod-{index}" / "report.json").read_text())
        assert report["runtime"].endswith(f"{contract.RUNTIME_ZIPAPP_NAME}/durapipe/runtime/"
                                          "__init__.py"), report
        env = {e["name"]: e.get("value", "") for e in main["env"]}
        hashes = run.rewrite(env.get(contract.ENV_OUTPUT_HASH_DIR, ""), run.mapping(main))
        for name, target in json.loads(run.rewrite(env.get(contract.ENV_OUTPUTS) or "{}",
                                                   run.mapping(main))).items():
            assert Path(target).read_text() == f"{name} of {env[contract.ENV_STAGE]}\n"
            # sha256: the pod has no blake3 wheel
            assert (Path(hashes) / f"{name}.hash").read_text() == hash_path(target, "sha256")
        if contract.ENV_CHECKPOINT_URI in env:
            checkpointing += 1
            assert report["restored"] == f"state of {env[contract.ENV_STAGE]}"
            # Attempts of one stage share its checkpoint line: a later pod resumes from it.
            uri = run.rewrite(env[contract.ENV_CHECKPOINT_URI], [])
            assert report["restored_before"] is (uri in lines), (pod.where, report)
            lines.add(uri)
            assert report["commit"] >= 1
            if delivery == "configmap":
                code, err = results["durapipe-preflight"]
                client = "stdlib-s3" if store == "s3" else "local"
                assert [v for v, d in agent_verdicts(err)] == ["ready"]
                assert agent_verdicts(err)[0][1]["client"] == client
            sidecar = [c["name"] for c in pod.spec["containers"][1:]] + [
                c["name"] for c in pod.spec.get("initContainers", [])
                if c.get("restartPolicy") == "Always"]
            assert sidecar == ["durapipe-uploader"]
            code, err = results["durapipe-uploader"]
            assert code == 0, err
            assert agent_verdicts(err)[0][0] == "ready"
            if store == "s3":
                prefix = uri[len(f"s3://{bucket}/"):]
                keys = [k for k in s3_keys(s3_endpoint, bucket) if k.startswith(prefix)]
            else:
                local = Path(uri[len("file://"):])
                keys = [p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()]
            assert any("manifest" in k or "commits" in k for k in keys), keys
    assert checkpointing or not any(s.checkpoint for s in pipeline.stages)


def test_user_env_sharing_the_prefix_stays_out_of_the_sidecar() -> None:
    from durapipe.dsl.load import loads

    loaded = loads(
        'pipeline "p" { storage = "s3://b/x" }\n'
        'stage "train" {\n  image = "python:3.12-slim"\n  command = ["python", "t.py"]\n'
        '  env { DURAPIPE_X = "mine"  DURAPIPE_CONTENT_HASH = "sha256" }\n'
        '  checkpoint = true\n}\n', "p.pipe")
    assert loaded.pipeline is not None, loaded.diagnostics
    result = compile_pipeline(loaded.pipeline, CompileOptions())
    assert result.ok, result.diagnostics
    template = next(t for t in result.documents[0]["spec"]["templates"] if "sidecars" in t)
    sidecar = template["sidecars"][0]
    names = [e["name"] for e in sidecar["env"]]
    assert "DURAPIPE_X" not in names
    assert "DURAPIPE_X" in [e["name"] for e in template["container"]["env"]]
    assert set(names) - {contract.ENV_POD_NAME, contract.ENV_POD_NAMESPACE} <= set(
        contract.AGENT_ENV)
    assert contract.ENV_CONTENT_HASH in names  # trainer and agent must hash alike
    by_name = {e["name"]: e for e in sidecar["env"]}
    assert by_name[contract.ENV_POD_NAME]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.name"}}
    assert by_name[contract.ENV_POD_NAMESPACE]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}}
    # No image but the stage's own, and the runtime from the ConfigMap, read-only.
    images = {c["image"] for c in [template["container"], sidecar, *template["initContainers"]]}
    assert images == {"python:3.12-slim"}
    (configmap,) = result.runtime_objects
    volume = next(v for v in template["volumes"] if "configMap" in v)
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    assert {"name": volume["name"], "mountPath": contract.RUNTIME_INSTALL_DIR,
            "readOnly": True} in sidecar["volumeMounts"]


def test_the_configmap_is_named_by_the_runtime_it_holds_and_fits() -> None:
    from durapipe.runtime.build_zipapp import content_hash

    data = archive_bytes()
    assert archive_bytes() == data  # deterministic in one process; across machines below
    loaded = load_path(EXAMPLES[0])
    assert loaded.pipeline is not None
    (configmap,) = compile_pipeline(loaded.pipeline, CompileOptions()).runtime_objects
    assert configmap["metadata"]["name"] == f"durapipe-runtime-{content_hash(data)[:12]}"
    assert base64.b64decode(configmap["binaryData"][contract.RUNTIME_ZIPAPP_NAME]) == data
    assert configmap["immutable"] is True
    assert len(data) < 1024 * 1024 // 2, "the ConfigMap limit is 1 MiB; keep a margin"
    assert configmap["metadata"]["namespace"] == loaded.pipeline.namespace


def test_zipapp_bytes_do_not_depend_on_file_times_or_umask(tmp_path: Path) -> None:
    """What differs between machines (checkout times, umask, directory order) changes nothing."""
    copy = tmp_path / "durapipe"
    subprocess.run(["cp", "-r", str(REPO / "durapipe"), str(copy)], check=True)
    for dirpath, _dirs, files in os.walk(copy):
        for name in files:
            os.utime(Path(dirpath) / name, (1_700_000_000, 1_700_000_000))
            (Path(dirpath) / name).chmod(0o600)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from durapipe.runtime.build_zipapp import archive_bytes; "
            "sys.stdout.buffer.write(archive_bytes())")
    elsewhere = subprocess.run([sys.executable, "-S", "-c", code, str(tmp_path)],
                               capture_output=True, check=True, cwd=tmp_path,
                               env={"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "7"}).stdout
    assert elsewhere == archive_bytes()


@pytest.mark.slow
@pytest.mark.harness
def test_argo_lint_accepts_the_stream_with_the_runtime_configmap(tmp_path: Path) -> None:
    """What `durapipe compile -o FILE` writes, ConfigMap included, passes Argo's own linter."""
    from durapipe.cli import main
    from tests.argo.argo_tools import argo_check

    out = tmp_path / "all.yaml"
    assert main(["compile", *map(str, EXAMPLES), "-o", str(out)]) == 0
    docs = list(yaml.safe_load_all(out.read_text()))
    # One ConfigMap per namespace, shared by the pipelines there.
    namespaces = {d["metadata"].get("namespace") for d in docs if d["kind"] != "ConfigMap"}
    assert [d["kind"] for d in docs].count("ConfigMap") == len(namespaces)
    results = argo_check([out])
    # Every Argo object of the stream: each example's, and spot_training's collector.
    argo_kinds = {"Workflow", "WorkflowTemplate", "CronWorkflow"}
    assert len(results) == len([d for d in docs if d["kind"] in argo_kinds]) == \
        len(EXAMPLES) + 1
    assert all(r.ok for r in results), results
    assert "spot-training-ckpt-gc" in {r.name for r in results}


def test_kustomize_builds_a_directory_whose_pipelines_share_the_runtime(tmp_path: Path) -> None:
    """Two pipelines in one namespace, one ConfigMap: kustomize refuses an object twice."""
    import shutil

    from durapipe.cli import main

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (apt-get install kubectl); CI has it")
    out = tmp_path / "deploy"
    chosen = [str(p) for p in EXAMPLES if p.stem in ("spot_training", "gpu_fallback")]
    assert main(["compile", *chosen, "--kind", "template", "-o", f"{out}/",
                 "--kustomization"]) == 0
    built = subprocess.run([kubectl, "kustomize", str(out)], capture_output=True, text=True,
                           timeout=120, check=False)
    assert built.returncode == 0, built.stderr
    documents = list(yaml.safe_load_all(built.stdout))
    (configmap,) = [d for d in documents if d["kind"] == "ConfigMap"]
    for doc in documents:
        if doc["kind"] == "WorkflowTemplate":
            names = {v["configMap"]["name"] for t in doc["spec"]["templates"]
                     for v in t.get("volumes", []) if "configMap" in v}
            assert names == {configmap["metadata"]["name"]}


def test_the_cached_zipapp_is_the_built_one_and_a_damaged_entry_is_rebuilt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiles take the deflated runtime from the user's cache; the cache can only save time,
    never change the ConfigMap: a damaged entry is rebuilt, and what comes back is the build."""
    from durapipe.compiler import runtime_delivery

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    build = runtime_delivery._installed_archive.__wrapped__  # type: ignore[attr-defined]
    built = archive_bytes()
    assert build() == built
    (entry,) = (tmp_path / "durapipe").glob("runtime-*.zipapp")
    whole = entry.read_bytes()
    for damaged in (whole[: len(whole) // 2], whole[:-1] + bytes([whole[-1] ^ 1]), b"",
                    b"0" * 64 + b"\n" + built):
        entry.write_bytes(damaged)
        assert build() == built
        assert entry.read_bytes() == whole, "the damaged entry was rebuilt over"
    entry.unlink()
    entry.mkdir()  # neither readable nor replaceable, even by root
    assert build() == built  # a cache that cannot be used costs only time
