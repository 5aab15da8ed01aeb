"""Talking to a cluster: `durapipe submit`, `status` and `watch`.

The only module that imports the ``kubernetes`` client (the ``cluster`` extra), and only when a
command runs.  Every failure of the client (no kubeconfig, an API server that does not answer,
a missing object, RBAC) becomes a ``ClusterError`` carrying one sentence for the user; nothing
of the client's exception types leaks past this module.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

GROUP = "argoproj.io"
VERSION = "v1alpha1"
PLURALS = {"Workflow": "workflows", "WorkflowTemplate": "workflowtemplates",
           "CronWorkflow": "cronworkflows"}
T = TypeVar("T")


class ClusterError(Exception):
    """A failure to report as one line (and exit 1), never as a traceback."""


def _client_module() -> Any:
    try:
        import kubernetes
    except ImportError as exc:
        raise ClusterError(
            f"this command needs the `cluster` extra ({exc.name} is missing): "
            "pip install 'durapipe[cluster]'") from None
    return kubernetes


@dataclass
class Cluster:
    """A connection to one API server, in one namespace."""

    api: Any
    namespace: str
    server: str

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``, its client exceptions turned into a ``ClusterError``
        that names ``what`` was being done."""
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise self.translate(what, exc) from None

    def translate(self, what: str, exc: Exception) -> Exception:
        """The ``ClusterError`` for one of the client's exceptions; anything else unchanged."""
        kubernetes = _client_module()
        if isinstance(exc, kubernetes.client.exceptions.ApiException):
            return ClusterError(self._api_message(what, exc))
        name = type(exc).__name__
        # urllib3's MaxRetryError, NewConnectionError, ProtocolError; TLS failures.
        if any(part in name for part in ("MaxRetry", "Connection", "SSL", "Protocol")) or \
                isinstance(exc, OSError):
            return ClusterError(
                f"cannot reach the Kubernetes API server at {self.server} while trying to "
                f"{what}: {_short(exc)}")
        return exc

    def _api_message(self, what: str, exc: Any) -> str:
        status = getattr(exc, "status", None)
        detail = _short(exc)
        try:
            body = json.loads(exc.body or "{}")
            detail = str(body.get("message") or detail)
        except (TypeError, ValueError):
            pass
        if status == 401:
            return f"the API server at {self.server} refused the credentials of this kubeconfig " \
                   f"while trying to {what}: {detail}"
        if status == 403:
            return f"not allowed to {what} (RBAC): {detail}; ask for a Role granting it in " \
                   f"namespace {self.namespace}"
        if status == 404:
            return f"cannot {what}: not found in namespace {self.namespace} ({detail}); are " \
                   "Argo's CRDs installed and the name right?"
        return f"cannot {what}: {detail} (HTTP {status})"

    # -- the objects ----------------------------------------------------------------------

    def _custom(self) -> Any:
        return _client_module().client.CustomObjectsApi(self.api)

    def get(self, kind: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.call(
            f"get {kind} {name}", self._custom().get_namespaced_custom_object,
            GROUP, VERSION, self.namespace, PLURALS[kind], name)
        return result

    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        kind = str(body["kind"])
        name = body["metadata"].get("name") or body["metadata"].get("generateName", "") + "*"
        result: dict[str, Any] = self.call(
            f"create {kind} {name}", self._custom().create_namespaced_custom_object,
            GROUP, VERSION, self.namespace, PLURALS[kind], dict(body))
        return result

    def apply(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create ``body`` or replace the object of its name (templates, cron workflows)."""
        kubernetes = _client_module()
        kind, name = str(body["kind"]), str(body["metadata"]["name"])
        custom = self._custom()
        try:
            current = custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURALS[kind], name)
        except kubernetes.client.exceptions.ApiException as exc:
            if exc.status != 404:
                raise self.translate(f"get {kind} {name}", exc) from None
            return self.create(body)
        except Exception as exc:
            raise self.translate(f"get {kind} {name}", exc) from None
        replaced = dict(body)
        replaced["metadata"] = {**body["metadata"],
                                "resourceVersion": current["metadata"]["resourceVersion"]}
        result: dict[str, Any] = self.call(
            f"replace {kind} {name}", custom.replace_namespaced_custom_object,
            GROUP, VERSION, self.namespace, PLURALS[kind], name, replaced)
        return result

    def ensure_core(self, body: Mapping[str, Any]) -> None:
        """Create a core object the pipeline's pods need (the runtime's ConfigMap) unless one
        of its name exists: such objects are named by their content, so the name says it all."""
        kubernetes = _client_module()
        kind, name = str(body["kind"]), str(body["metadata"]["name"])
        create = {"ConfigMap": "create_namespaced_config_map"}.get(kind)
        if create is None:
            raise ClusterError(f"durapipe submit does not create {kind} objects ({name}); "
                               "apply them with kubectl or your GitOps tool")
        core = kubernetes.client.CoreV1Api(self.api)
        try:
            getattr(core, create)(self.namespace, dict(body))
        except kubernetes.client.exceptions.ApiException as exc:
            if exc.status != 409:
                raise self.translate(f"create {kind} {name}", exc) from None
        except Exception as exc:
            raise self.translate(f"create {kind} {name}", exc) from None

    def watch_workflow(self, name: str, resource_version: str,
                       timeout_s: int) -> Iterator[tuple[str, dict[str, Any]]]:
        """(event type, object) for the named Workflow from ``resource_version`` on, until the
        server ends the watch (after ``timeout_s``) or the version expires (HTTP 410, raised as
        ``Expired``)."""
        kubernetes = _client_module()
        watcher = kubernetes.watch.Watch()
        stream = watcher.stream(
            self._custom().list_namespaced_custom_object, GROUP, VERSION, self.namespace,
            "workflows", field_selector=f"metadata.name={name}",
            resource_version=resource_version, timeout_seconds=timeout_s,
            allow_watch_bookmarks=True)
        try:
            for event in self._guarded(f"watch Workflow {name}", stream):
                kind, obj = str(event["type"]), event["object"]
                if kind == "ERROR":
                    if isinstance(obj, Mapping) and obj.get("code") == 410:
                        raise Expired()
                    raise ClusterError(f"watching Workflow {name} failed: {obj}")
                yield kind, obj
        finally:
            watcher.stop()

    def _guarded(self, what: str, stream: Iterator[T]) -> Iterator[T]:
        kubernetes = _client_module()
        while True:
            try:
                item = next(stream)
            except StopIteration:
                return
            except kubernetes.client.exceptions.ApiException as exc:
                if exc.status == 410:
                    raise Expired() from None
                raise self.translate(what, exc) from None
            except Exception as exc:
                raise self.translate(what, exc) from None
            yield item


class Expired(Exception):
    """The watch's resource version is too old: list again and watch from there."""


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def connect(kubeconfig: str | None, context: str | None, namespace: str | None) -> Cluster:
    """A client from the kubeconfig (``--kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``),
    or the pod's service account when running inside a cluster."""
    import os

    kubernetes = _client_module()
    # A kubeconfig that says insecure-skip-tls-verify has chosen it; kubectl stays silent then,
    # and urllib3's warning on every request would bury durapipe's own one-line messages.
    import warnings

    warnings.filterwarnings("ignore", message="Unverified HTTPS request")
    config = kubernetes.config
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or os.path.expanduser(
        "~/.kube/config")
    try:
        if kubeconfig is None and not os.path.exists(path) and os.environ.get(
                "KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()
            api = kubernetes.client.ApiClient()
            current_ns = _incluster_namespace()
        else:
            if not os.path.exists(path):
                raise ClusterError(
                    f"no kubeconfig: {path} does not exist; pass --kubeconfig FILE or set "
                    "KUBECONFIG")
            api = config.new_client_from_config(config_file=path, context=context)
            current_ns = _kubeconfig_namespace(config, path, context)
    except ClusterError:
        raise
    except config.config_exception.ConfigException as exc:
        raise ClusterError(f"cannot use kubeconfig {path}: {_short(exc)}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ClusterError(f"cannot read kubeconfig {path}: {_short(exc)}") from None
    return Cluster(api, namespace or current_ns or "default",
                   str(getattr(api.configuration, "host", "")))


def _kubeconfig_namespace(config: Any, path: str, context: str | None) -> str:
    try:
        contexts, active = config.list_kube_config_contexts(config_file=path)
    except Exception:  # the client's own parse already succeeded; a namespace is optional
        return ""
    chosen = next((c for c in contexts if c.get("name") == context), active) if context else active
    return str(((chosen or {}).get("context") or {}).get("namespace") or "")


def _incluster_namespace() -> str:
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace",
                  encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return ""


__all__ = ["Cluster", "ClusterError", "Expired", "connect"]
