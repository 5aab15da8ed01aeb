"""What a hostile or broken API server, or a workload, could put in a Workflow object: shared by
the tests of `durapipe status`'s reading (test_run_status.py) and of its command line
(test_submit.py)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from typing import Any

from hypothesis import strategies as st

from durapipe.runtime import contract
from tests.cluster.record_workflows import RECORDED

#: Sequences a workload could put in its termination message: a window title, a cleared
#: screen, a carriage return and a new line that would start a spoofed row, a one-character
#: C1 CSI, DEL, and a right-to-left override.
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\r\nfake  Succeeded\x9b31m\x7f\u202e"
#: What a terminal would act on; the rendering must contain none of it (newlines aside).
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028-\u202e\u2066-\u2069]")

RECORDED_OBJECTS: list[dict[str, Any]] = [json.loads(p.read_text(encoding="utf-8"))
                    for p in sorted(RECORDED.glob("*.json"))]


#: Strings that once reached int() or json.loads past their limits, and text an API server
#: could hold anywhere.
AWKWARD_TEXT = [
    "9" * 5000, "train-app-0(" + "9" * 5000 + ")", "x-app-" + "9" * 5000,
    "{{=" + "9" * 4400 + " - asInt(inputs.parameters.preempted-before)}}",
    "{{=" + "+".join(["asInt(" + "9" * 18 + ")"] * 300) + "}}",
    "+".join(["9" * 5000] * 2), "1+" * 3000 + "1", "{{retries}}+" + "9" * 4400,
    f"{contract.VERDICT_TAG}app_failure " + "[" * 5000, HOSTILE, "", "{{", "(",
]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
    | st.sampled_from(AWKWARD_TEXT),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=5)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    items = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list) else ()
    for key, item in items:
        yield from _paths(item, (*prefix, key))


@st.composite
def mutated_workflows(draw: st.DrawFn) -> Any:
    """A recorded Workflow with one to three parts replaced by any JSON value, deleted, or
    (for text) given awkward text: what a buggy or hostile API server could return."""
    wf: Any = copy.deepcopy(draw(st.sampled_from(RECORDED_OBJECTS)))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_paths(wf))))
        if not path:
            wf = draw(JSON_VALUES)
            continue
        *above, last = path
        parent = wf
        for key in above:
            parent = parent[key]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[last]
        else:
            parent[last] = draw(JSON_VALUES)
    return wf
