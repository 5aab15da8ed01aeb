"""`durapipe bound`: each number of a small hand-made pipeline derived by hand, the examples'
bounds snapshotted, the stages without a bound diagnosed, the command line's table and JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from syrupy.assertion import SnapshotAssertion

from durapipe.cli import main
from durapipe.dsl import catalog, loads
from durapipe.dsl.model import Pipeline
from durapipe.plan import bound_render
from durapipe.plan.bound import Prices, parse_prices, pipeline_bound, stage_bound

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.pipe"))
#: Round prices, so each figure below can be worked out by hand.
ROUND = Prices({"L4": 1.0, "H100": 10.0}, cpu_hour=0.25, memory_gib_hour=0.125)


def pipeline(text: str) -> Pipeline:
    loaded = loads('pipeline "p" { storage = "s3://b/p" }\n' + text)
    assert loaded.ok and loaded.pipeline is not None, loaded.diagnostics
    return loaded.pipeline


#: One stage spending every budget once: two rungs, a preemption, an application retry.
LADDER_STAGE = """
stage "s" {
  image   = "i:1"  command = ["x"]
  timeout = 1h
  resources {
    cpu = 4
    gpu { count = 2  types = ["L4"] }
  }
  retry {
    attempts    = 1
    preemptions = 1
    backoff     = 1m
    on_oom { memory = [8Gi, 16Gi] }
  }
}
"""
LADDER = pipeline(LADDER_STAGE)


def test_worst_case_spends_every_budget_once_each_attempt_to_its_timeout() -> None:
    found = stage_bound(LADDER.stages[0], ROUND)
    assert found.unbounded is None and found.worst is not None and found.best is not None
    worst = found.worst
    # An OOM climb (8Gi -> 16Gi), one application retry, one preemption, the last attempt.
    assert worst.attempts == 4
    # Four attempts of 1h, the one backoff before the application retry, and the grace (30 s,
    # Kubernetes' default: the stage does not checkpoint) of the two the kubelet SIGTERMs:
    # the preempted one and the last, stopped at its timeout.
    assert worst.wall_seconds == 4 * 3600 + 60 + 2 * 30
    assert worst.gpu_hours == pytest.approx(2 * (4 + 2 * 30 / 3600))
    assert worst.node_hours == pytest.approx(4 + 2 * 30 / 3600)
    # Per hour: 2 GPUs x $1 + 4 vCPU x $0.25 + memory x $0.125/GiB: $4 at 8Gi, $5 at 16Gi;
    # the dearest path runs once at 8Gi and three times at 16Gi, two of them with their grace.
    assert worst.cost == pytest.approx(4 + 3 * 5 + 2 * 5 * 30 / 3600)
    assert worst.gpu_hours_by_type == {"L4": pytest.approx(2 * (4 + 2 * 30 / 3600))}
    assert worst.node_hours_by_type == {"L4": pytest.approx(4 + 2 * 30 / 3600)}


def test_a_checkpointing_stage_holds_its_node_for_the_compiled_grace() -> None:
    """A stage that checkpoints gets the compiler's grace (300 s) for its final save: each
    attempt the kubelet stops holds its GPUs that long after SIGTERM."""
    checkpointing = pipeline(LADDER_STAGE.replace(
        "  timeout = 1h\n", '  timeout = 1h\n  checkpoint { path = "/ckpt" }\n')).stages[0]
    worst = stage_bound(checkpointing, ROUND).worst
    assert worst is not None
    assert worst.wall_seconds == 4 * 3600 + 60 + 2 * 300
    shorter = stage_bound(checkpointing, ROUND, checkpoint_grace_seconds=60).worst
    assert shorter is not None and shorter.wall_seconds == 4 * 3600 + 60 + 2 * 60


def test_best_case_is_one_attempt_on_the_first_rung() -> None:
    best = stage_bound(LADDER.stages[0], ROUND).best
    assert best is not None
    assert (best.attempts, best.wall_seconds, best.gpu_hours, best.node_hours) == \
        (1, 3600, 2, 1)
    assert best.cost == pytest.approx(4)


def test_fallback_wait_is_spent_and_each_figure_takes_its_own_worst_path() -> None:
    found = stage_bound(pipeline("""
