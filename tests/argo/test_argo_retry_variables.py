"""What the design of a runtime-counted application budget (docs/performance.md, "A design
that meets the three") takes from Argo: the retry child's template is substituted with the
attempts before it and the last attempt's exit code and phase, values that carry nothing the
controller would evaluate again. Pinned on Argo's controller so the design's premise fails
here, not in its lowering, if it stops holding."""

from __future__ import annotations

import pytest

from tests.argo.argo_tools import run_scenario

pytestmark = pytest.mark.harness

READ = {"LAST_EXIT": "{{lastRetry.exitCode}}", "LAST_STATUS": "{{lastRetry.status}}",
        "RETRIES": "{{retries}}"}


def test_each_retry_child_reads_the_attempts_before_it_and_how_the_last_one_ended() -> None:
    workflow = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                "metadata": {"name": "last-retry"}, "spec": {"entrypoint": "main", "templates": [
                    {"name": "main", "dag": {"tasks": [{"name": "a", "template": "pod"}]}},
                    {"name": "pod", "retryStrategy": {"limit": "3", "retryPolicy": "Always"},
                     "container": {"image": "busybox", "command": ["true"], "env": [
                         {"name": name, "value": value} for name, value in READ.items()]}}]}}
    report = run_scenario({"name": "last-retry", "workflow": workflow, "expect": {}, "runs": [
        {"parameters": {}, "attempts": {"a": [
            {"outcome": "failed", "exitCode": 3, "minutes": 1},
            {"outcome": "deleted", "minutes": 1},
            {"outcome": "failed", "exitCode": 137, "minutes": 1, "message": "OOMKilled"}]}}]})
    assert not report.get("error"), report["error"]
    run = report["runs"][0]
    assert run["phase"] == "Succeeded"
    seen = [tuple(pod["pod"]["env"][name] for name in READ) for pod in run["attempts"]]
    assert seen == [
        ("0", "", "0"),          # the first attempt: Argo's defaults
        ("3", "Failed", "1"),    # after the program's exit 3
        ("0", "Error", "2"),     # after a lost pod: no exit code, the phase tells it apart
        ("137", "Failed", "3"),  # after an OOM kill, which the runtime could not record
    ]
