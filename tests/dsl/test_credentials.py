"""W0003: a credential written into a `.pipe` file would be copied into the compiled YAML that
GitOps commits.  It is a warning with the fix, and no output of any kind repeats the value.

The values are AWS's documented example keys and made-up passwords.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from durapipe.cli import main
from durapipe.dsl import loads
from durapipe.dsl.diagnostics import Diagnostic, render

KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def _pipe(env: str = "", storage: str = "s3://acme/durapipe") -> str:
    return (f'pipeline "p" {{\n  storage = "{storage}"\n}}\n\n'
            f'stage "train" {{\n  image   = "ghcr.io/acme/train:1"\n'
            f'  command = ["python", "train.py"]\n  env {{\n    {env}\n  }}\n}}\n')


def _warnings(text: str) -> list[Diagnostic]:
    result = loads(text, "p.pipe")
    assert result.ok, result.diagnostics
    return [d for d in result.diagnostics if d.code == "W0003"]


def _shown(diagnostics: list[Diagnostic]) -> str:
    """Every way a diagnostic reaches a person or a log."""
    return "\n".join(render(diagnostics, fmt) for fmt in ("human", "short", "json"))


@pytest.mark.parametrize(("env", "secret", "kind"), [
    (f'AWS_ACCESS_KEY_ID = "{KEY_ID}"', KEY_ID, "an AWS access key id"),
    (f'CREDS = "id={KEY_ID.replace("AKIA", "ASIA")};x"', KEY_ID[4:], "an AWS access key id"),
    (f'AWS_SECRET_ACCESS_KEY = "{SECRET_KEY}"', SECRET_KEY, "a secret key"),
    (f'DB_PASSWORD = "{SECRET_KEY}"', SECRET_KEY, "a secret key"),
    (f'HF_TOKEN = "{SECRET_KEY}"', SECRET_KEY, "a secret key"),
    ('DSN = "host=db user=ml password=hunter2 sslmode=require"', "hunter2", "a password"),
    ('DB_URL = "postgres://ml:hunter2@db:5432/runs"', "hunter2", "a password in a URI"),
    ('MIRROR = "https://${params.user}:hunter2@mirror.acme.com"', "hunter2",
     "a password in a URI"),
])
def test_a_literal_credential_in_env_is_a_warning_that_never_shows_it(
        env: str, secret: str, kind: str) -> None:
    text = _pipe(env).replace('pipeline "p" {', 'params {\n  user: str = "ml"\n}\n\n'
                              'pipeline "p" {') if "params.user" in env else _pipe(env)
    (warning,) = _warnings(text)
    name = env.split(" ")[0]
    assert warning.message == f"env `{name}` holds what looks like {kind}"
    assert warning.help is not None and f'{name} = secret("' in warning.help
    assert warning.span is not None and warning.span.line == text.count("\n", 0, text.index(env)) + 1
    shown = _shown([warning])
    assert secret not in shown and "hunter" not in shown
    assert "*****" in render([warning], "human")  # the source line is shown masked


@pytest.mark.parametrize(("storage", "secret"), [
    (f"s3://{KEY_ID}:{SECRET_KEY}@acme/durapipe", SECRET_KEY),
    (f"s3://{KEY_ID}@acme/durapipe", KEY_ID),
    ("https://ml:hunter2@minio.acme.com/durapipe", "hunter2"),
])
def test_credentials_in_the_storage_uri_are_a_warning_that_never_shows_them(
        storage: str, secret: str) -> None:
    (warning,) = _warnings(_pipe("A = \"1\"", storage))
    assert warning.message.startswith("`storage` holds ")
    assert warning.help is not None and "storage_secret" in warning.help
    assert warning.span is not None and warning.span.line == 2
    shown = _shown([warning])
    assert secret not in shown and KEY_ID not in shown and "hunter" not in shown


@pytest.mark.parametrize("env", [
    'TOKEN = secret("hf", "token")', 'PASSWORD = config_map("db", "password")',
    'TOKENIZER = "meta-llama/Llama-3.1-8B"', 'PASSWORD_FILE = "/etc/db/password"',
    'GIT_SHA = "0123456789abcdef0123456789abcdef01234567"',  # 40 characters, not a secret's name
    'URL = "https://user@acme.com/x"', 'URL = "https://acme.com/a:b@c"',
    'DSN = "password=${params.pw}"', 'NOTE = "set password= in the dsn"',
    'K = "AKIAIOSFODNN7EXAMPLEXX"',  # not 20 characters
])
def test_what_only_resembles_a_credential_is_not_flagged(env: str) -> None:
    text = _pipe(env).replace('pipeline "p" {', 'params {\n  pw: str = "x"\n}\n\npipeline "p" {')
    assert _warnings(text) == []


def test_a_credential_in_defaults_is_reported_once_at_the_defaults(tmp_path: Path) -> None:
    text = (f'pipeline "p" {{}}\n\ndefaults {{\n  env {{ AWS_ACCESS_KEY_ID = "{KEY_ID}" }}\n}}\n\n'
            'stage "a" {\n  image = "i"\n  command = ["true"]\n}\n\n'
            'stage "b" {\n  image = "i"\n  command = ["true"]\n}\n')
    (warning,) = _warnings(text)
    assert warning.span is not None and warning.span.line == 4


def test_the_builder_gets_the_same_warning_at_the_callers_line() -> None:
    from durapipe.dsl.builder import Pipeline

    p = Pipeline("p", storage=f"s3://{KEY_ID}:{SECRET_KEY}@acme/durapipe")  # MARK-storage
    p.stage("train", image="i", command=["true"], env={"DB_PASSWORD": SECRET_KEY})  # MARK-env
    result = p.result()
    assert result.ok
    warnings = [d for d in result.diagnostics if d.code == "W0003"]
    assert [d.message for d in warnings] == [
        "`storage` holds what looks like an AWS access key id",
        "env `DB_PASSWORD` holds what looks like a secret key"]
    lines = Path(__file__).read_text().splitlines()
    assert [d.span.line if d.span else 0 for d in warnings] == [
        next(i for i, line in enumerate(lines, 1) if marker in line and "next(" not in line)
        for marker in ("MARK-storage", "MARK-env")]
    shown = _shown(warnings)
    assert SECRET_KEY not in shown and KEY_ID not in shown


def test_check_and_compile_warn_and_still_succeed_without_printing_the_value(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.pipe"
    path.write_text(_pipe(f'AWS_SECRET_ACCESS_KEY = "{SECRET_KEY}"'))
    assert main(["check", str(path)]) == 0
    assert main(["check", "--format", "json", str(path)]) == 0
    assert main(["compile", str(path)]) == 0
    out = capsys.readouterr()
    assert out.err.count("warning[W0003]") == 2
    assert [r["code"] for r in json.loads(out.out[:out.out.index("\n]") + 2])] == ["W0003"]
    assert SECRET_KEY not in out.err
    assert SECRET_KEY in out.out.split("\n]", 1)[1]  # the YAML: what the warning is about