stage "s" {
  image   = "i:1"  command = ["x"]
  timeout = 2h
  resources { gpu { count = 1  types = ["H100", "L4"]  fallback_after = 30m } }
  retry { preemptions = 0 }
}
""").stages[0], ROUND).worst
    assert found is not None
    # No H100 within 30m, then 2h on an L4; or an H100 after 29m59s and 2h there; either
    # stopped at its timeout, with 30 s of grace.
    assert found.wall_seconds == 30 * 60 + 2 * 3600 + 30
    # One attempt runs either way: 2 GPU-hours and the grace, on either type; the H100 path
    # costs most.
    hours = 2 + 30 / 3600
    assert found.gpu_hours == pytest.approx(hours)
    assert found.gpu_hours_by_type == {"H100": pytest.approx(hours), "L4": pytest.approx(hours)}
    assert found.cost == pytest.approx(hours * 10)


def test_pipeline_wall_follows_the_critical_path_and_sums_the_rest() -> None:
    three = pipeline("""
stage "a" {
  image   = "i:1"  command = ["x"]
  timeout = 1h
  resources { cpu = 2 }
  retry { preemptions = 0 }
}
stage "b" {
  image   = "i:1"  command = ["x"]
  needs   = [a]
  timeout = 2h
  resources { cpu = 2 }
  retry { preemptions = 0 }
}
stage "c" {
  image   = "i:1"  command = ["x"]
  needs   = [a]
  timeout = 30m
  resources { cpu = 2 }
  retry { preemptions = 0 }
}
""")
    found = pipeline_bound(three, ROUND)
    assert found.worst is not None and found.best is not None
    assert found.critical_path == ("a", "b")
    # Each stage's one attempt stopped at its timeout, with 30 s of grace.
    assert found.worst.wall_seconds == 3 * 3600 + 2 * 30
    hours = 3.5 + 3 * 30 / 3600
    assert found.worst.node_hours == pytest.approx(hours)
    assert found.worst.node_hours_by_type == {"cpu": pytest.approx(hours)}
    assert found.worst.gpu_hours == 0
    assert found.worst.cost == pytest.approx(hours * 2 * 0.25)


def test_multi_node_restarts_count_every_node() -> None:
    found = stage_bound(pipeline("""
