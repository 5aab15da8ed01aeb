"""Argo's own offline validator (tools/argo-check) over Argo's examples and our own manifests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .argo_tools import argo_check

pytestmark = pytest.mark.harness

HERE = Path(__file__).parent
MANIFESTS = HERE / "manifests"

#: Objects in ../shared/argo/v4.1.2/examples (files, multi-document files and templates/).
ARGO_EXAMPLE_OBJECTS = 222
#: Argo 4.1 examples that an older validator (v4.0.5) rejected: they must pass now.
ARGO_4_1_ONLY = (
    "pod-resources.yaml", "pod-resources-template-override.yaml", "resource-claims.yaml",
    "resource-claims-template-override.yaml", "workflow-level-executor-plugin.yaml",
)

# file -> a fragment of the error Argo must give (so the right rule fired, not any error).
INVALID = {
    "missing-entrypoint-template.yaml": "template name 'nope' undefined",
    "unknown-field.yaml": 'unknown field "spec.templates[0].retryStrategy.limitt"',
    "dag-cycle.yaml": "graph with cycle",
    "undefined-parameter.yaml": "failed to resolve {{inputs.parameters.nope}}",
    "bad-cron-schedule.yaml": "cron schedule 61 * * * * is malformed",
    "timeout-without-unit.yaml": "invalid duration format in timeout",
    "two-template-types.yaml": "multiple template types specified",
}


def test_argo_examples_pass_argo_validation(shared_dir: Path) -> None:
    examples = shared_dir / "argo" / "v4.1.2" / "examples"
    results = argo_check([examples])
    assert len(results) == ARGO_EXAMPLE_OBJECTS
    assert {Path(r.file).name: r.error for r in results if not r.ok} == {}
    checked = {Path(r.file).name for r in results}
    assert set(ARGO_4_1_ONLY) <= checked


def test_examples_with_template_refs_resolve_them(shared_dir: Path) -> None:
    examples = shared_dir / "argo" / "v4.1.2" / "examples"
    ref_files = [p for p in examples.rglob("*.yaml") if "templateRef:" in p.read_text()]
    assert ref_files, "Argo's examples should exercise templateRef"
    results = argo_check([examples])
    by_file = {Path(r.file).name: r for r in results}
    for path in ref_files:
        assert by_file[path.name].ok, by_file[path.name].error


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_manifest_is_rejected_with_reason(name: str) -> None:
    [result] = argo_check([MANIFESTS / "invalid" / name])
    assert not result.ok
    assert INVALID[name] in result.error


def test_every_invalid_manifest_has_an_expected_reason() -> None:
    assert sorted(p.name for p in (MANIFESTS / "invalid").glob("*.yaml")) == sorted(INVALID)


def test_template_ref_resolves_only_when_template_is_given() -> None:
    workflow = MANIFESTS / "valid" / "uses-template-ref.yaml"
    [alone] = argo_check([workflow])
    assert not alone.ok
    assert 'couldn\'t find workflow template "durapipe-stages"' in alone.error

    results = argo_check([MANIFESTS / "valid" / "stage-template.yaml", workflow])
    assert [(r.kind, r.ok) for r in results] == [("WorkflowTemplate", True), ("Workflow", True)]


def test_multi_document_file_reports_each_object(tmp_path: Path) -> None:
    docs = [
        (MANIFESTS / "valid" / "stage-template.yaml").read_text(),
        (MANIFESTS / "valid" / "uses-template-ref.yaml").read_text(),
        (MANIFESTS / "invalid" / "dag-cycle.yaml").read_text(),
    ]
    bundle = tmp_path / "bundle.yaml"
    bundle.write_text("\n---\n".join(docs))
    results = argo_check([bundle])
    assert [(r.index, r.kind, r.name, r.ok) for r in results] == [
        (0, "WorkflowTemplate", "durapipe-stages", True),
        (1, "Workflow", "uses-template-ref-", True),
        (2, "Workflow", "dag-cycle-", False),
    ]


def test_namespaced_template_resolves_for_objects_in_that_namespace(tmp_path: Path) -> None:
    template = (MANIFESTS / "valid" / "stage-template.yaml").read_text().replace(
        "name: durapipe-stages", "name: durapipe-stages\n  namespace: ml"
    )
    (tmp_path / "t.yaml").write_text(template)
    workflow = MANIFESTS / "valid" / "uses-template-ref.yaml"
    assert not argo_check([tmp_path / "t.yaml", workflow])[1].ok
    assert argo_check([tmp_path / "t.yaml", workflow], namespace="ml")[1].ok


#: Schedules and time zones on both sides of Argo's rules (robfig/cron's standard parser,
#: Go's time.LoadLocation).
SCHEDULES = [
    "0 3 * * *", "*/15 * * * *", "0 0 1 1 *", "5 4 * * sun", "0 22 * * 1-5", "0 9 1-7,15 * MON",
    "@daily", "@hourly", "@every 1h30m", "0 0 ? * *", "59 23 31 12 6",
    "99 99 * * *", "61 * * * *", "0 24 * * *", "0 0 0 * *", "0 0 * 13 *", "0 0 * * 7",
    "0 0 * * 5-1", "*/0 * * * *", "0 3 * *", "0 3 * * * *", "@fortnightly", "0 0 L * *",
    "TZ=Europe/Berlin 0 3 * * *",
]
TIMEZONES = ["Europe/Berlin", "America/New_York", "UTC", "Asia/Kolkata", "Europe/Berln", "Mars/Olympus"]


def test_schedule_and_timezone_checks_agree_with_argo(tmp_path: Path) -> None:
    from durapipe.dsl.schedule import cron_problem, timezone_problem

    template = (MANIFESTS / "invalid" / "bad-cron-schedule.yaml").read_text()
    cases = [(s, None) for s in SCHEDULES] + [("0 3 * * *", tz) for tz in TIMEZONES]
    docs = []
    for i, (schedule, tz) in enumerate(cases):
        doc = template.replace("name: bad-cron-schedule", f"name: case-{i}").replace(
            '["61 * * * *"]', json.dumps([schedule]))
        if tz is not None:
            doc = doc.replace("spec:\n", f"spec:\n  timezone: {json.dumps(tz)}\n", 1)
        docs.append(doc)
    bundle = tmp_path / "crons.yaml"
    bundle.write_text("\n---\n".join(docs))
    argo = {r.name: r for r in argo_check([bundle])}
    ours = [cron_problem(s) is None and (tz is None or timezone_problem(tz) is None)
            for s, tz in cases]
    disagreements = [(cases[i], argo[f"case-{i}"].error) for i in range(len(cases))
                     if argo[f"case-{i}"].ok != ours[i]]
    assert disagreements == []
    assert sum(ours) not in (0, len(cases))  # both verdicts occur
