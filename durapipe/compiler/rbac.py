"""The ServiceAccount, Role and RoleBinding a compiled pipeline's pods need, and nothing more.

Who calls the API server from a durapipe pod, and for what (Argo v4.1.2 with the emissary
executor; sources under /work/shared/argo/v4.1.2/src):

* Argo's ``wait`` container reports each node's outputs and progress as a WorkflowTaskResult
  (``workflow/executor/taskresult.go``: ``Create``, then ``Patch``): ``workflowtaskresults``
  ``create`` and ``patch`` in ``argoproj.io``.
* durapipe's upload agent asks for its own pod's status when the wrapper cannot tell why the
  main container ended (``durapipe/runtime/podstatus.py``: one ``GET`` of
  ``/api/v1/namespaces/NS/pods/NAME``): ``pods`` ``get``.
* A multi-node stage is a resource template: Argo's executor runs ``kubectl create`` of the
  JobSet and then ``kubectl get`` until the success or failure condition holds
  (``workflow/executor/resource.go``): ``jobsets`` ``create`` and ``get`` in
  ``jobset.x-k8s.io``, only when the pipeline has such a stage.
* A pipeline split into parts runs each part as a child Workflow from a resource template of
  the run: the executor's ``kubectl create`` of the Workflow, its GETs of it until the success
  or failure condition holds, and ``kubectl get`` for each output parameter's ``jqFilter``:
  ``workflows`` ``create`` and ``get`` in ``argoproj.io``, only when the pipeline splits.
  (The child's owner reference, which Argo adds with ``setOwnerReference``, blocks the run's
  deletion; a cluster running the ``OwnerReferencesPermissionEnforcement`` admission plugin,
  not on by default, would also want ``update`` of ``workflows/finalizers``.)

* The checkpoint collector (``checkpoint_gc``) lists the namespace's Workflows that have not
  finished, to keep the lines they use (``durapipe/runtime/linegc.py``): ``workflows``
  ``list`` in ``argoproj.io``, only when the pipeline has one.

Memoization's cache ConfigMap is written by the workflow controller under its own account, so
the pods need no ConfigMap rights.
"""

from __future__ import annotations

from typing import Any

from durapipe.dsl.model import Pipeline

Json = dict[str, Any]

RBAC_API = "rbac.authorization.k8s.io/v1"
MANAGED_BY = {"app.kubernetes.io/managed-by": "durapipe"}


def account_name(pipeline: Pipeline) -> str:
    """The ServiceAccount durapipe emits for ``pipeline`` (when it sets no
    ``service_account`` of its own)."""
    return f"{pipeline.name}-durapipe"


def rules(pipeline: Pipeline, creates_workflows: bool = False) -> list[Json]:
    out: list[Json] = [
        {"apiGroups": ["argoproj.io"], "resources": ["workflowtaskresults"],
         "verbs": ["create", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
    ]
    if any(stage.distributed is not None for stage in pipeline.stages):
        out.append({"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"],
                    "verbs": ["create", "get"]})
    verbs = (["create", "get"] if creates_workflows else []) + \
        (["list"] if pipeline.checkpoint_gc is not None else [])
    if verbs:
        out.append({"apiGroups": ["argoproj.io"], "resources": ["workflows"], "verbs": verbs})
    return out


def accounts(pipeline: Pipeline) -> list[str]:
    """Every service account the pipeline's pods run as, sorted."""
    default = pipeline.service_account or account_name(pipeline)
    names = {default}
    names.update(s.service_account for s in pipeline.stages if s.service_account is not None)
    return sorted(names)


def rbac_documents(pipeline: Pipeline, creates_workflows: bool = False) -> list[Json]:
    """ServiceAccount (only the one durapipe names; accounts the pipeline names are the
    cluster's), Role and RoleBinding, in the pipeline's namespace.  ``creates_workflows``: the
    compiled run starts child Workflows (``argo_workflow.creates_workflows``)."""
    name = account_name(pipeline)

    def meta(object_name: str) -> Json:
        out: Json = {"name": object_name}
        if pipeline.namespace:
            out["namespace"] = pipeline.namespace
        out["labels"] = dict(sorted({**MANAGED_BY,
                                     "durapipe.dev/pipeline": pipeline.name}.items()))
        return out

    docs: list[Json] = []
    used = accounts(pipeline)
    if name in used:
        docs.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(name)})
    docs.append({"apiVersion": RBAC_API, "kind": "Role", "metadata": meta(name),
                 "rules": rules(pipeline, creates_workflows)})
    subjects: list[Json] = []
    for account in used:
        subject: Json = {"kind": "ServiceAccount", "name": account}
        if pipeline.namespace:
            subject["namespace"] = pipeline.namespace
        subjects.append(subject)
    docs.append({"apiVersion": RBAC_API, "kind": "RoleBinding", "metadata": meta(name),
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                             "name": name},
                 "subjects": subjects})
    return docs
