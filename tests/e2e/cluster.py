"""A real Kubernetes control plane with Argo's workflow-controller, on 127.0.0.1, for e2e tests.

``Cluster.start(state_dir)`` builds (or reuses, see ``tests/argo/argo_tools.py``) etcd,
kube-apiserver, kube-scheduler, kube-controller-manager (``tools/cluster/k8s``), Argo v4.1.2's
workflow-controller (``tools/cluster/argo``, from ``../shared``), JobSet v0.12.0's controller
(``tools/cluster/jobset``, from ``../shared``), Kueue v0.17.0's controller (``tools/cluster/kueue``,
started by ``kueue.py`` for the cases that queue) and KWOK (``tools/cluster/kwok``), and starts
them with free ports and all state under ``state_dir``:

- etcd, plain HTTP on 127.0.0.1;
- kube-apiserver with a token file (one admin token in ``system:masters``), RBAC, service-account
  keys made with openssl, serving certificates it generates into ``--cert-dir``;
- kube-scheduler and kube-controller-manager (service accounts and their tokens, garbage
  collection, Jobs, namespaces) as the admin user;
- Argo's CRDs, RBAC, ServiceAccount and ConfigMap from ``../shared/argo/v4.1.2/manifests``
  (applied server-side), and the workflow-controller authenticated as its own ``argo``
  ServiceAccount (a TokenRequest token), so Argo's RBAC is what grants it access;
- JobSet's CRD, RBAC and webhook configurations (its ``config/components``, the webhooks
  pointed at ``https://127.0.0.1:<port>`` with a CA made by openssl), and its controller as its
  own ServiceAccount, leader election on a Lease, metrics off, health on 127.0.0.1;
- KWOK, playing the kubelets of the fake nodes (``nodes.py``) with its default Stages but the
  one that completes every Job's pod at once.

``stop()`` ends every process it started (SIGTERM, then SIGKILL) and waits for each. What is real
and what is played is described in docs/argo-harness.md.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from argo.argo_tools import (
    ToolError,
    argo_source_or_skip,
    build_go_command,
    cache_root,
    go_module_dir,
    go_or_skip,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS = REPO_ROOT / "tools"
#: tools/cluster/<module> -> {binary name: Go package}
COMMANDS: dict[str, dict[str, str]] = {
    "cluster/k8s": {
        "etcd": "go.etcd.io/etcd/server/v3",
        "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
        "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
        "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
        "kubelet": "k8s.io/kubernetes/cmd/kubelet",
    },
    "cluster/kwok": {"kwok": "sigs.k8s.io/kwok/cmd/kwok"},
    "cluster/argo": {
        "workflow-controller": "github.com/argoproj/argo-workflows/v4/cmd/workflow-controller",
    },
    "cluster/jobset": {"jobset-controller": "sigs.k8s.io/jobset"},
    # Started only when a case needs it (tests/e2e/kueue.py).
    "cluster/kueue": {"kueue-controller":
                      "github.com/durapipe/durapipe/tools/cluster/kueue/cmd/kueue-e2e"},
    # The real node's cluster DNS (tests/e2e/realnode.py): CoreDNS with its kubernetes plugin.
    "cluster/coredns": {"coredns":
                        "github.com/durapipe/durapipe/tools/cluster/coredns/cmd/coredns-e2e"},
}
ADMIN_TOKEN = "durapipe-e2e-admin"
#: The real node (tests/e2e/realnode.py): its name and its kubelet's API token.
REAL_NODE_NAME = "durapipe-real"
NODE_TOKEN = "durapipe-e2e-node"
ARGO_NAMESPACE = "argo"
JOBSET_NAMESPACE = "jobset-system"
#: The ServiceAccount JobSet's config/ runs its manager as (``controller-manager`` there, with
#: the ``jobset-`` name prefix of its release manifests).
JOBSET_ACCOUNT = "jobset-controller-manager"


def build_binaries() -> dict[str, Path]:
    """Every control-plane binary, built once per version of tools/cluster and cached."""
    go_or_skip()
    argo_dir = TOOLS / "cluster" / "argo"
    argo_source_or_skip(argo_dir)
    jobset_source_or_skip()
    loopback = argo_dir / "loopback" / "zz_durapipe_loopback.go"
    overlay = {str(go_module_dir(argo_dir) / "cmd" / "workflow-controller" / loopback.name):
               loopback}
    # The version the binaries report (the kubelet's node status, the API server's /version),
    # as Kubernetes' own release build stamps it; without it they say v0.0.0-master.
    stamp = f"-X k8s.io/component-base/version.gitVersion={kubernetes_version()}"
    overlays = {"workflow-controller": overlay, "kueue-controller": kueue_overlay()}
    out: dict[str, Path] = {}
    for tool, commands in COMMANDS.items():
        for name, pkg in commands.items():
            out[name] = build_go_command(
                tool, name, pkg, overlays.get(name),
                ldflags=stamp if tool == "cluster/k8s" else "")
    return out


#: The one line of Kueue v0.17.0's cmd/kueue/main.go the e2e build changes (see
#: tools/cluster/kueue/cmd/kueue-e2e/zz_durapipe_metrics_certs.go).
KUEUE_METRICS_LINE = 'metricsCertPath := "/etc/kueue/metrics/certs"'


def kueue_overlay() -> dict[str, Path]:
    """Kueue's main.go with its fixed metrics certificate directory read from the environment,
    put by ``go build -overlay`` beside the function that reads it (our cmd/kueue-e2e)."""
    kueue_dir = TOOLS / "cluster" / "kueue"
    main_go = go_module_dir(kueue_dir, "sigs.k8s.io/kueue") / "cmd" / "kueue" / "main.go"
    text = main_go.read_text()
    if text.count(KUEUE_METRICS_LINE) != 1:
        raise ToolError(f"{main_go} no longer has the line the e2e build changes: "
                        f"{KUEUE_METRICS_LINE}")
    patched = text.replace(KUEUE_METRICS_LINE, "metricsCertPath := durapipeMetricsCertPath()")
    digest = hashlib.sha256(patched.encode()).hexdigest()[:16]
    out = cache_root() / "kueue-overlay" / digest / "main.go"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(patched)
        tmp.replace(out)
    return {str(kueue_dir / "cmd" / "kueue-e2e" / "main.go"): out}


def kubernetes_version() -> str:
    """The ``k8s.io/kubernetes`` version tools/cluster/k8s requires (v1.35.4)."""
    for line in (TOOLS / "cluster" / "k8s" / "go.mod").read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["k8s.io/kubernetes"] and len(parts) >= 2:
            return parts[1]
    raise ToolError("tools/cluster/k8s/go.mod does not require k8s.io/kubernetes")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(what: str, ready: Callable[[], bool], timeout: float,
          alive: Callable[[], str | None] = lambda: None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        died = alive()
        if died:
            raise ToolError(f"{what}: {died}")
        try:
            if ready():
                return
        except (OSError, urllib.error.URLError, ssl.SSLError):
            pass
        time.sleep(0.25)
    raise ToolError(f"{what} not ready after {timeout:.0f} s")


def _parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child die with the process that started it (Linux's
    ``PR_SET_PDEATHSIG``), or None where libc's ``prctl`` is not there.

    Set in the child between fork and exec, so by the time ``Popen`` returns the signal is
    armed.  ``setpriv --pdeathsig`` armed it only once setpriv itself ran: a parent killed in
    that window (a loaded CI machine) left the child running for good.  The parent may also
    die between the fork and the ``prctl``; the child then sees another parent and exits."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        prctl = ctypes.CDLL(name, use_errno=True).prctl if name else None
    except (OSError, AttributeError):
        prctl = None
    if prctl is None:
        return None
    pr_set_pdeathsig = 1
    parent = os.getpid()

    def arm() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return arm


#: Makes a process die with the one that started it; where it is missing, teardown and atexit
#: are all there is.
_DIE_WITH_PARENT = _parent_death_signal()


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


def spawn(name: str, args: list[str], cwd: Path, env: dict[str, str]) -> Proc:
    """Start ``args`` with its output in ``cwd/logs/<name>.log`` (appended to: a process started
    again keeps its first life's log)."""
    log = cwd / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        # start_new_session: a signal to the pytest process group does not reach these
        # before stop() does, and stop() signals each one by its own pid only.  A pytest
        # killed outright (CI's timeout, a SIGTERM) runs no teardown: the kernel then
        # kills them, by the parent-death signal armed before the binary is executed.
        # The kernel's "parent" is the thread that forks, so only the main thread's
        # children can die with it (a helper thread's would die when that thread ends).
        main = threading.current_thread() is threading.main_thread()
        popen = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                 start_new_session=True,
                                 preexec_fn=_DIE_WITH_PARENT if main else None)
    return Proc(name, popen, log)


