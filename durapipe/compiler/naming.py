"""Deterministic Argo and Kubernetes names derived from pipeline and stage names."""

from __future__ import annotations

import re

#: Argo template, task and step names (full CRD pattern), at most 128 characters.
ARGO_NAME_RE = re.compile(r"^[a-zA-Z0-9][-a-zA-Z0-9]*$")
#: Argo parameter and artifact names.
PARAM_NAME_RE = re.compile(r"^[-a-zA-Z0-9_]+$")
DNS1123_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_ARGO_NAME = 128
#: Workflow and WorkflowTemplate names (validator), CronWorkflow names (timestamp suffix).
MAX_WORKFLOW_NAME = 63
MAX_CRON_NAME = 52
#: Argo appends 5 random characters to ``generateName``.
GENERATE_NAME_SUFFIX = 5

#: Names the compiler itself uses for templates in every object.
ENTRYPOINT = "main"
#: The pod-less templates every stage of a document shares (argo_stage.SHARED_TEMPLATES).
JOIN_TEMPLATE = "durapipe-join"
WAIT_TEMPLATE = "durapipe-wait"
RESERVED_TEMPLATE_NAMES = frozenset({ENTRYPOINT, JOIN_TEMPLATE, WAIT_TEMPLATE})


def slug(text: str) -> str:
    """Lower-case DNS-1123 fragment of arbitrary text (``A100-80GB`` -> ``a100-80gb``)."""
    out = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return out or "x"


def task_name(stage: str) -> str:
    """Template and DAG task name of a stage.

    Stage names are already DNS-1123 labels; Argo forbids task names that start with a digit
    when ``depends`` is used, and ``main`` is the entrypoint.
    """
    if stage[:1].isdigit() or stage in RESERVED_TEMPLATE_NAMES:
        return f"stage-{stage}"
    return stage


def memory_slug(size: str) -> str:
    return slug(size)


#: Argo keeps every memoization entry of a cache in one ConfigMap, which the API server refuses
#: past 1 MiB (about 1,150 of durapipe's entries); a refused save loses the entry, and a
#: memoized pod template's node ends in Error. So a pipeline's entries are spread over one
#: ConfigMap per first hex digit of their key (``cache_configmap``): 16 of them, about 18,000
#: entries a pipeline, each created by Argo with its first entry.
CACHE_SHARDS = "0123456789abcdef"
_CACHE_PREFIX = "durapipe-cache-"


def cache_configmap(pipeline: str, shard: str) -> str:
    """The memoization ConfigMap of ``pipeline``'s entries whose key starts with ``shard`` (a
    hex digit, or the Argo expression that evaluates to the key's first digit)."""
    return f"{_CACHE_PREFIX}{pipeline}"[:251] + f"-{shard}"


def cache_siblings(name: str) -> list[str]:
    """Every shard of the cache that the resolved ConfigMap ``name`` is one shard of (a name
    of output from before the shards: itself alone)."""
    stem, dash, shard = name.rpartition("-")
    if not (name.startswith(_CACHE_PREFIX) and dash and len(shard) == 1
            and shard in CACHE_SHARDS):
        return [name]
    return [f"{stem}-{digit}" for digit in CACHE_SHARDS]


def part_name(pipeline: str, index: int) -> str:
    return f"{pipeline}-part-{index}"
