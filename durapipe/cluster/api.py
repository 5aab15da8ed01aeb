"""Talking to a cluster: `durapipe submit`, `status` and `watch`.

The only module that imports the ``kubernetes`` client (the ``cluster`` extra), and only when a
command runs.  Every failure of the client (no kubeconfig, an API server that does not answer,
a missing object, RBAC, an answer that is not what the API promises) becomes a
``ClusterError`` carrying one sentence for the user; nothing of the client's exception types
leaks past this module.

Every request is bounded: ``CONNECT_TIMEOUT_S`` to connect, ``READ_TIMEOUT_S`` of silence, and
``REQUEST_DEADLINE_S`` in all, which stops a server that answers a byte at a time (per-read
timeouts never fire on one).  The deadline is a ``SIGALRM`` timer, so it needs the main thread
of a POSIX process (the command line always is); elsewhere the two timeouts still bound a
server that says nothing.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

GROUP = "argoproj.io"
VERSION = "v1alpha1"
#: JobSet, which the multi-node stages create (its restarts are not in the Workflow).
JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
PLURALS = {"Workflow": "workflows", "WorkflowTemplate": "workflowtemplates",
           "CronWorkflow": "cronworkflows"}
T = TypeVar("T")

#: Seconds to wait for the TCP connection to the API server.
CONNECT_TIMEOUT_S = 10.0
#: Seconds the API server may stay silent during a request before it is given up.
READ_TIMEOUT_S = 30.0
#: Seconds one request may take in all, however its answer trickles in.
REQUEST_DEADLINE_S = 60.0
#: Seconds a watch may stay silent past the timeout it asked the server for (after which the
#: server ends it): longer, the connection is dead.  A watch still running as long again
#: after that is a server that does not end it.
WATCH_SILENCE_S = 15.0
#: HTTP statuses that say "try again later" (overload, a restarting API server or proxy).
_TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
#: What the client raises on an answer it cannot parse (not JSON, an unknown charset, an event
#: without a type, JSON nested deeper than the parser goes).
_MALFORMED = (ValueError, LookupError, TypeError, RecursionError)


class ClusterError(Exception):
    """A failure to report as one line (and exit 1), never as a traceback.

    ``status`` is the HTTP status where the server gave one; ``transient`` says that the same
    request may well succeed later (the server unreachable or too slow, a 5xx), which is what
    `durapipe watch` reconnects on."""

    def __init__(self, message: str, *, status: int | None = None,
                 transient: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.transient = transient


class _DeadlinePassed(BaseException):
    """Raised by the ``SIGALRM`` handler into a request that ran past its deadline: a
    BaseException, so that no ``except Exception`` in the client swallows it (the client's
    own cleanup still closes the connection)."""


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise ``_DeadlinePassed`` in the body once ``seconds`` have passed."""
    if seconds <= 0:
        raise _DeadlinePassed()
    if not hasattr(signal, "setitimer") or threading.current_thread() is not \
            threading.main_thread():
        yield
        return

    def expire(_signum: int, _frame: object) -> None:
        raise _DeadlinePassed()

    previous = signal.signal(signal.SIGALRM, expire)
    started = time.monotonic()
    outer_delay, outer_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
        if outer_delay:  # someone else's timer was running: let it go on
            signal.setitimer(signal.ITIMER_REAL,
                             max(outer_delay - (time.monotonic() - started), 0.001),
                             outer_interval)


def client_module() -> Any:
    try:
        import kubernetes
    except ImportError as exc:
        from durapipe.extras import install_hint

        raise ClusterError(
            f"this command needs the `cluster` extra ({exc.name} is missing): "
            f"{install_hint('cluster')}") from None
    return kubernetes


