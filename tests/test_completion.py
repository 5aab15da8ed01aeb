"""`durapipe completion bash|zsh|fish` (#27): made from the parser, so every command and option
is offered. bash (always on the machine) runs the script for real; the zsh script is the bash
one under zsh's own bashcompinit, and the fish script is checked line by line."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys

import pytest

from durapipe.cli import build_parser
from durapipe.completion import _commands, _options


def _script(shell: str) -> str:
    done = subprocess.run([sys.executable, "-m", "durapipe", "completion", shell],
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def _complete(script: str, *words: str) -> list[str]:
    """What bash offers for the last of ``words`` (the line typed so far)."""
    quoted = " ".join(f"'{w}'" for w in ("durapipe", *words))
    program = (f"{script}\nCOMP_WORDS=({quoted}); COMP_CWORD={len(words)}; _durapipe; "
               'printf "%s\\n" "${COMPREPLY[@]}"')
    done = subprocess.run(["bash", "--norc", "-c", program], capture_output=True, text=True,
                          timeout=30, check=True)
    return done.stdout.split()


@pytest.fixture(scope="module")
def bash_script() -> str:
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    return _script("bash")


def test_bash_completes_commands_options_choices_and_files(bash_script: str,
                                                           tmp_path: object) -> None:
    assert _complete(bash_script, "che") == ["check", "checkpoints"]
    assert _complete(bash_script, "compile", "--ku") == ["--kustomization"]
    assert _complete(bash_script, "compile", "--kind", "") == ["workflow", "template", "cron"]
    assert _complete(bash_script, "checkpoints", "--protect") == ["--protect-unfinished-runs"]
    assert "README.md" in _complete(bash_script, "check", "READ")


def test_every_command_and_option_of_the_parser_is_offered(bash_script: str) -> None:
    parser = build_parser(None)
    commands = _commands(parser)
    assert _complete(bash_script, "") == list(commands)
    for name, (_help, sub) in commands.items():
        longs = sorted(s for strings, _c, _h in _options(sub) for s in strings
                       if s.startswith("--"))
        assert sorted(_complete(bash_script, name, "--")) == longs, name


def test_zsh_and_fish_scripts_name_every_command_and_option() -> None:
    parser = build_parser(None)
    commands = _commands(parser)
    zsh = _script("zsh")
    assert "bashcompinit" in zsh and zsh.endswith(_script("bash"))
    fish = _script("fish").splitlines()
    for name, (_help, sub) in commands.items():
        assert any(f" -a {name} -d " in line for line in fish), name
        for strings, choices, _h in _options(sub):
            for option in strings:
                flag = f"-l {option[2:]}" if option.startswith("--") else f"-s {option[1:]}"
                assert any(f"__fish_seen_subcommand_from {name}'" in line and flag in line
                           for line in fish), (name, option)
    assert _script("fish") == _script("fish")  # the same bytes every time


def test_an_unknown_shell_is_a_usage_error() -> None:
    done = subprocess.run([sys.executable, "-m", "durapipe", "completion", "tcsh"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "invalid choice: 'tcsh'" in done.stderr
    assert isinstance(build_parser(None), argparse.ArgumentParser)
