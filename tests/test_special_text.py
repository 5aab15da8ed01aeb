"""Text that the kubelet, the API server or Argo read specially (issue 11).

``kubelet_expand`` is a line-by-line port of the kubelet's expansion
(``k8s.io/kubernetes/third_party/forked/golang/expansion/expand.go``: ``Expand`` and
``tryReadVariableName``, with ``MappingFuncFor``, which leaves an undefined ``$(NAME)`` as
written).  The cluster runs a container's ``command``, ``args`` and ``env[].value`` through it;
``durapipe run`` runs the user's text as written; so the compiled text, expanded, must be the
text ``durapipe run`` used, and that is what these tests compare.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from durapipe.cli import main
from durapipe.compiler import CompileOptions, compile_pipeline
from durapipe.compiler.plan import kubelet_literal
from durapipe.dsl import load_path


def kubelet_expand(text: str, env: Mapping[str, str]) -> str:
    out: list[str] = []
    checkpoint = 0
    cursor = 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            rest = text[cursor + 1:]
            if rest[0] == "$":
                read, is_var, advance = "$", False, 1
            elif rest[0] == "(":
                close = rest.find(")", 1)
                if close == -1:
                    read, is_var, advance = "$(", False, 1
                else:
                    read, is_var, advance = rest[1:close], True, close + 1
            else:
                read, is_var, advance = "$" + rest[0], False, 1
            out.append((env[read] if read in env else f"$({read})") if is_var else read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:]


def test_the_port_matches_the_kubelets_documented_cases() -> None:
    env = {"VAR_A": "A", "VAR_B": "B"}
    # Cases from expand_test.go's table.
    assert kubelet_expand("$(VAR_A)", env) == "A"
    assert kubelet_expand("___$(VAR_B)___", env) == "___B___"
    assert kubelet_expand("$(VAR_NOPE)", env) == "$(VAR_NOPE)"
    assert kubelet_expand("$$(VAR_A)", env) == "$(VAR_A)"
    assert kubelet_expand("$$$(VAR_A)", env) == "$A"
    assert kubelet_expand("$$", env) == "$"
    assert kubelet_expand("$(VAR_A", env) == "$(VAR_A"
    assert kubelet_expand("foo$", env) == "foo$"
    assert kubelet_expand("$VAR_A", env) == "$VAR_A"


@given(st.text(alphabet="$()AB x", max_size=24))
def test_escaped_text_comes_back_unchanged_from_the_kubelet(text: str) -> None:
    env = {"A": "expanded", "B": "", "AB": "$(A)"}
    assert kubelet_expand(kubelet_literal(text), env) == text


PIPE = """\
pipeline "dollars" {}

stage "show" {
  image   = "python:3.12"
  command = ["python3", "-c", "import json, os, sys; json.dump({'argv': sys.argv[1:], 'env': os.environ['SHOWN']}, open(sys.argv[1], 'w'))"]
  args    = ["OUT", "$(DURAPIPE_STAGE)", "$$(HOME)", "cost: $5 $(", "$$"]
  env {
    SHOWN = "$(DURAPIPE_STAGE) $(SHOWN) $HOME"
  }
}
"""


def _container(documents: list[dict[str, Any]]) -> dict[str, Any]:
    for doc in documents:
        for template in doc["spec"]["templates"]:
            if "container" in template:
                return dict(template["container"])
    raise AssertionError("no container template")


def test_compiled_text_expands_to_what_durapipe_run_ran(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "seen.json"
    pipe = tmp_path / "dollars.pipe"
    pipe.write_text(PIPE.replace('"OUT"', json.dumps(str(out))))
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(pipe), "--home", str(tmp_path / "home"), "--plain"]) == 0
    ran = json.loads(out.read_text())

    loaded = load_path(str(pipe))
    assert loaded.pipeline is not None
    result = compile_pipeline(loaded.pipeline, CompileOptions())
    container = _container(result.documents)
    # The kubelet's mapping: the container's literal env values, each expanded in order.
    env: dict[str, str] = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = kubelet_expand(item["value"], env)
    argv = [kubelet_expand(a, env) for a in [*container["command"], *container["args"]]]
    user = argv[argv.index("--") + 1:]
    assert user[3:] == ran["argv"]
    assert ran["argv"][1:] == ["$(DURAPIPE_STAGE)", "$$(HOME)", "cost: $5 $(", "$$"]
    assert env["SHOWN"] == ran["env"] == "$(DURAPIPE_STAGE) $(SHOWN) $HOME"
    # ... and the YAML really escapes (the old lowering wrote the text as is).
    assert "$$(DURAPIPE_STAGE)" in yaml.safe_dump(container)


DEFAULTS = """\
pipeline "defaults" {}

params {
  x: str = "pre$(DEF_ENV)"
  y: str = "$$(HOME) $5"
}

