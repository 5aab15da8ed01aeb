"""Would the scheduler place a pod on a node?  Kubernetes' node-selection rules, for tests.

The harness runs Argo's controller but no scheduler, so tests decide placement here, with the
rules of ``k8s.io/component-helpers/scheduling/corev1``: every ``nodeSelector`` entry must equal
the node's label; of ``requiredDuringSchedulingIgnoredDuringExecution`` the node must match at
least one term, and a term's expressions all (``In``: label present with one of the values;
``NotIn``: label absent or with none of them; ``Exists`` / ``DoesNotExist``); and every
``NoSchedule``/``NoExecute`` taint must be tolerated (``Equal`` on key and value, ``Exists`` on
key, an empty key with ``Exists`` tolerating everything).  Preferred terms only rank nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Taint = tuple[str, str, str]  # key, value, effect


def _expression(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], list(expr.get("values") or ())
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"operator {op!r} is not one the scheduler knows")


def _tolerated(taint: Taint, tolerations: list[Mapping[str, Any]]) -> bool:
    key, value, effect = taint
    for t in tolerations:
        if t.get("effect") and t["effect"] != effect:
            continue
        op = t.get("operator", "Equal")
        if op == "Exists" and (not t.get("key") or t["key"] == key):
            return True
        if op == "Equal" and t.get("key") == key and t.get("value", "") == value:
            return True
    return False


def schedulable(pod: Mapping[str, Any], labels: Mapping[str, str],
                taints: tuple[Taint, ...] = ()) -> bool:
    for key, value in (pod.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = (((pod.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required is not None:
        terms = required.get("nodeSelectorTerms") or []
        if not any(all(_expression(e, labels) for e in term.get("matchExpressions") or ())
                   for term in terms):
            return False
    tolerations = list(pod.get("tolerations") or ())
    return all(_tolerated(t, tolerations) for t in taints
               if t[2] in ("NoSchedule", "NoExecute"))
