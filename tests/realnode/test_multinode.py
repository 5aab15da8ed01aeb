"""examples/multinode_pretrain.pipe on the real node, resized the way a user tries it on a
small cluster (2 nodes x 2 processes, one GPU each): Argo creates the JobSet, JobSet's
controller two real pods, each running the runtime wrapper, PyTorch's own torchrun (Debian's
2.6, tests/e2e/images.py) and the script.  The two torchrun agents meet in a static rendezvous
at pod 0's TCPStore, which pod 1 finds by its hostname in the JobSet's headless Service through
cluster DNS (CoreDNS on the node).  One pod is evicted through the API mid-training: the JobSet
restarts as a whole without counting it against `max_restarts`, the other pod's rank 0 commits
its final save on SIGTERM, the restarted pods meet again at the new pod 0, and every rank of the
restart resumes from rank 0's last commit; only rank 0 ever wrote the line."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from . import pipelines as pl
from .conftest import BUCKET, Real

pytestmark = pytest.mark.realnode

NS = "ml-training"
TEMPLATE = "pretrain-7b"
MiB = 2**20
OVERLAY = '''\
"""multinode_pretrain.pipe on a 2-core cluster with two GPUs: 2 nodes x 2 processes, and
torchrun's agents logging their rendezvous (LOGLEVEL=INFO)."""
from dataclasses import replace
from durapipe.dsl.load import load_path
from durapipe.dsl.model import GpuChoice

_example = load_path({path!r}).pipeline
assert _example is not None, "the example does not load"
(_stage,) = _example.stages
_gpu = replace(_stage.resources.gpu, count=1, types=(GpuChoice(type="A10G", count=1),))
# torchrun's agent imports torch: about 250 MiB besides the two workers.
_stage = replace(_stage,
                 resources=replace(_stage.resources, cpu=100, memory=640 * 2**20,
                                   shm=16 * 2**20, gpu=_gpu),
                 distributed=replace(_stage.distributed, replicas=2, procs_per_node=2),
                 env={{**_stage.env, "LOGLEVEL": "INFO"}},
                 timeout=600)