def died(proc: Proc) -> Callable[[], str | None]:
    """For ``_wait``: the reason ``proc`` is gone, or None while it runs."""
    def check() -> str | None:
        rc = proc.popen.poll()
        return None if rc is None else f"exited {rc}:\n{proc.tail()}"
    return check


@dataclass
class Cluster:
    state: Path
    bins: dict[str, Path]
    procs: list[Proc] = field(default_factory=list)
    api_port: int = 0
    kubeconfig: Path = Path()
    timings: dict[str, float] = field(default_factory=dict)
    jobset_webhook_port: int = 0
    jobset_health_port: int = 0
    #: Where the API server listens: loopback for KWOK nodes only; the machine's own interface
    #: address once a real node joins (the kubelet refuses a loopback node IP, and pods cannot
    #: reach loopback services: the kubelet drops traffic to 127.0.0.0/8 from other sources).
    address: str = "127.0.0.1"
    #: Settings merged into Argo's workflow-controller ConfigMap over CONTROLLER_CONFIG.
    controller_config: dict[str, str] = field(default_factory=dict)
    #: Environment added to the workflow-controller's (``ARGO_PPROF=true`` serves Go's
    #: profiler beside /healthz on 127.0.0.1:6060: benchmarks/fleet_scale.py --profile).
    controller_env: dict[str, str] = field(default_factory=dict)

    # -- processes ------------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = spawn(name, args, self.state, env or _base_env())
        self.procs.append(proc)
        return proc

    def _died(self, proc: Proc) -> Callable[[], str | None]:
        return died(proc)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in reversed(self.procs):
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait(timeout=10)

    def alive(self) -> list[str]:
        return [p.name for p in self.procs if p.popen.poll() is None]

    # -- API access -----------------------------------------------------------------------------
    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.api_port}"

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["kubectl", "--kubeconfig", str(self.kubeconfig), *args],
                              input=input, capture_output=True, text=True, timeout=timeout,
                              check=False)
        if check and proc.returncode != 0:
            raise ToolError(f"kubectl {' '.join(args)} failed:\n{proc.stderr}")
        return proc

    def apply(self, docs: Iterable[dict[str, Any]] | str, field_manager: str = "durapipe-e2e",
              namespace: str | None = None, timeout: float = 300) -> None:
        """Server-side apply, as Argo CD does."""
        text = docs if isinstance(docs, str) else yaml.safe_dump_all(list(docs))
        args = ["apply", "--server-side", f"--field-manager={field_manager}",
                "--force-conflicts", "-f", "-"]
        if namespace:
            args[1:1] = ["-n", namespace]
        self.kubectl(*args, input=text, timeout=timeout)

    def _get(self, path: str) -> Any:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        req = urllib.request.Request(self.server + path,
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        with urllib.request.urlopen(req, context=ctx, timeout=5) as resp:
            body = resp.read()
        return json.loads(body) if body.startswith(b"{") else body.decode()

    # -- start ----------------------------------------------------------------------------------
    @classmethod
    def start(cls, state: Path, bins: dict[str, Path] | None = None, *,
              address: str = "127.0.0.1",
              controller_config: dict[str, str] | None = None,
              controller_env: dict[str, str] | None = None) -> Cluster:
        t0 = time.monotonic()
        cluster = cls(state=state, bins=bins or build_binaries(), address=address,
                      controller_config=dict(controller_config or {}),
                      controller_env=dict(controller_env or {}))
        cluster.timings["build"] = time.monotonic() - t0
        # Should the test process end without its fixtures' teardown (an interrupt), still stop
        # every process (they run in sessions of their own, so no signal reaches them).
        atexit.register(cluster.stop)
        cluster.timings["t0"] = time.monotonic()  # the other absolute marks count from here
        try:
            cluster._start()
        except BaseException:
            cluster.stop()
            raise
        cluster.timings["start"] = time.monotonic() - t0 - cluster.timings["build"]
        return cluster

    def _start(self) -> None:
        st = self.state
        pki = st / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        subprocess.run(["openssl", "genrsa", "-out", str(pki / "sa.key"), "2048"],
                       check=True, capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", str(pki / "sa.key"), "-pubout",
                        "-out", str(pki / "sa.pub")], check=True, capture_output=True)
        # The node token authenticates a real node's kubelet as its Node (the Node authorizer
        # lets it read only what its own pods mount); unused while only KWOK plays nodes.
        (pki / "tokens.csv").write_text(
            f'{ADMIN_TOKEN},admin,admin-uid,"system:masters"\n'
            f'{NODE_TOKEN},system:node:{REAL_NODE_NAME},node-uid,"system:nodes"\n')
        _kubelet_client_cert(pki)

        etcd_port, peer_port = free_port(), free_port()
        etcd = self._spawn("etcd", [
            str(self.bins["etcd"]), "--name=e2e", f"--data-dir={st / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=e2e=http://127.0.0.1:{peer_port}",
            # Test state: losing it on a crash costs nothing, and fsync is most of etcd's latency.
            "--unsafe-no-fsync", "--log-level=warn",
        ])
        _wait("etcd", lambda: b"true" in urllib.request.urlopen(
            f"http://127.0.0.1:{etcd_port}/health", timeout=2).read(), 60, self._died(etcd))
        self.timings["etcd"] = time.monotonic()

        self.api_port = free_port()
        api = self._spawn("kube-apiserver", [
            str(self.bins["kube-apiserver"]),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            f"--bind-address={self.address}", f"--advertise-address={self.address}",
            f"--secure-port={self.api_port}", f"--cert-dir={pki}",
            f"--token-auth-file={pki / 'tokens.csv'}", "--authorization-mode=Node,RBAC",
            # How `kubectl logs` reaches a real kubelet, which admits no anonymous client.
            f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'kubelet-client.key'}",
            # No DNS here: reach a kubelet at its node's address, never by its name.
            "--kubelet-preferred-address-types=InternalIP",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range=10.96.0.0/16",
            # No kube-proxy routes the `kubernetes` Service (and on loopback its Endpoints would
            # be refused): pods reach the API server at its address (executor.env).
            "--endpoint-reconciler-type=none",
            "--enable-priority-and-fairness=false",
            "--v=0",
        ])
        _wait("kube-apiserver", lambda: self._get("/readyz") == "ok", 120, self._died(api))
        self.timings["apiserver"] = time.monotonic()

        self.kubeconfig = st / "admin.kubeconfig"
        self.kubeconfig.write_text(_kubeconfig(self.server, ADMIN_TOKEN, "default"))
        common = [f"--kubeconfig={self.kubeconfig}", "--bind-address=127.0.0.1",
                  "--leader-elect=false", "--v=0"]
        self._spawn("kube-scheduler", [str(self.bins["kube-scheduler"]), *common,
                                       f"--secure-port={free_port()}"])
        self._spawn("kube-controller-manager", [
            str(self.bins["kube-controller-manager"]), *common, f"--secure-port={free_port()}",
            "--controllers=serviceaccount-controller,serviceaccount-token-controller,"
            "garbage-collector-controller,job-controller,namespace-controller,"
            "ttl-after-finished-controller,pod-garbage-collector-controller,"
            # Lifts the not-ready taint the API server puts on every new node (TaintNodesByCondition)
            # once the node reports Ready, as in any cluster; without it no pod is ever placed.
            "node-lifecycle-controller,"
            # Publishes kube-root-ca.crt into every namespace: without it a real kubelet never
            # mounts a projected service-account token, and pods stay in ContainerCreating.
            "root-ca-certificate-publisher-controller,"
            # The EndpointSlices that cluster DNS answers from: a headless Service's pods by
            # hostname (a JobSet's pod 0, torchrun's master address; tests/e2e/realnode.py).
            "endpointslice-controller",
            f"--root-ca-file={pki / 'apiserver.crt'}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            "--use-service-account-credentials=false",
        ])

        # JobSet's install runs beside Argo's (its CRD, RBAC and webhooks are independent of
        # Argo's, and the API server is mostly waiting on Argo's 12 MB of CRD schema).
        jobset_start: dict[str, Any] = {}
        installer = threading.Thread(target=self._start_jobset, args=(jobset_start,),
                                     daemon=True)
        installer.start()
        try:
            wc = self._start_argo()
        finally:
            # Before any stop(): a controller the thread spawned later would outlive it.
            installer.join()
        if "error" in jobset_start:
            raise jobset_start["error"]
        jobset = self._spawn("jobset-controller", *jobset_start["spawn"])

        kwok_home = st / "kwok-home"  # KWOK reads ~/.kwok/kwok.yaml: keep the user's out of it
        kwok_home.mkdir(exist_ok=True)
        stages = st / "kwok-stages.yaml"
        stages.write_text(kwok_stages())
        kwok = self._spawn("kwok", [
            str(self.bins["kwok"]), f"--kubeconfig={self.kubeconfig}", f"--config={stages}",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--server-address=127.0.0.1:{free_port()}", "--cidr=10.244.0.0/16",
            "--node-ip=127.0.0.1",
        ], env={**_base_env(), "HOME": str(kwok_home)})

        _wait("default ServiceAccount", lambda: self.kubectl(
            "get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0,
            60)
        # v4.1.2 logs the Lease event "<identity> became leader" once it leads.
        _wait("workflow-controller leader", lambda: "e2e-controller became leader" in
              wc.log.read_text(errors="replace"), 60, self._died(wc))
        if kwok.popen.poll() is not None:
            raise ToolError(f"kwok exited:\n{kwok.tail()}")
        # Ready once its webhook server serves (JobSet's own readyz check); leading once it
        # holds its Lease, after which its controllers reconcile.
        _wait("jobset-controller webhook", lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{self.jobset_health_port}/readyz", timeout=2).status == 200, 60,
            self._died(jobset))
        # client-go logs `"Successfully acquired lease" lock="jobset-system/jobset-e2e"`.
        _wait("jobset-controller leader", lambda: "successfully acquired lease" in
              jobset.log.read_text(errors="replace").lower(), 60, self._died(jobset))
        self.timings["jobset-ready"] = time.monotonic()

    def _start_argo(self) -> Proc:
        """Argo's CRDs and install, then its workflow-controller as a process."""
        st = self.state
        # Argo's full CRDs are 12 MB of schema: kubectl reads them itself (PyYAML would take a
        # minute), and the API server takes long to install them on a loaded machine.
        self.kubectl("apply", "--server-side", "--field-manager=durapipe-e2e",
                     "-k", str(argo_manifests() / "base" / "crds" / "full"), timeout=900)
        self.apply(argo_install_docs(self.controller_config))
        for crd in ("workflows.argoproj.io", "workflowtaskresults.argoproj.io",
                    "workflowtemplates.argoproj.io", "cronworkflows.argoproj.io"):
            self.wait_crd_established(crd, timeout=120)
        self.timings["argo-install"] = time.monotonic()

        # The controller runs as its ServiceAccount, so Argo's own RBAC decides what it may do.
        argo_kc = self.account_kubeconfig("argo", ARGO_NAMESPACE, st / "argo.kubeconfig")
        wc_env = _base_env()
        wc_env.update(LEADER_ELECTION_IDENTITY="e2e-controller",
                      # Short lease periods: a fresh controller leads within a second or two.
                      LEADER_ELECTION_LEASE_DURATION="4s", LEADER_ELECTION_RENEW_DEADLINE="3s",
                      LEADER_ELECTION_RETRY_PERIOD="1s", **self.controller_env)
        wc = self._spawn("workflow-controller", [
            str(self.bins["workflow-controller"]), f"--kubeconfig={argo_kc}",
            "--configmap=workflow-controller-configmap", "--loglevel=info",
            "--workflow-workers=8", "--qps=200", "--burst=400",
        ], env=wc_env)
        return wc

    def _start_jobset(self, out: dict[str, Any]) -> None:
        """JobSet's CRD, RBAC and webhook configurations, and the command line of its
        controller (spawned by the main thread, which it is to die with).

        The webhooks are JobSet's own (config/components/webhook) with the Service they name
        replaced by a URL on 127.0.0.1 and a CA the API server trusts (``caBundle``); the
        controller serves them with a certificate made here by openssl, since its internal
        certificate manager would write a Secret for a Service no pod backs."""
        try:
            out["spawn"] = self._install_jobset()
        except BaseException as exc:  # re-raised by _start in its own thread
            out["error"] = exc

    def _install_jobset(self) -> tuple[list[str], dict[str, str]]:
        st = self.state
        t0 = time.monotonic()
        pki = st / "jobset-pki"
        ca_pem = _webhook_certs(pki)
        self.jobset_webhook_port, self.jobset_health_port = free_port(), free_port()
        docs = jobset_install_docs(f"https://127.0.0.1:{self.jobset_webhook_port}", ca_pem)
        self.kubectl("apply", "--server-side", "--field-manager=durapipe-e2e",
                     "--force-conflicts", "-f", str(jobset_crd()), "-f", "-",
                     input=yaml.safe_dump_all(docs), timeout=300)
        self.wait_crd_established("jobsets.jobset.x-k8s.io")
        kc = self.account_kubeconfig(JOBSET_ACCOUNT, JOBSET_NAMESPACE, st / "jobset.kubeconfig")
        cfg = st / "jobset-config.yaml"
        cfg.write_text(yaml.safe_dump({
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
            # Out of cluster the lease needs its namespace named; short periods as for Argo.
            "leaderElection": {"leaderElect": True, "resourceNamespace": JOBSET_NAMESPACE,
                               "resourceName": "jobset-e2e", "leaseDuration": "4s",
                               "renewDeadline": "3s", "retryPeriod": "1s"},
            "internalCertManagement": {"enable": False},
            "webhook": {"host": "127.0.0.1", "port": self.jobset_webhook_port,
                        "certDir": str(pki)},
            # "0" turns the metrics server off (its default listens on :8443, every interface).
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.jobset_health_port}"},
        }))
        self.timings["jobset-install"] = time.monotonic() - t0
        return [
            str(self.bins["jobset-controller"]), f"--kubeconfig={kc}", f"--config={cfg}",
            "--zap-devel=false", "--zap-log-level=info",
        ], {**_base_env(), "KUBECONFIG": str(kc)}

    def wait_crd_established(self, crd: str, timeout: float = 60) -> None:
        # Not `kubectl wait`: read just after the apply, the CRD may have no conditions yet,
        # and kubectl then fails ("status.conditions accessor error") instead of waiting.
        _wait(f"CRD {crd} established", lambda: self.kubectl(
            "get", "crd", crd, "-o",
            'jsonpath={.status.conditions[?(@.type=="Established")].status}',
            check=False).stdout.strip() == "True", timeout)

    def account_kubeconfig(self, account: str, namespace: str, path: Path) -> Path:
        """A kubeconfig for a controller run out of cluster as its own ServiceAccount."""
        token = self.kubectl("create", "token", account, "-n", namespace,
                             "--duration=24h").stdout.strip()
        path.write_text(_kubeconfig(self.server, token, namespace))
        return path

    def ensure_namespace(self, name: str) -> None:
        self.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}])
        _wait(f"ServiceAccount default in {name}", lambda: self.kubectl(
            "get", "serviceaccount", "default", "-n", name, check=False).returncode == 0, 60)


