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