pipeline = replace(_example, storage_secret={secret!r}, stages=(_stage,))
'''


def jobset_pods(real: Real) -> list[dict[str, Any]]:
    got = json.loads(real.cluster.kubectl("get", "pods", "-n", NS, "-l",
                                          "jobset.sigs.k8s.io/jobset-name", "-o", "json").stdout)
    return sorted(got["items"], key=lambda p: p["metadata"]["name"])


def main_log(real: Real, pod: str) -> str:
    return real.cluster.kubectl("logs", pod, "-n", NS, "-c", "main", check=False).stdout


def cluster_state(real: Real, workflow: str) -> str:
    """What tells why the set did not run: the workflow's nodes, JobSets, pods, events."""
    wf = json.loads(real.cluster.kubectl("get", "workflow", workflow, "-n", NS, "-o",
                                         "json").stdout)
    nodes = {n.get("displayName"): (n.get("phase"), n.get("message"))
             for n in wf.get("status", {}).get("nodes", {}).values()}
    parts = [json.dumps(nodes, indent=1)]
    for args in (("get", "jobsets,jobs,pods", "-n", NS, "-o", "wide"),
                 ("get", "events", "-n", NS, "--sort-by=.lastTimestamp")):
        parts.append(real.cluster.kubectl(*args, check=False).stdout[-6000:])
    return "\n".join(parts)


def rendezvous(log: str) -> dict[str, str]:
    """What torchrun's agent logged of its rendezvous (``Rendezvous complete for workers``)."""
    _, found, rest = log.partition("Rendezvous complete for workers. Result:")
    if not found:
        return {}
    # Each line of the message carries the logger's prefix: "I1207 ... api.py:525]   key=value".
    fields = dict(re.findall(r"\]\s+(\w+)=(\S+)\s*$", rest, flags=re.M))
    return {k: fields[k].strip() for k in ("master_addr", "master_port", "group_rank",
                                            "group_world_size") if k in fields}


def line_keys(real: Real) -> list[str]:
    """The keys of this pipeline's objects (other cases' lines share the bucket)."""
    listed = real.s3.client().list_objects_v2(Bucket=BUCKET, Prefix="durapipe/pretrain-7b/")
    return sorted(o["Key"] for o in listed.get("Contents", []))


def test_a_two_pod_jobset_restarts_on_an_eviction_and_resumes_from_rank_0(
        real: Real, tmp_path) -> None:
    from .conftest import STORE_SECRET

    module = tmp_path / "small_multinode.py"
    module.write_text(OVERLAY.format(path=str(pl.EXAMPLES / "multinode_pretrain.pipe"),
                                     secret=STORE_SECRET))
    pl.deploy(real, module, tmp_path / "deploy")
    # The example names its own account (`service_account = "trainer"`): such an account is
    # the cluster's (IAM annotations and all, docs/cluster.md), so the user creates it, and the
    # RoleBinding compile wrote binds it.
    real.cluster.apply([{"apiVersion": "v1", "kind": "ServiceAccount",
                         "metadata": {"name": "trainer", "namespace": NS}}])
    t0 = time.monotonic()
    name = pl.submit(real, TEMPLATE, NS, "step_seconds=1")

    # Both node pods running, on the real node (the only one with A10Gs), rank 0 past a commit.
    saved: list[str] = []
    pods: list[dict[str, Any]] = []
    while not saved:
        assert time.monotonic() - t0 < 180, "no checkpoint saved:\n" + cluster_state(real, name)
        pods = [p for p in jobset_pods(real) if p["status"].get("phase") == "Running"]
        if len(pods) == 2:
            saved = re.findall(r"rank 0 step (\d+) saved", main_log(real, pods[0]["metadata"]["name"]))
        time.sleep(0.5)
    started = time.monotonic() - t0
    node0, node1 = (p["metadata"]["name"] for p in pods)
    assert "-node-0-0-" in node0 and "-node-0-1-" in node1, (node0, node1)
    assert {p["spec"]["nodeName"] for p in pods} == {real.node.name}
    logs = {pod: main_log(real, pod) for pod in (node0, node1)}
    print(f"rank 0 saved step {saved[-1]} {started:.0f} s after submission")
    assert "rank 0/4 starting at step 0" in logs[node0]
    assert "rank 1/4 starting at step 0" in logs[node0]
    assert {"rank 2/4 starting at step 0", "rank 3/4 starting at step 0"} <= set(
        re.findall(r"rank \d/4 starting at step \d+", logs[node1]))
    # The agents met at pod 0's store, by its name in the JobSet's headless Service.
    jobset_name = pods[0]["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"]
    master = f"{jobset_name}-node-0-0.{jobset_name}"
    for pod, group_rank in ((node0, 0), (node1, 1)):
        assert rendezvous(logs[pod]) == {"master_addr": master, "master_port": "29500",
                                         "group_rank": str(group_rank),
                                         "group_world_size": "2"}, logs[pod]
    assert "stand-in" not in logs[node0] + logs[node1]
    # Every rank calls save; the runtime keeps rank 0's only.
    assert re.search(r"rank 1 step 5 left to rank 0", logs[node0]), logs[node0]
    assert re.search(r"rank [23] step 5 left to rank 0", logs[node1]), logs[node1]

    t_evict = time.monotonic()
    real.cluster.kubectl("create", "--raw", f"/api/v1/namespaces/{NS}/pods/{node1}/eviction",
                         "-f", "-", input=json.dumps({
                             "apiVersion": "policy/v1", "kind": "Eviction",
                             "metadata": {"name": node1, "namespace": NS}}))

    wf = pl.wait_finished(real, name, NS, timeout=420)
    took = time.monotonic() - t0
    pl.assert_succeeded(wf)
    print(f"{name} Succeeded {took:.0f} s after submission, "
          f"{time.monotonic() - t_evict:.0f} s after the eviction")

    jobset = json.loads(real.cluster.kubectl("get", "jobsets", "-n", NS, "-o", "json").stdout)
    (js,) = [j for j in jobset["items"] if j["metadata"]["name"].startswith(f"{name}-pretrain-")]
    status = js["status"]
    print("JobSet status:", json.dumps({k: status.get(k) for k in (
        "restarts", "restartsCountTowardsMax", "terminalState")}))
    assert status.get("restarts") == 1
    assert status.get("restartsCountTowardsMax", 0) == 0  # the eviction spent no max_restarts
    assert status.get("terminalState") == "Completed"

    # `durapipe status` reads the JobSet too: two attempts (the restart re-created both pods),
    # the eviction as a preemption JobSet did not count, no failure of the 1 + 2 allowed, and
    # the pods' GPU type and memory.
    report = pl.durapipe("status", name, "-n", NS, real=real).stdout
    print(report)
    (row,) = [line.split() for line in report.splitlines() if line.startswith("pretrain ")]
    assert row == ["pretrain", "Succeeded", "2", "1", "0/3", "0", "640Mi", "A10G", "-"], row
    assert (f"  pretrain: {js['metadata']['name']}: 1 restart(s), 0 counted of maxRestarts 2, "
            "1 not counted") in report, report

    # The restart's pods: every rank resumed at rank 0's last committed step, not at 0.
    after = jobset_pods(real)
    assert node0 not in {p["metadata"]["name"] for p in after}
    resumed = {}
    for pod in after:
        assert pod["metadata"]["annotations"]["jobset.sigs.k8s.io/restart-attempt"] == "1"
        text = main_log(real, pod["metadata"]["name"])
        for rank, step in re.findall(r"rank (\d)/4 starting at step (\d+)", text):
            resumed[int(rank)] = int(step)
        # The restart's agents met again, at the new pod 0 (restart_count counts torchrun's
        # own restarts, none here: JobSet restarts the pods).
        met = rendezvous(text)
        assert (met.get("master_addr"), met.get("group_world_size")) == (master, "2"), text
        assert re.search(r"rank \d/4 step 20 loss", text), text
    print("resumed at:", resumed)
    assert sorted(resumed) == [0, 1, 2, 3]
    assert len(set(resumed.values())) == 1, resumed  # all from the same commit
    assert min(resumed.values()) >= int(saved[-1]) > 0

    # One writer: the line's claim is epoch 2 (rank 0 of each of the two runs of the set),
    # held by the restart's node-0 pod; no other rank ever claimed it.
    keys = line_keys(real)
    claims = [k for k in keys if "/writers/" in k]
    assert len(claims) == 1, keys
    assert claims[0].rsplit("/", 1)[1].startswith("000000000002-"), claims
    record = json.loads(real.s3.client().get_object(Bucket=BUCKET, Key=claims[0])["Body"].read())
    assert "-node-0-0-" in record["pod"], record
    manifests = [k for k in keys if "/manifests/" in k]
    assert manifests, keys