stage "s" {
  image   = "i:1"  command = ["x"]
  timeout = 1h
  resources { gpu { count = 8  types = ["H100"] } }
  distributed {
    replicas               = 2
    max_restarts           = 1
    restart_on_maintenance = false
  }
}
""").stages[0], ROUND).worst
    assert found is not None
    # Two attempts of both nodes, each stopped (preempted, timed out) with 30 s of grace.
    hours = 2 * (1 + 30 / 3600)
    assert (found.attempts, found.wall_seconds) == (2, 2 * 3600 + 2 * 30)
    assert found.node_hours == pytest.approx(2 * hours)
    assert found.gpu_hours == pytest.approx(2 * 8 * hours)
    assert found.cost == pytest.approx(2 * 8 * hours * 10)


@pytest.mark.parametrize(("text", "code", "line"), [
    ('stage "s" {\n  image = "i:1"  command = ["x"]\n}\n', "P0350", 2),
    ('stage "s" {\n  image = "i:1"  command = ["x"]\n  timeout = 1h\n  resources { cpu = 8 }\n'
     '  distributed { replicas = 2 }\n}\n', "P0351", 6),
])
def test_a_stage_without_a_bound_is_a_diagnostic_at_its_setting(text: str, code: str,
                                                                 line: int) -> None:
    loaded = loads('pipeline "p" { storage = "s3://b/p" }\n' + text, "p.pipe")
    assert loaded.pipeline is not None
    found = pipeline_bound(loaded.pipeline)
    assert found.worst is None and found.critical_path == ()
    problems = bound_render.unbounded_diagnostics(loaded.pipeline, found, loaded.source_map)
    assert [p.code for p in problems] == [code]
    assert problems[0].labels[0].span.line == line
    assert problems[0].help


def test_a_gpu_type_without_a_price_names_the_type() -> None:
    found = stage_bound(LADDER.stages[0], Prices({"H100": 1.0}, 0.0, 0.0))
    assert (found.unbounded, found.detail, found.worst) == ("unpriced_gpu", "L4", None)


def test_every_catalogue_type_has_a_dated_sourced_price() -> None:
    assert set(catalog.GPU_PRICES) == set(catalog.GPU_TYPES)
    for price in (*catalog.GPU_PRICES.values(), catalog.CPU_PRICE, catalog.MEMORY_PRICE):
        assert price.usd_per_hour > 0 and price.as_of and price.source.startswith("https://")


def test_price_file_overrides_and_refusals() -> None:
    base = Prices.default()
    merged = parse_prices({"gpu": {"H100": 2}, "cpu_hour": 0.5}, base)
    assert isinstance(merged, Prices)
    assert merged.gpu["H100"] == 2 and merged.gpu["L4"] == base.gpu["L4"]
    assert (merged.cpu_hour, merged.memory_gib_hour) == (0.5, base.memory_gib_hour)
    assert "unknown key `gpus`" in str(parse_prices({"gpus": {}}, base))
    assert ">= 0" in str(parse_prices({"gpu": {"H100": -1}}, base))
    assert ">= 0" in str(parse_prices({"cpu_hour": "1"}, base))
    assert "one JSON object" in str(parse_prices([], base))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_bounds(path: Path, snapshot: SnapshotAssertion,
                        monkeypatch: pytest.MonkeyPatch,
                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(ROOT)
    code = main(["bound", str(path.relative_to(ROOT)), "--json"])
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert code == (0 if data["pipeline"]["worst"] is not None else 1)
    data.pop("prices")  # the whole default table: tested on its own above
    assert data == snapshot
    assert (code == 1) == ("error[P035" in captured.err)


def test_cli_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "prices.json").write_text('{"gpu": {"L4": 1.0}, "cpu_hour": 0.25, '
                                          '"memory_gib_hour": 0.125}')
    source = tmp_path / "p.pipe"
    source.write_text('pipeline "p" { storage = "s3://b/p" }\n' + LADDER_STAGE)
    assert main(["bound", str(source), "--prices", str(tmp_path / "prices.json")]) == 0
    out = capsys.readouterr().out
    rows = {re.split(r"\s{2,}", line)[0]: re.split(r"\s{2,}", line)[1:]
            for line in out.splitlines()[2:] if line and not line.startswith("-")}
    assert rows["stage"] == ["attempts", "wall", "GPU-hours", "node-hours", "cost (USD)"]
    for name in ("s", "pipeline"):
        assert rows[name] == ["4 / 1", "4h2m / 1h", "8.03 / 2.00", "4.02 / 1.00", "19.08 / 4.00"]
    assert "critical path: s" in out
    assert main(["bound", str(source), "--prices", str(tmp_path / "prices.json"),
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["pipeline"]["worst"]["cost_usd"] == pytest.approx(19 + 10 * 30 / 3600)
    assert data["prices"]["cpu_hour"] == 0.25


def test_cli_refuses_a_bad_price_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "prices.json").write_text("{not json")
    assert main(["bound", str(ROOT / "examples" / "spot_training.pipe"),
                 "--prices", str(tmp_path / "prices.json")]) == 1
    err = capsys.readouterr().err
    assert "error[P0353]" in err and "Traceback" not in err


LIMITED = """pipeline "p" {
  storage = "s3://b/p"
  limits { max_wall = 48h  max_gpu_hours = 2000  max_cost = 5000 }
}

