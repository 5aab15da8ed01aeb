"""JobSet's own admission on the real control plane: its webhooks judge the compiled JobSet.

The JobSet path's restarts and failures run as cases (cases/jobset*.toml); this checks the
webhook directly with the manifest the compiler writes into the resource template, by a
server-side dry run (admission webhooks run, nothing is stored).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import E2E
from .scenario import compile_case, load_cases

pytestmark = pytest.mark.e2e


def _compiled_jobset(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    case = next(c for c in load_cases() if c.name == "jobset")
    docs = compile_case(case, tmp_path)
    wt = next(d for d in docs if d["kind"] == "WorkflowTemplate" and "entrypoint" in d["spec"])
    ns = wt["metadata"]["namespace"]
    tmpl = next(t for t in wt["spec"]["templates"] if "resource" in t)
    manifest: dict[str, Any] = yaml.safe_load(tmpl["resource"]["manifest"])
    # As Argo would have it: a name for the generated one (the webhook validates names made
    # from it), in the workflow's namespace.
    manifest["metadata"] = {**manifest["metadata"], "name": "webhook-probe", "namespace": ns}
    manifest["metadata"].pop("generateName")
    return ns, manifest


def _dry_run(e2e: E2E, manifest: dict[str, Any]) -> Any:
    return e2e.cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                               input=yaml.safe_dump(manifest), check=False)


def test_jobsets_webhook_admits_the_compiled_jobset_and_refuses_the_old_rule_name(
        e2e: E2E, tmp_path: Path) -> None:
    ns, manifest = _compiled_jobset(tmp_path)
    e2e.cluster.ensure_namespace(ns)
    rules = manifest["spec"]["failurePolicy"]["rules"]
    assert [r["name"] for r in rules] == ["HostMaintenance"]

    ok = _dry_run(e2e, manifest)
    assert ok.returncode == 0, ok.stderr
    # JobSet's mutating webhook ran: it defaults the network (DNS hostnames for torchrun's
    # rendezvous on pod 0) and the startup policy, which the compiler leaves unset.
    admitted = json.loads(ok.stdout)["spec"]
    assert admitted["network"]["enableDNSHostnames"] is True
    assert admitted["startupPolicy"] == {"startupPolicyOrder": "AnyOrder"}

    old = copy.deepcopy(manifest)
    old["spec"]["failurePolicy"]["rules"][0]["name"] = "host-maintenance"
    refused = _dry_run(e2e, old)
    assert refused.returncode != 0
    # The webhook's own words (pkg/webhooks/jobset_webhook.go, validateFailurePolicy); the
    # CRD's schema has no pattern for rule names, so nothing else refuses it.
    assert "invalid failure policy rule name 'host-maintenance', a failure policy rule name " \
           "must start with an alphabetic character" in refused.stderr, refused.stderr
