"""The GPU-OOM verdict on the real node: a program on the node's GPU raises a CUDA
out-of-memory error (the text PyTorch's `torch.cuda.OutOfMemoryError` prints). The runtime in
the pod classifies it (`gpu_oom`, exit 86) and the workflow takes the documented path: with
`gpu_oom = "fail"` (the default) the stage fails at once though `attempts` are left; with
`gpu_oom = "retry"` it spends `attempts` like any application failure (docs/language.md)."""

from __future__ import annotations

import pytest

from . import pipelines as pl
from .conftest import STORE_SECRET, Real

pytestmark = pytest.mark.realnode

NS = "realnode-gpu"
OOM = ("import sys; print('torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate "
       "2.00 GiB (GPU 0; 22.19 GiB total capacity)', file=sys.stderr); sys.exit(1)")
SOURCE = f'''
pipeline "gpu-oom" {{
  namespace      = "{NS}"
  storage        = "s3://acme-ml/durapipe"
  storage_secret = "{STORE_SECRET}"
  profile        = "eks"
}}
defaults {{
  image = "ghcr.io/acme/trainer:2.3.0"
  resources {{
    cpu    = 0.1
    memory = 256Mi
    gpu {{ count = 1  types = ["A10G"] }}
  }}
}}
stage "fails" {{
  command = ["python", "-c", "{OOM}"]
  retry {{ attempts = 2  preemptions = 0 }}
}}
stage "retries" {{
  command = ["python", "-c", "{OOM}"]
  retry {{ attempts = 1  preemptions = 0  gpu_oom = "retry" }}
}}
'''


def test_a_cuda_oom_fails_at_once_or_spends_attempts_as_its_policy_says(real: Real,
                                                                       tmp_path) -> None:
    source = tmp_path / "gpu_oom.pipe"
    source.write_text(SOURCE)
    name, wf, _ = pl.run_to_end(real, source, tmp_path, "gpu-oom", NS, timeout=300)
    assert wf["status"]["phase"] == "Failed"
    ends: dict[str, list[tuple[int, str]]] = {}
    for pod in sorted(pl.pods_of(real, name, NS),
                      key=lambda p: p["metadata"]["creationTimestamp"]):
        stage = pod["metadata"]["labels"]["durapipe.dev/stage"]
        (main,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == "main"]
        end = main["state"]["terminated"]
        ends.setdefault(stage, []).append((end["exitCode"], end.get("message", "")))
        assert pod["spec"]["nodeName"] == real.node.name
    # The runtime's verdict, exit 86, is what the kubelet recorded for main each time.
    assert [code for code, _ in ends["fails"]] == [86], ends
    assert [code for code, _ in ends["retries"]] == [86, 86], ends
    assert all("durapipe-verdict:gpu_oom" in message for stage in ends.values()
               for _, message in stage), ends
    status = pl.durapipe("status", name, "-n", NS, real=real, check=False).stdout
    print(status)
    assert status.count("gpu_oom") >= 3, status
