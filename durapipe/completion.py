"""``durapipe completion bash|zsh|fish``: a completion script made from the command line's own
parser, so every command and option it has is offered, and nothing it lacks.

Commands complete at the first word, each command's options after a ``-``, an option's
choices after the option (``--format h`` -> ``human``), and files otherwise.  The script is
the same bytes on every machine (commands and options in the parser's order).
"""

from __future__ import annotations

import argparse
import shlex

SHELLS = ("bash", "zsh", "fish")


def _commands(parser: argparse.ArgumentParser) -> dict[str, tuple[str, argparse.ArgumentParser]]:
    """Each command's help line and parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return {name: (helps.get(name, ""), sub) for name, sub in action.choices.items()}
    return {}


def _options(parser: argparse.ArgumentParser) -> list[tuple[list[str], list[str], str]]:
    """Each option's strings, its choices (strings) and its help."""
    out = []
    for action in parser._actions:
        if action.option_strings:
            choices = [str(c) for c in action.choices] if action.choices else []
            out.append((list(action.option_strings), choices, action.help or ""))
    return out


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    commands = _commands(parser)
    return {"bash": _bash, "zsh": _zsh, "fish": _fish}[shell](commands)


def _bash(commands: dict[str, tuple[str, argparse.ArgumentParser]]) -> str:
    lines = [
        "# durapipe completion for bash: source <(durapipe completion bash)",
        "_durapipe() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"',
        '    if [ "$COMP_CWORD" -eq 1 ]; then',
        f'        COMPREPLY=($(compgen -W {shlex.quote(" ".join(commands))} -- "$cur"))',
        "        return",
        "    fi",
        '    local opts="" values=""',
        '    case "${COMP_WORDS[1]}" in',
    ]
    for name, (_help, sub) in commands.items():
        options = _options(sub)
        lines.append(f"        {name})")
        flags = " ".join(s for strings, _c, _h in options for s in strings)
        lines.append(f"            opts={shlex.quote(flags)}")
        valued = [(strings, choices) for strings, choices, _h in options if choices]
        if valued:
            lines.append('            case "$prev" in')
            for strings, choices in valued:
                lines.append(f"                {'|'.join(strings)}) "
                             f"values={shlex.quote(' '.join(choices))} ;;")
            lines.append("            esac")
        lines.append("            ;;")
    lines += [
        "    esac",
        '    if [ -n "$values" ]; then',
        '        COMPREPLY=($(compgen -W "$values" -- "$cur"))',
        '    elif [[ "$cur" == -* ]]; then',
        '        COMPREPLY=($(compgen -W "$opts" -- "$cur"))',
        "    else",
        '        COMPREPLY=($(compgen -f -- "$cur"))',
        "    fi",
        "}",
        "complete -o filenames -o bashdefault -F _durapipe durapipe",
    ]
    return "\n".join(lines) + "\n"


def _zsh(commands: dict[str, tuple[str, argparse.ArgumentParser]]) -> str:
    # zsh runs the bash function through its own bashcompinit, which it ships for this.
    return ("# durapipe completion for zsh: source <(durapipe completion zsh)\n"
            "autoload -U +X bashcompinit && bashcompinit\n" + _bash(commands))


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish(commands: dict[str, tuple[str, argparse.ArgumentParser]]) -> str:
    names = " ".join(commands)
    lines = ["# durapipe completion for fish: durapipe completion fish | source",
             "complete -c durapipe -f"]
    for name, (help_, _sub) in commands.items():
        lines.append(f"complete -c durapipe -n 'not __fish_seen_subcommand_from {names}' "
                     f"-a {name} -d {_fish_quote(help_)}")
    for name, (_help, sub) in commands.items():
        condition = f"-n '__fish_seen_subcommand_from {name}'"
        lines.append(f"complete -c durapipe {condition} -F")
        for strings, choices, help_ in _options(sub):
            parts = []
            for option in strings:
                parts.append(f"-l {option[2:]}" if option.startswith("--") else f"-s {option[1:]}")
            values = f" -x -a {_fish_quote(' '.join(choices))}" if choices else ""
            lines.append(f"complete -c durapipe {condition} {' '.join(parts)}{values} "
                         f"-d {_fish_quote(help_)}")
    return "\n".join(lines) + "\n"
