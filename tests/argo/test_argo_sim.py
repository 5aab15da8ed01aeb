"""Scenarios (tests/argo/scenarios/*.yaml) run through Argo's real workflow controller.

Each scenario holds a workflow written the way the compiler lowers a construct, the outcome of
every pod attempt (what the simulated kubelet does), and the expected result. The harness is
tools/argo-sim (docs/argo-harness.md); ``expect`` is matched as a subset of its report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from .argo_tools import INFORMER_LAGS, argo_check, resource_conditions, run_scenario

pytestmark = pytest.mark.harness

SCENARIOS = sorted((Path(__file__).parent / "scenarios").glob("*.yaml"))


def mismatches(expected: Any, actual: Any, path: str = "") -> list[str]:
    """Where ``actual`` differs from ``expected``, which names only the fields it cares about.

    A key ending in ``Contains`` matches a substring of the field without that suffix, one
    ending in ``AtLeast`` a lower bound of a number; a list must have exactly the expected
    length; ``{absent: true}`` under a key demands that the field be missing or empty.
    """
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{path}: expected a mapping, got {actual!r}"]
        out: list[str] = []
        for key, want in expected.items():
            if key.endswith("Contains"):
                field = key[: -len("Contains")]
                got = actual.get(field)
                if not isinstance(got, str) or want not in got:
                    out.append(f"{path}.{field}: {got!r} does not contain {want!r}")
            elif key.endswith("AtLeast"):
                field = key[: -len("AtLeast")]
                got = actual.get(field)
                if not isinstance(got, (int, float)) or got < want:
                    out.append(f"{path}.{field}: {got!r} is not at least {want!r}")
            elif want == {"absent": True}:
                if actual.get(key) not in (None, "", [], {}):
                    out.append(f"{path}.{key}: expected absent, got {actual[key]!r}")
            else:
                out += mismatches(want, actual.get(key), f"{path}.{key}")
        return out
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            got = [a.get("displayName", a) if isinstance(a, dict) else a for a in actual or []]
            return [f"{path}: expected {len(expected)} items, got {got!r}"]
        return [m for i, (w, g) in enumerate(zip(expected, actual)) for m in
                mismatches(w, g, f"{path}[{i}]")]
    if expected != actual:
        return [f"{path}: expected {expected!r}, got {actual!r}"]
    return []


def index_nodes(report: dict[str, Any]) -> None:
    """Add ``nodesByName`` to each run: node order in the report follows Argo's hashed IDs,
    so expectations name nodes by display name ("train", "train(1)"; a repeat gets "#2")."""
    for run in report["runs"]:
        by_name: dict[str, Any] = {}
        for node in run["nodes"]:
            name, n = node["displayName"], 1
            while name in by_name:
                n += 1
                name = f"{node['displayName']}#{n}"
            by_name[name] = node
        run["nodesByName"] = by_name


def load(path: Path) -> dict[str, Any]:
    scenario: dict[str, Any] = yaml.safe_load(path.read_text())
    assert scenario["name"] == path.stem, "a scenario's name is its file name"
    return scenario


# A loaded machine delays the informer's goroutine. CI once saw the stage-wide preemption budget
# scenario give a pod's outcome to the wrong attempt because of it: the harness had written the
# informer's store itself, and the informer's late events then moved it back in time. With 5 ms
# of lag on every event that failed on every run; each scenario must give the same result with it.
@pytest.mark.parametrize("informer_lag", INFORMER_LAGS.values(), ids=INFORMER_LAGS.keys())
@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path, informer_lag: str) -> None:
    check_scenario(path, informer_lag)


#: Scenarios whose result is a race Argo settles by a second: it gives a pod what is left of the
#: workflow's deadline, rounded down, so the kubelet stops the pod just before the controller
#: would fail the workflow.
DEADLINE_RACES = [p for p in SCENARIOS if p.stem == "workflow-deadline"]


# CI once saw the controller win that race: on a loaded machine a harness step takes whole
# seconds of real time, which counted against the pod's deadline but not its own time. A 1.5 s
# lag on every pod event plays such a machine (it failed every run before the harness's kubelet
# kept its times on the controller's clock).
@pytest.mark.parametrize("path", DEADLINE_RACES, ids=[p.stem for p in DEADLINE_RACES])
def test_a_deadline_race_does_not_turn_on_the_machines_speed(path: Path) -> None:
    check_scenario(path, "1500ms")


def check_scenario(path: Path, informer_lag: str) -> None:
    scenario = load(path)
    report = run_scenario(scenario, informer_lag=informer_lag)
    assert not report.get("error"), report["error"]
    index_nodes(report)
    problems = mismatches(scenario["expect"], report)
    if problems:
        runs = [
            {"phase": r["phase"], "message": r.get("message"), "attempts": [
                (a["displayName"], a["phase"], a.get("message"), (a.get("pod") or {}).get("memoryLimit"))
                for a in r["attempts"]]}
            for r in report["runs"]
        ]
        pytest.fail("\n".join(problems) + f"\nreport summary: {runs}")


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_workflow_passes_argo_lint(path: Path, tmp_path: Path) -> None:
    # A scenario that Argo's validator rejects would prove nothing about a real submission.
    scenario = load(path)
    docs = [scenario["workflow"], *scenario.get("workflowTemplates", [])]
    files = []
    for i, doc in enumerate(docs):
        f = tmp_path / f"{i}.yaml"
        f.write_text(yaml.safe_dump(doc))
        files.append(f)
    results = argo_check(files)
    assert [r.error for r in results if not r.ok] == []


CONDITION_SCENARIOS = [p for p in SCENARIOS if "conditions" in yaml.safe_load(p.read_text())]


@pytest.mark.parametrize("path", CONDITION_SCENARIOS, ids=[p.stem for p in CONDITION_SCENARIOS])
def test_resource_conditions_by_argo_executor(path: Path) -> None:
    scenario = load(path)
    spec = scenario["conditions"]
    [template] = [t for t in scenario["workflow"]["spec"]["templates"]
                  if t["name"] == spec["template"]]
    cases = [
        {"name": c["name"], "object": c["object"],
         "successCondition": template["resource"].get("successCondition", ""),
         "failureCondition": template["resource"].get("failureCondition", "")}
        for c in spec["cases"]
    ]
    results = {r["name"]: r for r in resource_conditions(cases)}
    for case in spec["cases"]:
        got = results[case["name"]]
        assert got["verdict"] == case["expect"], (case["name"], got)
        assert case.get("errorContains", "") in got.get("error", ""), (case["name"], got)


def test_matcher_reports_differences() -> None:
    # The scenarios are only as strict as this matcher, so pin its behaviour.
    actual = {"phase": "Failed", "message": "main: OOMKilled (exit code 137)", "pod": {"env": {}},
              "items": [1, 2]}
    assert mismatches({"phase": "Failed", "messageContains": "OOMKilled"}, actual) == []
    assert mismatches({"phase": "Succeeded"}, actual) == [".phase: expected 'Succeeded', got 'Failed'"]
    assert mismatches({"messageContains": "pod deleted"}, actual) != []
    assert mismatches({"items": [1]}, actual) != []
    assert mismatches({"pod": {"env": {"absent": True}}}, actual) == []
    assert mismatches({"phase": {"absent": True}}, actual) != []
    assert mismatches({"itemsAtLeast": 1}, {"items": 0.5}) != []
    assert mismatches({"itemsAtLeast": 1}, {"items": 1.5}) == []


def test_broken_ladder_lowering_is_caught() -> None:
    # The harness must be able to fail: index the memory ladder by the wrong variable (the
    # last exit code instead of the attempt number) and the OOM scenario has to notice.
    scenario = load(SCENARIOS[0].parent / "oom-ladder-climbs.yaml")
    template = scenario["workflow"]["spec"]["templates"][0]
    assert "asInt(retries)" in template["podSpecPatch"]
    template["podSpecPatch"] = template["podSpecPatch"].replace(
        "asInt(retries)", "asInt(lastRetry.exitCode)"
    )
    report = run_scenario(scenario)
    index_nodes(report)
    problems = mismatches(scenario["expect"], report)
    # "137" indexes past the end and is clamped: the 512Gi rung is skipped.
    assert ".runs[0].attempts[1].pod.memoryLimit: expected '512Gi', got '1Ti'" in problems
