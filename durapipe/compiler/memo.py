"""Cache keys for Argo memoization.

Argo resolves ``memoize.key`` in the controller before the pod exists, so the key has two
levels:

1. At compile time, :func:`static_digest` hashes everything the compiler knows (image, argv
   with references left symbolic, result-affecting env, the version salt) with the runtime's
   :func:`durapipe.runtime.cachekey.cache_key`, the same function the local runner calls.
2. At run time, Argo evaluates ``sha256(toJson({params, static, upstream}))`` over the
   resolved values of the params the stage reads and the content hashes its upstream stages
   published as output parameters.  :func:`runtime_key` computes the same bytes in Python.

The result is 64 lowercase hex characters, which matches Argo's key regex
``^[a-zA-Z0-9][-a-zA-Z0-9]*$`` and fits a ConfigMap key.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence

from durapipe.runtime.cachekey import cache_key, make_record


def static_digest(
    *, image: str, command: Sequence[str], env: Mapping[str, str], salt: str
) -> str:
    """The compile-time half of the key (params and upstream hashes enter at run time)."""
    return cache_key(make_record(image=image, command=command, env=env, salt=salt))


def key_expression(static: str, params: Sequence[str], upstream: Mapping[str, str]) -> str:
    """The Argo expression template for ``memoize.key``.

    ``params`` are pipeline param names; ``upstream`` maps ``stage.output`` to the name of the
    input parameter carrying that output's content hash.
    """
    param_items = ", ".join(f"'{p}': workflow.parameters['{p}']" for p in sorted(params))
    up_items = ", ".join(
        f"'{k}': inputs.parameters['{upstream[k]}']" for k in sorted(upstream)
    )
    # No "}}" may appear inside the expression: Argo's template engine ends the `{{=` tag at
    # the first "}}" (found by running the key on Argo's controller), so closing braces of
    # nested maps are kept apart with a space.
    record = (
        f"{{'params': {{{param_items}}} , 'static': '{static}', 'upstream': {{{up_items}}} }}"
    )
    expression = "sprig.sha256sum(toJson(" + record + "))"
    assert "}}" not in expression
    return "{{=" + expression + "}}"


def shard_expression(key: str) -> str:
    """The Argo expression for the first hex digit of the key ``key`` (an expression
    :func:`key_expression` wrote): which of a pipeline's cache ConfigMaps holds its entry."""
    inner = key.removeprefix("{{=").removesuffix("}}")
    assert inner != key and "}}" not in inner, key
    return "{{=sprig.substr(0, 1, " + inner + ")}}"


def _go_json(value: object) -> str:
    """``encoding/json.Marshal`` output for maps of strings: sorted keys, HTML-escaped."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def runtime_key(static: str, params: Mapping[str, str], upstream: Mapping[str, str]) -> str:
    """What Argo's key expression evaluates to, given resolved values."""
    record = {"params": dict(params), "static": static, "upstream": dict(upstream)}
    return hashlib.sha256(_go_json(record).encode("utf-8")).hexdigest()


#: A key expression as :func:`key_expression` writes it, inside a longer text (a checkpoint
#: line's URI): ``)}}`` ends it, since its own braces never meet.
_KEY_IN_TEXT = re.compile(r"\{\{=sprig\.sha256sum\(toJson\(.*?\)\)\}\}")
_PARAM_ITEM = re.compile(r"'([^']*)': workflow\.parameters\['([^']*)'\]")
_UPSTREAM_ITEM = re.compile(r"'([^']*)': inputs\.parameters\['([^']*)'\]")
_STATIC = re.compile(r"'static': '([0-9a-f]{64})'")


def evaluate_key_expression(expression: str, params: Mapping[str, str],
                            inputs: Mapping[str, str]) -> str | None:
    """What Argo makes of an expression :func:`key_expression` wrote, given the run's workflow
    parameters and the template's input parameters; ``None`` for any other text, or where a
    value it reads is missing.  Only the compiler's own form is evaluated: the expression must
    be exactly what :func:`key_expression` gives for what it names."""
    static = _STATIC.search(expression)
    if static is None:
        return None
    names = {key: ref for key, ref in _PARAM_ITEM.findall(expression)}
    upstream = {key: ref for key, ref in _UPSTREAM_ITEM.findall(expression)}
    if any(key != ref for key, ref in names.items()):
        return None
    if key_expression(static[1], sorted(names), upstream) != expression:
        return None
    if any(name not in params for name in names) or any(
            ref not in inputs for ref in upstream.values()):
        return None
    return runtime_key(static[1], {name: params[name] for name in names},
                       {key: inputs[ref] for key, ref in upstream.items()})


