"""Text in Argo fields: references as Argo expressions, and user text Argo must not template.

Every name the Argo objects use for a data edge (artifact inputs, hash parameters, the paths
inputs land on) is made here, so the stage and the workflow agree on them.
"""

from __future__ import annotations

from durapipe.compiler.context import CompileContext, Loc
from durapipe.compiler.plan import RUNTIME_ROOT, kubelet_literal
from durapipe.dsl.model import Ref, Text

INPUTS_ROOT = f"{RUNTIME_ROOT}/inputs"


def input_path(stage: str, output: str) -> str:
    return f"{INPUTS_ROOT}/{stage}/{output}"


def artifact_input_name(stage: str, output: str) -> str:
    return f"in-{stage}-{output}"


def hash_param_name(output: str) -> str:
    return f"{output}-hash"


def upstream_hash_input(stage: str, output: str) -> str:
    return f"{stage}-{output}-hash"


def render_ref(ctx: CompileContext, ref: Ref, loc: Loc) -> str:
    """A reference as the pod sees it: a workflow parameter, or the path an input lands on.
    (Unknown names are the front end's P0301, ``validate.check_references``.)"""
    if ref.is_param:
        return "{{workflow.parameters." + ref.path[1] + "}}"
    if ref.is_output:
        return input_path(ref.path[0], ref.path[2])
    ctx.error("P0405", f"`{ref}` has no value here", loc, help=f"write `needs = [{ref}]`")
    return ""


def render_text(ctx: CompileContext, value: Text, loc: Loc) -> str:
    """User text for a kubelet-expanded field (``command``, ``args``, ``env``): its literal
    parts escaped (:func:`kubelet_literal`), its references lowered.  Text Argo would template
    is the front end's P0404 (``validate``), so ``check``, ``compile`` and ``run`` agree."""
    if isinstance(value, str):
        return kubelet_literal(value)
    if isinstance(value, Ref):
        return render_ref(ctx, value, loc)
    return "".join(kubelet_literal(part) if isinstance(part, str) else render_ref(ctx, part, loc)
                   for part in value.parts)
