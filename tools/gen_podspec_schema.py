"""Regenerate ``durapipe/dsl/podspec.json``, the Pod spec schema ``pod_patch`` is checked with.

The schema is the PodSpec that JobSet v0.12.0's CRD embeds (the full Kubernetes core/v1 PodSpec
of its API version), without descriptions and CEL rules; containers are stored once under
``definitions``.  Run: ``python tools/gen_podspec_schema.py /work/shared/jobset/v0.12.0``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

OUT = Path(__file__).resolve().parents[1] / "durapipe" / "dsl" / "podspec.json"


def strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items()
                if k not in ("description", "x-kubernetes-validations")}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def main(root: str) -> None:
    crd = yaml.safe_load((Path(root) / "jobset.x-k8s.io_jobsets.yaml").read_text())
    top = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    pod = (top["properties"]["spec"]["properties"]["replicatedJobs"]["items"]["properties"]
           ["template"]["properties"]["spec"]["properties"]["template"]["properties"]["spec"])
    pod = strip(pod)
    container = pod["properties"]["containers"]["items"]
    for name in ("containers", "initContainers"):
        pod["properties"][name]["items"] = {"$ref": "Container"}
    schema = {"source": "JobSet v0.12.0 CRD, core/v1 PodSpec", "definitions":
              {"Container": container}, "PodSpec": pod}
    OUT.write_text(json.dumps(schema, sort_keys=True, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
