"""`durapipe graph`: reviewed snapshots of every example, and Mermaid's own parser accepts them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from syrupy.assertion import SnapshotAssertion

from durapipe.diagram import render
from durapipe.dsl import load_path
from tests.conftest import REPO_ROOT
from tests.node_tools import run_node

EXAMPLES = sorted(REPO_ROOT.glob("examples/**/*.pipe"))


def _pipeline(path: Path):  # type: ignore[no-untyped-def]
    loaded = load_path(path)
    assert loaded.ok, loaded.diagnostics
    return loaded.pipeline


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_mermaid_snapshot(path: Path, snapshot_text: SnapshotAssertion) -> None:
    assert render.mermaid(_pipeline(path)) == snapshot_text


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_dot_snapshot(path: Path, snapshot_text: SnapshotAssertion) -> None:
    assert render.dot(_pipeline(path)) == snapshot_text


def test_every_mermaid_graph_parses_with_mermaid(tmp_path: Path) -> None:
    files = []
    for path in EXAMPLES:
        out = tmp_path / f"{path.stem}.mmd"
        out.write_text(render.mermaid(_pipeline(path)), encoding="utf-8")
        files.append(str(out))
    # A broken graph must be rejected, or the check proves nothing.
    broken = tmp_path / "broken.mmd"
    broken.write_text(render.mermaid(_pipeline(EXAMPLES[0])).replace("-->", "-->>", 1)
                      .replace('"]', "]", 1), encoding="utf-8")
    result = run_node("mermaid-parse.mjs", *files, str(broken))
    assert {f: result[f] for f in files} == {f: None for f in files}
    assert result[str(broken)] is not None


def test_the_cli_prints_mermaid_and_dot_and_reports_errors(tmp_path: Path) -> None:
    example = REPO_ROOT / "examples" / "prep_train_eval.pipe"

    def graph(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "durapipe", "graph", *args],
                              capture_output=True, text=True, check=False, cwd=REPO_ROOT)

    done = graph(str(example))
    assert done.returncode == 0 and done.stdout == render.mermaid(_pipeline(example))
    done = graph(str(example), "--format", "dot")
    assert done.returncode == 0 and done.stdout.startswith('digraph "churn-model" {')
    bad = tmp_path / "bad.pipe"
    bad.write_text('pipeline "x" {}\nstage "a" { image = "i"  comand = ["x"] }\n')
    done = graph(str(bad))
    assert done.returncode == 1 and "P0201" in done.stderr and done.stdout == ""
    assert "Traceback" not in done.stderr


def test_svg_through_graphviz(tmp_path: Path) -> None:
    if shutil.which("dot") is None:
        pytest.skip("Graphviz `dot` is not installed (CI installs it: apt-get install graphviz)")
    out = tmp_path / "dag.svg"
    done = subprocess.run([sys.executable, "-m", "durapipe", "graph",
                           str(REPO_ROOT / "examples" / "prep_train_eval.pipe"),
                           "--format", "svg", "-o", str(out)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    svg = out.read_text()
    assert svg.lstrip().startswith(("<?xml", "<svg")) and "</svg>" in svg
    assert svg.count('class="node"') == 3 and svg.count('class="edge"') == 3


def test_the_readme_shows_what_graph_prints() -> None:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    shown = readme.split("```mermaid\n", 1)[1].split("```", 1)[0]
    assert shown == render.mermaid(_pipeline(REPO_ROOT / "examples" / "prep_train_eval.pipe"))


def test_each_label_ends_with_the_stages_bound_at_the_pipelines_prices() -> None:
    """#24: the graph shows what `durapipe bound` says of each stage, priced as the pipeline
    prices it (a team's own rate moves the figure in the graph too)."""
    from dataclasses import replace

    from durapipe.dsl.model import PriceTable
    from durapipe.plan import bound_render
    from durapipe.plan.bound import Prices, stage_bound

    pipeline = _pipeline(REPO_ROOT / "examples" / "spot_training.pipe")
    for stage in pipeline.stages:
        last = render.label_lines(stage, Prices.of(pipeline))[-1]
        assert last == bound_render.in_brief(stage_bound(stage, Prices.of(pipeline)))
        assert last.startswith("worst case: ")
    cheap = replace(pipeline, prices=PriceTable(gpu={"A10G": 0.01}, cpu_hour=0.0,
                                                memory_gib_hour=0.0))
    before, after = render.dot(pipeline), render.dot(cheap)
    assert "$253.94" in before and "$253.94" not in after
    assert "156.92 GPU-h, $1.57 (best 12h)" in after  # 156.92 A10G-hours x $0.01