stage "show" {
  image   = "python:3.12"
  command = ["python3", "-c", "import json, os, sys; json.dump({'argv': sys.argv[1:], 'env': os.environ['SHOWN']}, open(sys.argv[1], 'w'))"]
  args    = ["OUT", params.x, "--x=${params.x}", params.y]
  env {
    DEF_ENV = "d"
    SHOWN   = "${params.x}|${params.y}"
  }
}
"""


def argo_substitute(text: str, parameters: Mapping[str, str]) -> str:
    """Argo's ``{{workflow.parameters.NAME}}``: the parameter's value, as is (its controller
    does exactly this: ``test_argo_controller.py::test_a_param_default_reaches_the_pod_as_written``)."""
    for name, value in parameters.items():
        text = text.replace("{{workflow.parameters." + name + "}}", value)
    return text


def test_a_param_default_reaches_the_program_as_durapipe_run_passes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A default went into ``arguments.parameters`` unescaped, Argo put it into the args, and
    the kubelet expanded it: the pod ran ``pred`` where ``durapipe run`` passed
    ``pre$(DEF_ENV)``.  A value given at submit time stays the documented exception."""
    out = tmp_path / "seen.json"
    pipe = tmp_path / "defaults.pipe"
    pipe.write_text(DEFAULTS.replace('"OUT"', json.dumps(str(out))))
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(pipe), "--home", str(tmp_path / "home"), "--plain"]) == 0
    ran = json.loads(out.read_text())
    assert ran["argv"][1:] == ["pre$(DEF_ENV)", "--x=pre$(DEF_ENV)", "$$(HOME) $5"]

    loaded = load_path(str(pipe))
    assert loaded.pipeline is not None
    (doc,) = compile_pipeline(loaded.pipeline, CompileOptions()).documents
    given = {p["name"]: p["value"] for p in doc["spec"]["arguments"]["parameters"]}
    assert given == {"x": "pre$$(DEF_ENV)", "y": "$$$$(HOME) $5"}  # kubelet_literal's escape
    container = _container([doc])
    env: dict[str, str] = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = kubelet_expand(argo_substitute(item["value"], given), env)
    argv = [kubelet_expand(argo_substitute(a, given), env)
            for a in [*container["command"], *container["args"]]]
    assert argv[argv.index("--") + 1:][3:] == ran["argv"]
    assert env["SHOWN"] == ran["env"] == "pre$(DEF_ENV)|$$(HOME) $5"


TEMPLATED = """\
pipeline "p" {}

stage "render" {
  image   = "busybox"
  command = ["echo", "{{workflow.name}}"]
}
"""


@pytest.mark.parametrize("command", ["check", "compile", "run"])
def test_check_compile_and_run_refuse_argo_templating_alike(
        command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    pipe = tmp_path / "p.pipe"
    pipe.write_text(TEMPLATED)
    monkeypatch.chdir(tmp_path)
    extra = ["--home", str(tmp_path / "home")] if command == "run" else []
    assert main([command, str(pipe), *extra]) == 1
    err = capsys.readouterr().err
    assert "error[P0404]" in err and "p.pipe:5:22" in err


@pytest.mark.parametrize(("setting", "where"), [
    ('namespace = "{{workflow.name}}"', "pipeline"),
    ('storage_secret = "{{x}}"', "pipeline"),
    ('timezone = "{{x}}"', "pipeline"),
    ('labels { "{{k}}" = "v" }', "pipeline"),
    ('annotations { note = "{{x}}" }', "pipeline"),
    ('cluster { gpu_products { H100 = "{{x}}" } }', "pipeline"),
    ('cluster { spot_selector { pool = "{{x}}" } }', "pipeline"),
    ('env { "{{X}}" = "1" }', "stage"),
    ('env { K = secret("{{n}}", "k") }', "stage"),
    ('env { K = secret("n", "{{k}}") }', "stage"),
    ('labels { team = "{{x}}" }', "stage"),
])
def test_every_field_that_reaches_argo_is_guarded(setting: str, where: str,
                                                   tmp_path: Path) -> None:
    pipeline = "pipeline \"p\" { %s }" % (setting if where == "pipeline" else "")
    stage = 'stage "a" { image = "i"  command = ["true"]  %s }' % (
        setting if where == "stage" else "")
    pipe = tmp_path / "p.pipe"
    pipe.write_text(pipeline + "\n" + stage + "\n")
    codes = [d.code for d in load_path(str(pipe)).diagnostics if d.is_error]
    assert "P0404" in codes, codes


@pytest.mark.parametrize(("labels", "ok"), [
    ('team = "a: b # c"', False), ('team = "ml-research"', True), ('team = ""', True),
    ('"app.kubernetes.io/part-of" = "ml"', True), ('"Bad_Prefix.io/x" = "v"', False),
    ('team = "%s"' % ("x" * 64), False), ('"a/b/c" = "v"', False),
])
def test_labels_follow_the_api_servers_rules(labels: str, ok: bool, tmp_path: Path) -> None:
    pipe = tmp_path / "p.pipe"
    pipe.write_text('pipeline "p" {}\nstage "a" { image = "i"  command = ["true"]  '
                    "labels { %s } }\n" % labels)
    codes = [d.code for d in load_path(str(pipe)).diagnostics if d.is_error]
    assert codes == ([] if ok else ["P0321"])


@pytest.mark.parametrize(("first", "second"), [("main", "stage-main"), ("train", "train-h100")])
def test_check_finds_names_that_collide_after_lowering(
        first: str, second: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gpu = ('resources { gpu { count = 8  types = ["H100", "A100"]  fallback_after = 30m } }'
           if first == "train" else "")
    pipe = tmp_path / "p.pipe"
    pipe.write_text('pipeline "p" {}\n'
                    f'stage "{first}" {{ image = "i"  command = ["true"]  {gpu} }}\n'
                    f'stage "{second}" {{ image = "i"  command = ["true"] }}\n')
    assert main(["check", str(pipe)]) == 1
    err = capsys.readouterr().err
    assert "error[P0402]" in err
    # Both stages are pointed at: the one named here and the one the name also comes from.
    assert f'stage "{first}"' in err and f'stage "{second}"' in err
    assert "is also made for this stage" in err