stage "s" {
  image   = "i:1"
  command = ["x"]
  timeout = 24h
  resources {
    gpu { count = 8  types = ["H100"] }
  }
  limits { max_gpu_hours = 500 }
}
"""


def test_check_and_compile_refuse_a_worst_case_above_a_limit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "p.pipe"
    source.write_text(LIMITED)
    assert main(["check", str(source)]) == 1
    err = capsys.readouterr().err
    # 4 attempts (1 + 3 preemptions) x 24h, each SIGTERMed (preempted, or stopped at its
    # timeout) with 30 s of grace; 8 H100 x 96h2m: 768.27 GPU-hours at the default price.
    assert "error[P0355]: the pipeline's worst-case wall time along the critical path s 96h2m " \
           "exceeds `limits.max_wall` (48h); stage `s` dominates (96h2m)" in err
    assert "lower `retry.preemptions` of stage `s` (it adds 72h1m30s to the worst case)" in err
    assert "error[P0354]: stage `s`: worst-case GPU-hours 768.27 exceeds " \
           "`limits.max_gpu_hours` (500.00)" in err
    assert f"{source}:13:28" in err
    assert "P0355]: the pipeline's worst-case cost" in err
    assert "max_gpu_hours` (2,000.00)" not in err  # 768 <= 2000: no diagnostic
    assert main(["compile", str(source), "-o", str(tmp_path / "out.yaml")]) == 1
    assert "error[P0354]" in capsys.readouterr().err
    assert not (tmp_path / "out.yaml").exists()


def test_limits_within_the_worst_case_pass_and_change_no_yaml(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = LIMITED.replace("  limits { max_wall = 48h  max_gpu_hours = 2000  max_cost = 5000 }\n",
                            "").replace("  limits { max_gpu_hours = 500 }\n", "")
    roomy = LIMITED.replace("max_wall = 48h", "max_wall = 97h").replace(
        "max_cost = 5000", "max_cost = 6000").replace("max_gpu_hours = 500", "max_gpu_hours = 769")
    outputs = []
    for name, text in (("plain", plain), ("roomy", roomy)):
        source = tmp_path / name / "p.pipe"
        source.parent.mkdir()
        source.write_text(text)
        assert main(["check", str(source)]) == 0, capsys.readouterr().err
        assert main(["compile", str(source), "-o", str(tmp_path / name / "out.yaml")]) == 0
        outputs.append((tmp_path / name / "out.yaml").read_bytes())
    assert outputs[0] == outputs[1]


def test_a_limit_on_an_unbounded_stage_says_why_it_cannot_be_checked() -> None:
    loaded = loads('pipeline "p" { storage = "s3://b/p" }\n'
                   'stage "s" {\n  image = "i:1"  command = ["x"]\n'
                   '  limits { max_wall = 1h }\n}\n', "p.pipe")
    assert loaded.pipeline is not None
    problems = bound_render.limit_diagnostics(loaded.pipeline, loaded.source_map)
    assert [p.code for p in problems] == ["P0350"]
    assert bound_render.limit_diagnostics(pipeline('stage "s" {\n  image = "i:1"  '
                                                   'command = ["x"]\n}\n')) == []


def test_limits_in_the_builder_equal_the_pipe_file() -> None:
    from durapipe.dsl import builder

    built = builder.Pipeline("p", storage="s3://b/p",
                             limits=builder.Limits(max_wall="48h", max_gpu_hours=2000,
                                                   max_cost=5000))
    built.stage("s", image="i:1", command=["x"], timeout="24h",
                resources=builder.Resources(gpu=builder.Gpu(count=8, types=["H100"])),
                limits=builder.Limits(max_gpu_hours=500))
    from_text = loads(LIMITED).pipeline
    assert built.result().pipeline == from_text
    assert from_text is not None and from_text.limits is not None
    assert (from_text.limits.max_wall, from_text.limits.max_gpu_hours,
            from_text.limits.max_cost) == (48 * 3600, 2000.0, 5000.0)


def test_limits_round_trip_through_fmt() -> None:
    from durapipe.dsl.fmt import format_source

    formatted, problems = format_source(LIMITED, "p.pipe")
    assert formatted == LIMITED, problems


def test_worst_wall_is_the_longest_of_every_verdict_sequence_the_machine_allows() -> None:
    """Brute force over every path of the machine (no memo, no ordering) agrees with the
    bound, for a stage that climbs a ladder, retries with backoff, is preempted and falls
    back."""
    from durapipe.plan import machine
    from durapipe.plan.rules import Rules

    stage = pipeline("""