def kwok_stages() -> str:
    """KWOK v0.8.0's own `fast` node and pod Stages (it refuses to start without any), read
    from its module source: nodes become Ready, scheduled pods Running, deleted pods go. Not
    its `pod-complete`, which ends every pod a Job owns at once with exit 0: a JobSet's pods
    end by the rules of fates.py like every other pod."""
    root = go_module_dir(TOOLS / "cluster" / "kwok", "sigs.k8s.io/kwok") / "kustomize" / "stage"
    files = [*sorted((root / "node" / "fast").glob("*.yaml")),
             *sorted((root / "pod" / "fast").glob("*.yaml"))]
    return "\n---\n".join(f.read_text() for f in files
                          if f.name not in ("kustomization.yaml", "pod-complete.yaml"))


def _base_env() -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "TMPDIR")
    return {k: os.environ[k] for k in keep if k in os.environ}


def _kubeconfig(server: str, token: str, namespace: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "e2e",
        "clusters": [{"name": "e2e", "cluster": {"server": server,
                                                  "insecure-skip-tls-verify": True}}],
        "users": [{"name": "e2e", "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e",
                                                  "namespace": namespace}}],
    })


#: The controller's configuration for the e2e cluster (merged into Argo's ConfigMap).
CONTROLLER_CONFIG: dict[str, str] = {
    # Metrics would listen on :9090 of every interface; nothing here listens beyond 127.0.0.1.
    "metricsConfig": "enabled: false\n",
    "telemetryConfig": "enabled: false\n",
    # Never contacted: no pod runs. Output artifacts need a repository to get a key.
    "artifactRepository": yaml.safe_dump({"s3": {
        "bucket": "acme-ml", "endpoint": "127.0.0.1:9", "insecure": True,
        "keyFormat": "{{workflow.name}}/{{pod.name}}"}}),
}


