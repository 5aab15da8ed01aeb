"""``-p NAME=VALUE`` on the command line: one parser for `durapipe run` and `durapipe submit`."""

from __future__ import annotations

from collections.abc import Sequence


def parse_assignments(items: Sequence[str]) -> dict[str, str] | str:
    """The ``NAME=VALUE`` pairs (a later one wins), or the message naming the malformed one.

    Only the first ``=`` splits: a value may hold ``=`` itself (``-p filter=a=b``)."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            return f"-p {item!r}: expected NAME=VALUE"
        out[name] = value
    return out


def read_parameter_file(path: str) -> dict[str, str] | str:
    """``-f/--parameter-file FILE``: a YAML or JSON mapping of parameter names to scalar
    values, as strings the way ``-p`` gives them (``true``, ``0.001``); or the message saying
    what is wrong with the file."""
    import json

    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read(1024 * 1024 + 1)
    except OSError as exc:
        return f"--parameter-file {path}: {exc.strerror or exc}"
    if len(text) > 1024 * 1024:
        return f"--parameter-file {path}: over 1 MiB, which no parameter file needs"
    try:
        if path.endswith(".json"):
            loaded = json.loads(text)
        else:
            try:
                import yaml
            except ImportError:
                return (f"--parameter-file {path}: reading YAML needs PyYAML (the `cluster` "
                        "extra), or give the parameters as a .json file")
            loaded = yaml.safe_load(text)
    except ValueError as exc:  # json.JSONDecodeError
        return f"--parameter-file {path} is not valid JSON: {exc}"
    except Exception as exc:  # yaml.YAMLError, whose module may not be importable above
        if type(exc).__module__.startswith("yaml"):
            return f"--parameter-file {path} is not valid YAML: {str(exc).splitlines()[0]}"
        raise
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        return (f"--parameter-file {path}: expected a mapping of parameter names to values, "
                f"got a {type(loaded).__name__}")
    out: dict[str, str] = {}
    for name, value in loaded.items():
        if not isinstance(name, str) or not name:
            return f"--parameter-file {path}: parameter name {name!r} is not a string"
        if isinstance(value, bool):
            out[name] = "true" if value else "false"
        elif isinstance(value, (int, float, str)):
            out[name] = str(value)
        else:
            return (f"--parameter-file {path}: `{name}` is a {type(value).__name__}; "
                    "parameters are strings, numbers or booleans")
    return out
