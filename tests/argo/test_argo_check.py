"""Argo's own offline validator (tools/argo-check) over Argo's examples and our own manifests."""

from __future__ import annotations

from pathlib import Path

import pytest

from .argo_tools import argo_check

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
