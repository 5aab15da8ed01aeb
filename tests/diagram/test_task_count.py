"""The hover's and the graph's task count is the compiled DAG's (issue 22: it said 6 for 13)."""

from __future__ import annotations

import pytest

from durapipe.compiler import CompileOptions, compile_pipeline
from durapipe.diagram import summary
from durapipe.dsl.model import Gpu, GpuChoice, OnOom, Resources, Retry, Stage
from tests.compiler.models import GI, pipeline, stage

H100_A100 = Gpu(count=8, types=(GpuChoice(type="H100", count=8), GpuChoice(type="A100", count=8)),
                fallback_after=1800)


def compiled_dag_tasks(s: Stage) -> int:
    result = compile_pipeline(pipeline(s), CompileOptions())
    assert result.ok, [d.message for d in result.diagnostics]
    (doc,) = result.documents
    (template,) = [t for t in doc["spec"]["templates"] if t["name"] == "train"]
    return len(template["dag"]["tasks"]) if "dag" in template else 1


def test_the_issue_case_counts_13_tasks_as_compiled() -> None:
    s = stage(retry=Retry(attempts=2, preemptions=3, backoff=30),
              resources=Resources(gpu=H100_A100))
    assert compiled_dag_tasks(s) == 13
    assert summary.budgets(s).tasks == 13
    assert "tasks: 13 of Argo's 200 per DAG (7 attempt tasks, 5 backoff waits, the join)" in \
        summary.budget_lines(s)


@pytest.mark.parametrize("retry,gpu", [
    (Retry(), None),
    (Retry(attempts=3), None),
    (Retry(attempts=1, preemptions=0, backoff=10), H100_A100),
    (Retry(attempts=2, on_oom=OnOom(memory=(GI, 2 * GI, 4 * GI))), H100_A100),
    (Retry(attempts=0, preemptions=2, on_oom=OnOom(memory=(GI, 2 * GI))), H100_A100),
    (Retry(attempts=4, preemptions=1, backoff=5, on_oom=OnOom(memory=(GI, 2 * GI))), None),
])
def test_the_count_is_the_compiled_dags_for_every_shape(retry: Retry, gpu: Gpu | None) -> None:
    s = stage(retry=retry, resources=Resources(gpu=gpu))
    assert summary.budgets(s).tasks == compiled_dag_tasks(s)