def argo_manifests() -> Path:
    return argo_source_or_skip(TOOLS / "cluster" / "argo").parent / "manifests"


def argo_install_docs(overrides: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Argo's cluster install from ../shared without its CRDs (applied on their own) and the
    controller's Deployment (we run the controller as a process), with the e2e settings in its
    ConfigMap."""
    manifests = argo_manifests() / "cluster-install-no-crds"
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise ToolError("kubectl is not installed")
    text = subprocess.run([kubectl, "kustomize", str(manifests)], capture_output=True,
                          text=True, check=True).stdout
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ARGO_NAMESPACE}}]
    for doc in yaml.safe_load_all(text):
        if not doc or doc["kind"] == "Deployment" or doc["metadata"]["name"].startswith(
                "argo-server"):
            continue
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == \
                "workflow-controller-configmap":
            doc["data"] = {**(doc.get("data") or {}), **CONTROLLER_CONFIG, **(overrides or {})}
        docs.append(doc)
    # Argo's ClusterRole only reads ConfigMaps; memoization writes its cache ConfigMaps, which
    # v4.1.2 keeps in the controller's own namespace whatever the workflow's (its cache factory
    # is made with the controller's namespace), so an operator grants that there and only there
    # (docs/cluster.md, "What the cluster needs"), and so does the e2e install.
    docs += [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "durapipe-memoization", "namespace": ARGO_NAMESPACE},
         "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                    "verbs": ["create", "update", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "durapipe-memoization", "namespace": ARGO_NAMESPACE},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "durapipe-memoization"},
         "subjects": [{"kind": "ServiceAccount", "name": "argo",
                       "namespace": ARGO_NAMESPACE}]},
    ]
    return docs


def jobset_source_or_skip() -> Path:
    """JobSet v0.12.0's module source, which tools/cluster/jobset's go.mod replaces JobSet with
    (the CRD beside it is the one installed)."""
    go_mod = (TOOLS / "cluster" / "jobset" / "go.mod").read_text()
    for line in go_mod.splitlines():
        parts = line.split()
        if parts[:3] == ["replace", "sigs.k8s.io/jobset", "=>"]:
            src = (TOOLS / "cluster" / "jobset" / parts[3]).resolve()
            if not (src / "go.mod").is_file():
                pytest.skip(f"JobSet's v0.12.0 source is not at {src} (../shared is absent); "
                            f"the e2e JobSet controller builds from it")
            return src
    raise ToolError("tools/cluster/jobset/go.mod does not replace sigs.k8s.io/jobset")


def jobset_crd() -> Path:
    return jobset_source_or_skip().parent / "jobset.x-k8s.io_jobsets.yaml"


def _kubelet_client_cert(pki: Path) -> None:
    """A CA and the API server's client certificate for kubelets (kubelet-client.crt/key);
    a real kubelet trusts kubelet-client-ca.crt for x509 client authentication."""
    def ssl_(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=pki)

    ssl_("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "kubelet-client-ca.key",
         "-out", "kubelet-client-ca.crt", "-days", "2", "-subj", "/CN=durapipe-e2e-kubelet-ca")
    ssl_("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "kubelet-client.key",
         "-out", "kubelet-client.csr", "-subj", "/CN=kube-apiserver-kubelet-client")
    (pki / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    ssl_("x509", "-req", "-in", "kubelet-client.csr", "-CA", "kubelet-client-ca.crt",
         "-CAkey", "kubelet-client-ca.key", "-CAcreateserial", "-out", "kubelet-client.crt",
         "-days", "2", "-extfile", "client.ext")


def _webhook_certs(pki: Path) -> str:
    """A CA and a serving certificate for 127.0.0.1 (tls.crt/tls.key, the names
    controller-runtime's webhook server reads); returns the CA in PEM for the caBundle."""
    pki.mkdir(parents=True, exist_ok=True)

    def ssl_(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=pki)

    ssl_("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
         "-days", "2", "-subj", "/CN=durapipe-e2e-jobset-webhook-ca")
    ssl_("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr",
         "-subj", "/CN=127.0.0.1")
    (pki / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n"
                                 "extendedKeyUsage=serverAuth\n")
    ssl_("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
         "-CAcreateserial", "-out", "tls.crt", "-days", "2", "-extfile", "san.ext")
    return (pki / "ca.crt").read_text()


def jobset_install_docs(webhook_url: str, ca_pem: str) -> list[dict[str, Any]]:
    """JobSet's RBAC and webhook configurations from its config/components (kustomized), as
    its release names them (namespace ``jobset-system``, names prefixed ``jobset-``), without
    the webhook Service: each webhook calls ``webhook_url`` + its path, trusting ``ca_pem``."""
    import base64

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise ToolError("kubectl is not installed")
    components = jobset_source_or_skip() / "config" / "components"
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": JOBSET_NAMESPACE}}]
    ca = base64.b64encode(ca_pem.encode()).decode()
    for part in ("rbac", "webhook"):
        text = subprocess.run([kubectl, "kustomize", str(components / part)],
                              capture_output=True, text=True, check=True).stdout
        for doc in yaml.safe_load_all(text):
            if not doc or doc["kind"] == "Service":
                continue
            meta = doc["metadata"]
            meta["name"] = "jobset-" + meta["name"]
            if doc["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
                meta["namespace"] = JOBSET_NAMESPACE  # as its release's kustomization sets it
            if "roleRef" in doc:
                doc["roleRef"]["name"] = "jobset-" + doc["roleRef"]["name"]
            for subject in doc.get("subjects") or []:
                subject["name"] = "jobset-" + subject["name"]
                subject["namespace"] = JOBSET_NAMESPACE
            for hook in doc.get("webhooks") or []:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": webhook_url + path, "caBundle": ca}
            docs.append(doc)
    return docs