stage "s" {
  image   = "i:1"  command = ["x"]
  timeout = 1h
  resources { gpu { count = 1  types = ["H100", "L4"]  fallback_after = 10m } }
  retry {
    attempts    = 2
    preemptions = 1
    backoff     = 1m
    on_oom { memory = [8Gi, 16Gi] }
  }
}
""").stages[0]
    rules = Rules.of(stage)

    def longest(state: machine.State) -> float:
        best = 0.0
        wait = 600.0 if state.probe else 0.0
        for verdict in machine.possible(state):
            action, nxt = machine.step(state, verdict)
            spent = wait if verdict == machine.PENDING_TIMEOUT else wait + 3600
            if verdict in (machine.PREEMPTED, machine.TIMEOUT):
                spent += 30  # the kubelet's SIGTERM, then the pod's grace
            if isinstance(action, machine.Run):
                spent += action.backoff + longest(nxt)
            best = max(best, spent)
        return best

    _, first = machine.begin(rules)
    worst = stage_bound(stage, ROUND).worst
    assert worst is not None and worst.wall_seconds == longest(first)
    # By hand: an H100 found after 9m59s runs 1h and is OOM-killed; the 16Gi rung waits
    # another 10m for an H100 and gives way; on the L4, 2 application retries (1m, 2m of
    # backoff), 1 preemption and the last attempt, stopped at its timeout: 5 attempts of 1h,
    # 20m of waiting, two graces of 30 s.
    assert worst.wall_seconds == 2 * 600 + 5 * 3600 + 60 + 120 + 2 * 30 == 19440


PRICED = """pipeline "p" {
  storage = "s3://b/p"
  cluster {
    gpu_products { MI300X = "AMD-Instinct-MI300X" }
  }
  prices {
    gpu             { L4 = 1  MI300X = 3 }
    cpu_hour        = 0.25
    memory_gib_hour = 0.125
  }
}
"""


def test_the_pipelines_prices_replace_the_defaults_and_a_file_replaces_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    loaded = loads(PRICED + LADDER_STAGE)
    assert loaded.ok and loaded.pipeline is not None, loaded.diagnostics
    prices = Prices.of(loaded.pipeline)
    assert (prices.gpu["L4"], prices.cpu_hour, prices.memory_gib_hour) == (1, 0.25, 0.125)
    assert prices.gpu["H100"] == Prices.default().gpu["H100"]  # the rest stay the catalog's
    # The ROUND prices, written in the pipeline: the same cost as test_cli_table's file.
    found = pipeline_bound(loaded.pipeline)
    assert found.worst is not None
    assert found.worst.cost == pytest.approx(19 + 10 * 30 / 3600)
    source = tmp_path / "p.pipe"
    source.write_text(PRICED + LADDER_STAGE)
    (tmp_path / "prices.json").write_text('{"gpu": {"L4": 2.0}}')
    assert main(["bound", str(source), "--json", "--prices", str(tmp_path / "prices.json")]) == 0
    data = json.loads(capsys.readouterr().out)
    # A file over the pipeline's: L4 at $2, the pipeline's CPU and memory prices kept; per
    # hour $6 at 8Gi, $7 at 16Gi, the dearest path once at 8Gi, three times at 16Gi.
    assert (data["prices"]["gpu_hour"]["L4"], data["prices"]["cpu_hour"]) == (2.0, 0.25)
    assert data["pipeline"]["worst"]["cost_usd"] == pytest.approx(6 + 3 * 7 + 2 * 7 * 30 / 3600)


def test_a_type_the_cluster_adds_is_priced_by_the_pipeline() -> None:
    mi300x = LADDER_STAGE.replace('types = ["L4"]', 'types = ["MI300X"]')
    unpriced = loads(PRICED.replace("  MI300X = 3", "") + mi300x)
    assert unpriced.pipeline is not None
    found = pipeline_bound(unpriced.pipeline)
    assert (found.stages[0].unbounded, found.stages[0].detail) == ("unpriced_gpu", "MI300X")
    (problem,) = bound_render.unbounded_diagnostics(unpriced.pipeline, found)
    assert "prices { gpu { MI300X = 2.5 } }" in (problem.help or "")
    priced = loads(PRICED + mi300x)
    assert priced.pipeline is not None
    worst = pipeline_bound(priced.pipeline).worst
    assert worst is not None
    # 2 MI300X x $3 + 4 vCPU x $0.25 + 8 or 16 GiB x $0.125: $8 an hour at 8Gi, $9 at 16Gi.
    assert worst.cost == pytest.approx(8 + 3 * 9 + 2 * 9 * 30 / 3600)


def test_max_cost_is_checked_at_the_pipelines_prices(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "p.pipe"
    source.write_text(LIMITED)
    assert main(["check", str(source)]) == 1
    assert "worst-case cost" in capsys.readouterr().err
    # At $1 per H100-hour, 768.27 GPU-hours cost well under the $5,000 ceiling.
    source.write_text(LIMITED.replace("  limits {", "  prices { gpu { H100 = 1 } }\n  limits {", 1))
    assert main(["check", str(source)]) == 1
    err = capsys.readouterr().err
    assert "worst-case cost" not in err and "error[P0355]: the pipeline's worst-case wall" in err


def test_a_price_for_an_unknown_type_is_warned_at_its_value() -> None:
    loaded = loads(PRICED.replace("L4 = 1", "L40 = 1") + LADDER_STAGE, "p.pipe")
    assert loaded.ok  # a warning: the pipeline still checks
    (warned,) = [d for d in loaded.diagnostics if d.code == "W0006"]
    assert warned.message == 'a price for GPU type "L40", which no stage can ask for'
    assert warned.help == "did you mean `L40S`?"
    span = warned.labels[0].span
    assert span is not None and loaded.source_map is not None
    line = (PRICED.replace("L4 = 1", "L40 = 1")).splitlines()[span.line - 1]
    assert "L40 = 1" in line


def test_prices_in_the_builder_equal_the_pipe_file_and_round_trip_through_fmt() -> None:
    from durapipe.dsl import builder
    from durapipe.dsl.fmt import format_source

    built = builder.Pipeline("p", storage="s3://b/p",
                             cluster=builder.Cluster(gpu_products={"MI300X": "AMD-Instinct-MI300X"}),
                             prices=builder.Prices(gpu={"L4": 1, "MI300X": 3}, cpu_hour=0.25,
                                                   memory_gib_hour=0.125))
    from_text = loads(PRICED).pipeline
    assert from_text is not None and built.result().pipeline == from_text
    formatted, problems = format_source(PRICED, "p.pipe")
    assert not problems and loads(formatted).pipeline == from_text


def test_a_negative_price_in_the_pipeline_is_refused() -> None:
    loaded = loads(PRICED.replace("cpu_hour        = 0.25", "cpu_hour        = -1"), "p.pipe")
    assert not loaded.ok
    assert [(d.code, d.message) for d in loaded.diagnostics] == [
        ("P0204", "`cpu_hour` must be at least 0, got -1.0")]