@dataclass
class Cluster:
    """A connection to one API server, in one namespace."""

    api: Any
    namespace: str
    server: str

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` within the timeouts and the deadline, its client exceptions
        turned into a ``ClusterError`` that names ``what`` was being done."""
        kwargs.setdefault("_request_timeout", (CONNECT_TIMEOUT_S, READ_TIMEOUT_S))
        deadline_s = REQUEST_DEADLINE_S
        try:
            with _deadline(deadline_s):
                return fn(*args, **kwargs)
        except _DeadlinePassed:
            raise self._late(what, deadline_s) from None
        except Exception as exc:
            raise self.translate(what, exc) from None

    def translate(self, what: str, exc: Exception,
                  read_timeout_s: float | None = None) -> Exception:
        """The ``ClusterError`` for one of the client's exceptions; anything else unchanged."""
        import http.client

        import urllib3

        kubernetes = client_module()
        if isinstance(exc, kubernetes.client.exceptions.ApiException):
            status = exc.status if isinstance(exc.status, int) else None
            return ClusterError(self._api_message(what, exc), status=status,
                                transient=status in _TRANSIENT_STATUSES)
        if isinstance(exc, (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError)):
            return self._network_error(what, exc, read_timeout_s or READ_TIMEOUT_S)
        if isinstance(exc, _MALFORMED):
            return ClusterError(
                f"the API server at {self.server} sent an answer durapipe cannot read while "
                f"trying to {what} ({type(exc).__name__}: {_short(exc)})")
        return exc

    def _network_error(self, what: str, exc: Exception, read_timeout_s: float) -> ClusterError:
        import urllib3

        errors = urllib3.exceptions
        # MaxRetryError says what went wrong in ``reason``.
        cause = exc.reason if isinstance(exc, errors.MaxRetryError) and exc.reason else exc
        if isinstance(cause, errors.ReadTimeoutError) or (
                isinstance(cause, TimeoutError) and not isinstance(cause, errors.HTTPError)):
            return ClusterError(
                f"the Kubernetes API server at {self.server} did not answer within "
                f"{read_timeout_s:g} s while trying to {what}", transient=True)
        if isinstance(cause, errors.ConnectTimeoutError) and not isinstance(
                cause, errors.NewConnectionError):
            return ClusterError(
                f"cannot reach the Kubernetes API server at {self.server} while trying to "
                f"{what}: no connection within {CONNECT_TIMEOUT_S:g} s", transient=True)
        return ClusterError(
            f"cannot reach the Kubernetes API server at {self.server} while trying to "
            f"{what}: {_short(exc)}", transient=True)

    def _late(self, what: str, deadline_s: float) -> ClusterError:
        return ClusterError(
            f"no complete answer from the Kubernetes API server at {self.server} within "
            f"{deadline_s:g} s while trying to {what} (it answers too slowly, or only in "
            "part)", transient=True)

    def _api_message(self, what: str, exc: Any) -> str:
        status = getattr(exc, "status", None)
        detail = str(getattr(exc, "reason", "") or _short(exc))  # the HTTP reason phrase
        try:
            body = json.loads(exc.body or "{}")
        except (TypeError, ValueError, RecursionError):
            body = None
        if isinstance(body, Mapping) and body.get("message"):
            detail = str(body["message"])
        if not status:
            # The client's own refusal of the answer (a content type it does not read, TLS).
            reason = ": ".join(detail.splitlines())
            return f"no usable answer from the Kubernetes API server at {self.server} while " \
                   f"trying to {what}: {reason[:300]}"
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

    def _object(self, what: str, answer: object) -> dict[str, Any]:
        """``answer`` if it is a JSON object, as every answer of the API is."""
        if not isinstance(answer, dict):
            raise ClusterError(
                f"the API server at {self.server} answered `{what}` with something that is "
                f"not a Kubernetes object: {_excerpt(answer)}")
        return answer

    # -- the objects ----------------------------------------------------------------------

    def _custom(self) -> Any:
        return client_module().client.CustomObjectsApi(self.api)

    def get(self, kind: str, name: str) -> dict[str, Any]:
        what = f"get {kind} {name}"
        return self._object(what, self.call(
            what, self._custom().get_namespaced_custom_object,
            GROUP, VERSION, self.namespace, PLURALS[kind], name))

    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        kind = str(body["kind"])
        name = body["metadata"].get("name") or body["metadata"].get("generateName", "") + "*"
        what = f"create {kind} {name}"
        return self._object(what, self.call(
            what, self._custom().create_namespaced_custom_object,
            GROUP, VERSION, self.namespace, PLURALS[kind], dict(body)))

    def apply(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create ``body`` or replace the object of its name (templates, cron workflows)."""
        kind, name = str(body["kind"]), str(body["metadata"]["name"])
        try:
            current = self.get(kind, name)
        except ClusterError as exc:
            if exc.status != 404:
                raise
            return self.create(body)
        replaced = dict(body)
        replaced["metadata"] = {**body["metadata"], "resourceVersion": resource_version(current)}
        what = f"replace {kind} {name}"
        return self._object(what, self.call(
            what, self._custom().replace_namespaced_custom_object,
            GROUP, VERSION, self.namespace, PLURALS[kind], name, replaced))

    def list_objects(self, kind: str, label_selector: str = "") -> list[dict[str, Any]]:
        """The objects of ``kind`` in the namespace matching ``label_selector``."""
        what = f"list {kind}s" + (f" labelled {label_selector}" if label_selector else "")
        answer = self._object(what, self.call(
            what, self._custom().list_namespaced_custom_object,
            GROUP, VERSION, self.namespace, PLURALS[kind], label_selector=label_selector))
        items = answer.get("items")
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise ClusterError(f"the API server at {self.server} answered `{what}` with a list "
                               f"that holds no objects: {_excerpt(items)}")
        return items

    def list_jobsets(self, label_selector: str) -> list[dict[str, Any]]:
        """The namespace's JobSets matching ``label_selector`` (multi-node stages' pods)."""
        what = f"list JobSets labelled {label_selector}"
        answer = self._object(what, self.call(
            what, self._custom().list_namespaced_custom_object,
            JOBSET_GROUP, JOBSET_VERSION, self.namespace, "jobsets",
            label_selector=label_selector))
        items = answer.get("items")
        if not isinstance(items, list):
            raise ClusterError(f"the API server at {self.server} answered `{what}` with "
                               f"something that is not a list: {_excerpt(items)}")
        return [i for i in items if isinstance(i, dict)]

    def merge_patch(self, kind: str, name: str, patch: Mapping[str, Any],
                    what: str | None = None) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386) of the named object: custom resources take no
        strategic merge, and a merge patch changes only the keys it names."""
        what = what or f"patch {kind} {name}"
        return self._object(what, self.call(
            what, self._custom().patch_namespaced_custom_object,
            GROUP, VERSION, self.namespace, PLURALS[kind], name, dict(patch),
            _content_type="application/merge-patch+json"))

    def delete(self, kind: str, name: str) -> None:
        what = f"delete {kind} {name}"
        self.call(what, self._custom().delete_namespaced_custom_object,
                  GROUP, VERSION, self.namespace, PLURALS[kind], name)

    def core(self) -> Any:
        return client_module().client.CoreV1Api(self.api)

    def pods(self, label_selector: str) -> list[dict[str, Any]]:
        """The pods matching ``label_selector``, as plain JSON objects."""
        what = f"list pods labelled {label_selector}"
        answer = self.call(what, self.core().list_namespaced_pod, self.namespace,
                           label_selector=label_selector, _preload_content=False)
        listed = self._object(what, _json_answer(self, what, answer))
        items = listed.get("items")
        return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []

    def pod_events(self, reason: str) -> dict[str, str]:
        """The newest message of the namespace's Events with ``reason`` about each pod, by
        pod name (Events outlive the pods they are about, for an hour by default)."""
        what = f"list the Events of pods with reason {reason}"
        answer = self.call(what, self.core().list_namespaced_event, self.namespace,
                           field_selector=f"involvedObject.kind=Pod,reason={reason}",
                           _preload_content=False)
        listed = self._object(what, _json_answer(self, what, answer))
        items = listed.get("items")
        newest: dict[str, tuple[str, str]] = {}
        for event in items if isinstance(items, list) else []:
            if not isinstance(event, dict):
                continue
            pod = (event.get("involvedObject") or {}).get("name")
            when = str(event.get("lastTimestamp") or event.get("eventTime") or "")
            if isinstance(pod, str) and (pod not in newest or when >= newest[pod][0]):
                newest[pod] = (when, str(event.get("message") or ""))
        return {pod: message for pod, (_, message) in newest.items()}

    def pod_log(self, pod: str, container: str) -> str:
        what = f"read the log of pod {pod} (container {container})"
        answer = self.call(what, self.core().read_namespaced_pod_log, pod, self.namespace,
                           container=container, _preload_content=False)
        return bytes(answer.data).decode("utf-8", "replace")

    def follow_pod_log(self, pod: str, container: str) -> Iterator[str]:
        """The log's lines as the container writes them, until it ends.  No read timeout and no
        deadline: a training stage may print nothing for hours and run for days."""
        what = f"follow the log of pod {pod} (container {container})"
        core = self.core()
        # Clients from v36 on validate their arguments with pydantic, which refuses a
        # (connect, None) pair although their REST layer reads it as "no read timeout"; the
        # undecorated method (``raw_function``; older clients have none) takes it as they did.
        read_log = getattr(type(core).read_namespaced_pod_log, "raw_function", None)
        try:
            if read_log is None:
                answer = core.read_namespaced_pod_log(
                    pod, self.namespace, container=container, follow=True,
                    _preload_content=False, _request_timeout=(CONNECT_TIMEOUT_S, None))
            else:
                answer = read_log(core, pod, self.namespace, container=container, follow=True,
                                  _preload_content=False,
                                  _request_timeout=(CONNECT_TIMEOUT_S, None))
        except Exception as exc:
            raise self.translate(what, exc) from None
        pending = b""
        try:
            for chunk in answer.stream(4096, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.decode("utf-8", "replace")
        except Exception as exc:
            raise self.translate(what, exc) from None
        finally:
            answer.release_conn()
        if pending:
            yield pending.decode("utf-8", "replace")

    def config_map_data(self, name: str, namespace: str) -> dict[str, Any]:
        """The ``data`` of a ConfigMap in ``namespace`` (Argo's memoization caches live in
        its controller's namespace, not the run's)."""
        what = f"read ConfigMap {namespace}/{name}"
        answer = self.call(what, self.core().read_namespaced_config_map, name, namespace,
                           _preload_content=False)
        obj = self._object(what, _json_answer(self, what, answer))
        data = obj.get("data")
        return data if isinstance(data, dict) else {}

    def ensure_core(self, body: Mapping[str, Any]) -> None:
        """Create a core object the pipeline's pods need (the runtime's ConfigMap) unless one
        of its name exists: such objects are named by their content, so the name says it all."""
        kubernetes = client_module()
        kind, name = str(body["kind"]), str(body["metadata"]["name"])
        create = {"ConfigMap": "create_namespaced_config_map"}.get(kind)
        if create is None:
            raise ClusterError(f"durapipe submit does not create {kind} objects ({name}); "
                               "apply them with kubectl or your GitOps tool")
        core = kubernetes.client.CoreV1Api(self.api)
        try:
            self.call(f"create {kind} {name}", getattr(core, create), self.namespace, dict(body))
        except ClusterError as exc:
            if exc.status != 409:
                raise

    def watch_workflow(self, name: str, resource_version: str,
                       timeout_s: int) -> Iterator[tuple[str, dict[str, Any]]]:
        """(event type, object) for the named Workflow from ``resource_version`` on, until the
        server ends the watch (after ``timeout_s``) or the version expires (HTTP 410, raised as
        ``Expired``).  Silence ``WATCH_SILENCE_S`` past that, or a watch still running twice
        as long past it, is a dead connection (a transient ``ClusterError``)."""
        kubernetes = client_module()
        what = f"watch Workflow {name}"
        silence_s = timeout_s + WATCH_SILENCE_S
        watcher = kubernetes.watch.Watch()
        stream = watcher.stream(
            self._custom().list_namespaced_custom_object, GROUP, VERSION, self.namespace,
            "workflows", field_selector=f"metadata.name={name}",
            resource_version=resource_version, timeout_seconds=timeout_s,
            allow_watch_bookmarks=True, _request_timeout=(CONNECT_TIMEOUT_S, silence_s))
        try:
            for event in self._guarded(what, stream, silence_s + WATCH_SILENCE_S, silence_s):
                kind, obj = self._event(what, event)
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Expired()
                    raise ClusterError(f"watching Workflow {name} failed: {_excerpt(obj)}")
                yield kind, obj
        finally:
            watcher.stop()

    def _event(self, what: str, event: object) -> tuple[str, dict[str, Any]]:
        """(type, object) of one event of the watch stream, as the API defines them."""
        if not isinstance(event, Mapping):  # the client yields ``None`` for a line not JSON
            raise ClusterError(f"the API server at {self.server} sent a line that is not a JSON "
                               f"event while trying to {what}")
        kind, obj = event.get("type"), event.get("object")
        if kind not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR") or \
                not isinstance(obj, dict):
            raise ClusterError(f"the API server at {self.server} sent a watch event that is "
                               f"not one while trying to {what}: type {_excerpt(kind)}, "
                               f"object {_excerpt(obj)}")
        return str(kind), obj

    def _guarded(self, what: str, stream: Iterator[T], deadline_s: float,
                 read_timeout_s: float) -> Iterator[T]:
        kubernetes = client_module()
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                with _deadline(deadline - time.monotonic()):
                    item = next(stream)
            except StopIteration:
                return
            except _DeadlinePassed:
                raise self._late(what, deadline_s) from None
            except kubernetes.client.exceptions.ApiException as exc:
                if exc.status == 410:
                    raise Expired() from None
                raise self.translate(what, exc) from None
            except Exception as exc:
                raise self.translate(what, exc, read_timeout_s) from None
            yield item


def _json_answer(cluster: Cluster, what: str, answer: Any) -> object:
    try:
        return json.loads(bytes(answer.data))
    except (TypeError, ValueError, RecursionError):
        raise ClusterError(f"the API server at {cluster.server} answered `{what}` with "
                           "something that is not JSON") from None


class Expired(Exception):
    """The watch's resource version is too old: list again and watch from there."""


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _excerpt(value: object) -> str:
    """The start of an unexpected answer, for the message that refuses it."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def resource_version(obj: Mapping[str, Any]) -> str:
    """The object's ``metadata.resourceVersion``, ``""`` where it has none."""
    meta = obj.get("metadata")
    return str(meta.get("resourceVersion") or "") if isinstance(meta, Mapping) else ""


def connect(kubeconfig: str | None, context: str | None, namespace: str | None) -> Cluster:
    """A client from the kubeconfig (``--kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``),
    or the pod's service account when running inside a cluster."""
    import os

    kubernetes = client_module()
    # A kubeconfig that says insecure-skip-tls-verify has chosen it; kubectl stays silent then,
    # and urllib3's warning on every request would bury durapipe's own one-line messages.
    import warnings

    warnings.filterwarnings("ignore", message="Unverified HTTPS request")
    config = kubernetes.config
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or os.path.expanduser(
        "~/.kube/config")
    settings = kubernetes.client.Configuration()
    # One try per request: urllib3 would try a silent server three more times, making each
    # timeout four times as long; `watch` reconnects on its own, and says so.
    settings.retries = 0
    try:
        if kubeconfig is None and not os.path.exists(path) and os.environ.get(
                "KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=settings)
            api = kubernetes.client.ApiClient(settings)
            current_ns = _incluster_namespace()
        else:
            if not os.path.exists(path):
                raise ClusterError(
                    f"no kubeconfig: {path} does not exist; pass --kubeconfig FILE or set "
                    "KUBECONFIG")
            api = config.new_client_from_config(config_file=path, context=context,
                                                client_configuration=settings)
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


__all__ = ["Cluster", "ClusterError", "Expired", "connect", "resource_version"]
