"""``durapipe doctor``: whether a cluster (and a namespace, and a pipeline) has what the
compiled output needs, one line per check, a fix for each failure (docs/cluster.md, "What the
cluster needs").

Each check asks the API server, as the kubeconfig's user, what is there; rights of other
accounts (Argo's controller, the pipeline's pods) are asked with a SubjectAccessReview, which
is what the API server itself would decide.  Exit 0 when every check passes, 1 when one fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from durapipe.cluster.api import Cluster, ClusterError, client_module, connect
from durapipe.cluster.arguments import add_connection_arguments
from durapipe.cluster.run_status import printable
from durapipe.cluster.submit import print_failure

ARGO_CRDS = ("workflows.argoproj.io", "workflowtemplates.argoproj.io",
             "cronworkflows.argoproj.io", "workflowtaskresults.argoproj.io")
JOBSET_CRD = "jobsets.jobset.x-k8s.io"
CONTROLLER_CONFIGMAP = "workflow-controller-configmap"
RUNTIME_LABEL = "app.kubernetes.io/component=durapipe-runtime"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        head = f"{'ok  ' if self.ok else 'FAIL'}  {self.name}: {printable(self.detail)}"
        return head + (f"\n      fix: {self.fix}" if not self.ok and self.fix else "")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", metavar="FILE",
                        help="a .pipe or builder .py: also check what this pipeline needs")
    parser.add_argument("--argo-namespace", default="argo", metavar="NS",
                        help="the namespace Argo's controller runs in (default: argo)")
    parser.add_argument("--controller-account", default="argo", metavar="NAME",
                        help="the controller's service account (default: argo)")
    add_connection_arguments(parser)


def _ask(cluster: Cluster, what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """The answer, or ``None`` where the object is not there (404)."""
    try:
        return cluster.call(what, fn, *args)
    except ClusterError as exc:
        if exc.status == 404:
            return None
        raise


def _allowed(cluster: Cluster, user: str, verb: str, group: str, resource: str,
             namespace: str) -> bool:
    kubernetes = client_module()
    authz = kubernetes.client.AuthorizationV1Api(cluster.api)
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": user, "groups": ["system:serviceaccounts",
                                                f"system:serviceaccounts:{user.split(':')[2]}",
                                                "system:authenticated"],
                       "resourceAttributes": {"namespace": namespace, "verb": verb,
                                              "group": group, "resource": resource}}}
    answer = cluster.call(f"ask whether {user} may {verb} {resource}",
                          authz.create_subject_access_review, review)
    status = answer.status if not isinstance(answer, dict) else answer.get("status") or {}
    return bool(getattr(status, "allowed", None) if not isinstance(status, dict)
                else status.get("allowed"))


def _account(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def checks(cluster: Cluster, args: argparse.Namespace,
           compiled: Any | None) -> Iterator[Check]:
    kubernetes = client_module()
    ext = kubernetes.client.ApiextensionsV1Api(cluster.api)
    core = kubernetes.client.CoreV1Api(cluster.api)
    apps = kubernetes.client.AppsV1Api(cluster.api)
    argo_ns = args.argo_namespace

    missing = [crd for crd in ARGO_CRDS
               if _ask(cluster, f"get CRD {crd}", ext.read_custom_resource_definition, crd)
               is None]
    yield Check("Argo CRDs", not missing,
                f"missing {', '.join(missing)}" if missing else "all four installed",
                "install Argo Workflows v4.1 (kubectl apply --server-side -k "
                "https://github.com/argoproj/argo-workflows/manifests/base/crds/full?ref=v4.1.2)")

    deployment = _ask(cluster, "get Deployment workflow-controller",
                      apps.read_namespaced_deployment, "workflow-controller", argo_ns)
    if deployment is not None:
        images = [c.image for c in deployment.spec.template.spec.containers]
        tag = images[0].rpartition(":")[2] if images else ""
        supported = tag.startswith(("v4.", "v3.6", "v3.7", "latest"))
        yield Check("Argo version", supported, f"workflow-controller runs {images[0]}",
                    "durapipe compiles for Argo v4.1 (--argo-version); upgrade the controller")
    else:
        yield Check("Argo version", True, f"no workflow-controller Deployment in {argo_ns} to "
                                          "read it from (a controller run otherwise); durapipe "
                                          "compiles for v4.1")

    controller = _account(argo_ns, args.controller_account)
    denied = [verb for verb in ("create", "update")
              if not _allowed(cluster, controller, verb, "", "configmaps", argo_ns)]
    yield Check("memoization RBAC", not denied,
                f"{controller} may not {' or '.join(denied)} ConfigMaps in {argo_ns}" if denied
                else f"{controller} may create and update ConfigMaps in {argo_ns}",
                f"apply the Role and RoleBinding `durapipe-memoization` in {argo_ns} "
                "(docs/cluster.md, \"Memoization RBAC\")")

    config = _ask(cluster, f"get ConfigMap {CONTROLLER_CONFIGMAP}",
                  core.read_namespaced_config_map, CONTROLLER_CONFIGMAP, argo_ns)
    repo = bool(config is not None and (config.data or {}).get("artifactRepository"))
    local = _ask(cluster, "get ConfigMap artifact-repositories",
                 core.read_namespaced_config_map, "artifact-repositories", cluster.namespace)
    needs_repo = compiled is None or "\"artifacts\"" in json.dumps(compiled.documents)
    yield Check("artifact repository", repo or local is not None or not needs_repo,
                "configured" if repo or local is not None else
                "none configured (the pipeline passes no artifacts)" if not needs_repo else
                f"no artifactRepository in {argo_ns}/{CONTROLLER_CONFIGMAP} and no "
                f"artifact-repositories ConfigMap in {cluster.namespace}",
                f"set artifactRepository (s3 bucket, endpoint, credentials Secret) in "
                f"{argo_ns}/{CONTROLLER_CONFIGMAP}")

    if compiled is None:
        listed = cluster.call("list ConfigMaps", core.list_namespaced_config_map,
                              cluster.namespace, label_selector=RUNTIME_LABEL)
        names = [m.metadata.name for m in listed.items]
        yield Check("runtime ConfigMap", bool(names),
                    f"{', '.join(names)}" if names else f"none in {cluster.namespace}",
                    "apply the durapipe-runtime.yaml `durapipe compile -o DIR/` writes (or "
                    "`durapipe submit` a pipeline, which creates it)")
        return
    for obj in compiled.runtime_objects:
        name = obj["metadata"]["name"]
        there = _ask(cluster, f"get ConfigMap {name}", core.read_namespaced_config_map, name,
                     cluster.namespace)
        yield Check("runtime ConfigMap", there is not None,
                    f"{name} in {cluster.namespace}" + ("" if there else " is missing"),
                    "apply the durapipe-runtime.yaml `durapipe compile -o DIR/` writes, from "
                    "the same durapipe that compiled the pipeline")

    role = next((d for d in compiled.rbac if d["kind"] == "Role"), None)
    binding = next((d for d in compiled.rbac if d["kind"] == "RoleBinding"), None)
    accounts = [s["name"] for s in (binding or {}).get("subjects") or ()]
    for account in accounts:
        there = _ask(cluster, f"get ServiceAccount {account}",
                     core.read_namespaced_service_account, account, cluster.namespace)
        yield Check(f"service account {account}", there is not None,
                    "present" if there else f"missing in {cluster.namespace}",
                    f"apply the pipeline's rbac.yaml (`durapipe compile --gitops -o DIR/`), or "
                    f"kubectl create serviceaccount {account} -n {cluster.namespace}")
        denied = [f"{verb} {rule['resources'][0]}"
                  for rule in (role or {}).get("rules") or ()
                  for verb in rule["verbs"]
                  if not _allowed(cluster, _account(cluster.namespace, account), verb,
                                  rule["apiGroups"][0], rule["resources"][0],
                                  cluster.namespace)]
        yield Check(f"RBAC of {account}", not denied,
                    f"may not {', '.join(denied)}" if denied else
                    "may do all the pipeline's pods need",
                    "apply the pipeline's Role and RoleBinding (rbac.yaml of `durapipe compile "
                    "--gitops -o DIR/`)")

    if "jobset.x-k8s.io" in json.dumps(compiled.documents):
        there = _ask(cluster, f"get CRD {JOBSET_CRD}", ext.read_custom_resource_definition,
                     JOBSET_CRD)
        yield Check("JobSet CRD", there is not None,
                    "installed" if there else "missing (a multi-node stage runs as a JobSet)",
                    "install JobSet v0.12 (kubectl apply --server-side -f https://github.com/"
                    "kubernetes-sigs/jobset/releases/download/v0.12.0/manifests.yaml)")


def _compiled(path: str) -> Any | int:
    from durapipe.compiler.cli import _render, compile_file

    diagnostics: list[object] = []
    compiled = compile_file(path, argparse.Namespace(
        kind=None, argo_version="4.1", runtime_image=None, gitops=True, no_rbac=False,
        output=None), diagnostics)
    if diagnostics:
        print(_render(diagnostics, "human"), file=sys.stderr)
    return 1 if compiled is None else compiled


def doctor(args: argparse.Namespace) -> int:
    compiled: Any = None
    if args.file is not None:
        compiled = _compiled(args.file)
        if isinstance(compiled, int):
            return compiled
    try:
        cluster = connect(args.kubeconfig, args.context,
                          args.namespace or (compiled.namespace if compiled else None))
        failed = 0
        for check in checks(cluster, args, compiled):
            print(check.line(), flush=True)
            failed += not check.ok
    except ClusterError as exc:
        return print_failure(str(exc))
    if failed:
        print(f"\n{failed} check{'s' * (failed != 1)} failed", file=sys.stderr)
    return 1 if failed else 0


__all__ = ["Check", "add_arguments", "checks", "doctor"]