def evaluate_keys_in(text: str, params: Mapping[str, str], inputs: Mapping[str, str]) -> str:
    """``text`` with each key expression in it evaluated (left as written where it cannot
    be)."""
    def one(match: re.Match[str]) -> str:
        value = evaluate_key_expression(match[0], params, inputs)
        return match[0] if value is None else value

    return _KEY_IN_TEXT.sub(one, text)


# -- what a key was made of (why a cache missed) ---------------------------------------------

#: The memoized template's input that records what its key was made of, and the output that
#: carries it into Argo's memoization entry (which keeps a node's outputs), so that a later
#: miss can say which component changed.
COMPONENTS_PARAM = "durapipe-cache-inputs"
#: Literals that go into the record as written; other text goes in as its digest (the record
#: is an Argo expression's single-quoted strings).
_LITERAL = re.compile(r"^[-A-Za-z0-9._/:@+]{1,512}$")


def _digest(value: object) -> str:
    return "sha256:" + hashlib.sha256(_go_json(value).encode("utf-8")).hexdigest()[:16]


def _literal(text: str) -> str:
    return text if _LITERAL.match(text) else _digest(text)


def static_components(*, image: str, command: Sequence[str], env: Mapping[str, str],
                      salt: str) -> dict[str, str]:
    """The parts of :func:`static_digest`, each readable or digested: what `status` and
    `durapipe run` name when the static half of a key changed."""
    from durapipe.runtime.cachekey import CACHE_KEY_SCHEMA_VERSION

    return {"image": _literal(image), "command": _digest(list(command)),
            "env": _digest(dict(env)), "version": _literal(salt) if salt else "",
            "schema": str(CACHE_KEY_SCHEMA_VERSION)}


def components_expression(stage: str, static: str, parts: Mapping[str, str],
                          params: Sequence[str], upstream: Mapping[str, str]) -> str:
    """The Argo expression for the record of one key's components: the same reads as
    :func:`key_expression`, and the static parts as literals."""
    param_items = ", ".join(f"'{p}': workflow.parameters['{p}']" for p in sorted(params))
    up_items = ", ".join(
        f"'{k}': inputs.parameters['{upstream[k]}']" for k in sorted(upstream))
    literals = ", ".join(f"'{k}': '{v}'" for k, v in sorted(
        {"stage": stage, "static": static, **parts}.items()))
    expression = (f"toJson({{{literals}, 'params': {{{param_items}}} , "
                  f"'upstream': {{{up_items}}} }})")
    assert "}}" not in expression and all(_LITERAL.match(v) or not v for v in parts.values())
    return "{{=" + expression + "}}"


def components(stage: str, static: str, parts: Mapping[str, str], params: Mapping[str, str],
               upstream: Mapping[str, str]) -> dict[str, object]:
    """What :func:`components_expression` evaluates to, as a mapping (the local runner's)."""
    return {"stage": stage, "static": static, **parts, "params": dict(params),
            "upstream": dict(upstream)}


#: How each component is named in a miss's explanation.
_COMPONENT_NAMES = {"image": "image", "command": "command", "env": "environment",
                    "version": "cache version", "schema": "cache key schema"}


def explain_miss(current: Mapping[str, object],
                 entries: Sequence[tuple[str, Mapping[str, object]]]) -> str:
    """Why a stage's key found no entry: what changed between ``current`` (this run's
    components) and the newest of ``entries`` (``(created_at, components)`` of the same
    stage, any order).  ``""`` where ``current`` is not a record of components."""
    if not isinstance(current.get("params"), dict):
        return ""
    same_stage = [(at, e) for at, e in entries if e.get("stage") == current.get("stage")]
    if not same_stage:
        return "no earlier cache entry for this stage"
    _at, newest = max(same_stage, key=lambda item: item[0])
    changes: list[str] = []
    for group in ("params", "upstream"):
        now, then = current.get(group), newest.get(group)
        now = now if isinstance(now, dict) else {}
        then = then if isinstance(then, dict) else {}
        label = "param" if group == "params" else "upstream"
        for name in sorted(set(now) | set(then)):
            if now.get(name) != then.get(name):
                changes.append(f"{label} {name}: {_short(then.get(name))} -> "
                               f"{_short(now.get(name))}")
    for part, label in _COMPONENT_NAMES.items():
        if current.get(part) != newest.get(part):
            was, now_value = newest.get(part), current.get(part)
            changes.append(f"{label} changed" if part in ("command", "env") else
                           f"{label}: {_short(was)} -> {_short(now_value)}")
    if not changes:
        return ("an entry with these inputs exists but was not used (older than the stage's "
                "max_age, or written after this run looked)")
    return "; ".join(changes)


def _short(value: object) -> str:
    if value is None:
        return "(none)"
    text = str(value)
    if re.fullmatch(r"[0-9a-f]{64}", text):
        return text[:12] + "…"
    return repr(text) if len(text) <= 60 else repr(text[:57] + "...")
