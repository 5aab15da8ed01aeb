"""A real node for the e2e control plane: containerd, runc, a CNI bridge and a kubelet v1.35.4.

``RealNode.start(cluster, ...)`` joins one node to a :class:`~e2e.cluster.Cluster` started on
the machine's own interface address, so that every container of a compiled pipeline runs for
real (Argo's init and wait containers, the durapipe runtime, the user's program):

- containerd (Debian's package) with its CRI plugin, its socket, state and shim paths under
  ``/run/durapipe-realnode`` (unix sockets need short paths), its image store under the test's
  state directory; the images are built here (``images.py``) and imported, never pulled;
- a bridge ``durapipe0`` with host-local IPAM on ``10.250.0.0/24`` (CNI plugins from Debian's
  ``containernetworking-plugins``), and one DNAT rule that does for the ``kubernetes`` Service
  what kube-proxy does in a cluster (there is no kube-proxy here), so pods reach the API server
  at ``10.96.0.1:443`` as anywhere else;
- the kubelet (built from ``k8s.io/kubernetes`` by ``cluster.build_binaries``), authenticated by
  the node token (Node authorization), on cgroup v1 with the cgroupfs driver, its API and
  health ports on this machine's addresses only;
- GPU capacity advertised as the extended resource ``nvidia.com/gpu`` (a node status patch, as
  Kubernetes documents for extended resources) with a GPU product label, so GPU stages place
  here and run on the CPU;
- cluster DNS: CoreDNS (``tools/cluster/coredns``: its kubernetes plugin) on this machine's
  address, port 53, as the kubelet's ``clusterDNS``, running as its own ServiceAccount with
  CoreDNS's ClusterRole, so a pod resolves Services and the hostnames of a headless Service's
  pods (torchrun's master address in a JobSet) as in any cluster.  It stands for the cluster's
  DNS, not for the node: ``lose()`` leaves it running.

The kubelet and containerd are machine-wide (``/var/lib/cni``, ``/var/log/containers``, the
``kubepods`` cgroups, network namespaces, iptables, sysctls), so one real node runs per machine,
and ``stop()`` puts the machine back as :class:`HostState` found it: no process, mount, cgroup,
bridge, rule, table or changed sysctl is left (``leftovers()`` says what would be).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from argo.argo_tools import ToolError

from .images import PAUSE_IMAGE
from .cluster import NODE_TOKEN, REAL_NODE_NAME, Cluster, Proc, _wait, died, free_port, spawn

#: Short, fixed paths: containerd's socket and its shims' sockets must stay under 108 bytes.
RUN_DIR = Path("/run/durapipe-realnode")
BRIDGE = "durapipe0"
POD_SUBNET = "10.250.0.0/24"
#: The `kubernetes` Service's ClusterIP (the first address of the API server's service range).
SERVICE_IP = "10.96.0.1"
CNI_BIN = Path("/usr/lib/cni")
#: What the kubelet changes unless `protectKernelDefaults` (which would refuse to start here).
SYSCTLS = ("vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops",
           "net.ipv4.ip_forward")
#: Machine-wide directories the kubelet, containerd or the CNI plugins add entries to.
SHARED_DIRS = (Path("/var/log/containers"), Path("/var/log/pods"), Path("/var/lib/cni"),
               Path("/run/netns"), Path("/run/containerd"), Path("/var/lib/kubelet"))
#: The cluster's DNS domain (the kubelet's clusterDomain, CoreDNS's zone).
CLUSTER_DOMAIN = "cluster.local"
DNS_NAMESPACE = "kube-system"
DNS_ACCOUNT = "coredns"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_COUNT = 2
#: What the node is: a spot A10G node of an EKS managed node group (docs/language.md, Cluster
#: profiles), as examples/spot_training.pipe asks for; a case needing other hardware relabels it.
GPU_LABELS = {"nvidia.com/gpu.product": "NVIDIA-A10G", "eks.amazonaws.com/capacityType": "SPOT"}


def host_address() -> str:
    """This machine's own address on the interface of its default route (not loopback)."""
    routes = json.loads(_out(["ip", "-j", "-4", "route", "show", "default"]) or "[]")
    devices = [r["dev"] for r in routes if r.get("dev")]
    for dev in devices or ["eth0"]:
        for link in json.loads(_out(["ip", "-j", "-4", "addr", "show", "dev", dev]) or "[]"):
            for addr in link.get("addr_info", []):
                if addr.get("scope") == "global":
                    return str(addr["local"])
    raise ToolError("no global IPv4 address on this machine's default interface")


def requirements_or_skip() -> None:
    """Skip (a failure under DURAPIPE_STRICT_SKIPS) where the machine cannot run a node."""
    if os.geteuid() != 0:
        pytest.skip("the real node needs root (containerd, cgroups, a bridge)")
    for tool in ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "ip", "iptables",
                 "iptables-save", "nft", "mmdebstrap"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (Debian: containerd runc iptables nftables "
                        "mmdebstrap containernetworking-plugins; .ci/run installs them)")
    for plugin in ("bridge", "host-local", "loopback"):
        if not (CNI_BIN / plugin).exists():
            pytest.skip(f"the CNI plugin {CNI_BIN / plugin} is missing "
                        "(containernetworking-plugins)")
    if not Path("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() and \
            not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        pytest.skip("no memory cgroup: a real OOM kill cannot happen here")


def _out(args: list[str], check: bool = False) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise ToolError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def _run(*args: str) -> None:
    _out(list(args), check=True)


# -- the machine's state, before and after -----------------------------------------------------

def _cgroup_roots() -> list[Path]:
    base = Path("/sys/fs/cgroup")
    if (base / "cgroup.controllers").exists():
        return [base]
    return sorted(p for p in base.iterdir() if p.is_dir() and not p.is_symlink())


def _kubepods_dirs() -> list[Path]:
    """Every cgroup directory of the kubelet's (``kubepods`` and below), deepest first."""
    found: list[Path] = []
    for root in _cgroup_roots():
        top = root / "kubepods"
        if top.is_dir():
            found += [Path(d) for d, _, _ in os.walk(top, topdown=False)]
    return found


def _mounts() -> list[str]:
    with open("/proc/self/mounts") as fh:
        return [line.split()[1].replace("\\040", " ") for line in fh]


def _iptables_rules() -> dict[str, list[str]]:
    """``iptables-save`` per table, for IPv4 and IPv6: chain declarations and rules."""
    rules: dict[str, list[str]] = {}
    for save in ("iptables-save", "ip6tables-save"):
        if shutil.which(save) is None:
            continue
        table = ""
        for line in _out([save]).splitlines():
            if line.startswith("*"):
                table = f"{save.split('-')[0]} {line[1:]}"
                rules.setdefault(table, [])
            elif line.startswith((":", "-A")):
                # Chain counters change by themselves: compare a chain by its name only.
                rules[table].append(line.split()[0] if line.startswith(":") else line)
    return rules


def _nft_tables() -> list[str]:
    return sorted(line.strip() for line in _out(["nft", "list", "tables"]).splitlines()
                  if line.strip())


def _entries(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


@dataclass
class HostState:
    """What the real node changes on the machine, read before it starts."""

    sysctls: dict[str, str]
    iptables: dict[str, list[str]]
    nft: list[str]
    links: list[str]
    shared: dict[str, list[str] | None]

    @classmethod
    def read(cls) -> HostState:
        return cls(
            sysctls={k: _out(["sysctl", "-n", k]).strip() for k in SYSCTLS},
            iptables=_iptables_rules(), nft=_nft_tables(), links=_links(),
            shared={str(d): (_entries(d) if d.exists() else None) for d in SHARED_DIRS})

    def leftovers(self, *, own: list[Path]) -> list[str]:
        """What differs from this state now: empty once a node is cleanly gone."""
        now = HostState.read()
        left: list[str] = []
        left += [f"sysctl {k}={now.sysctls[k]} (was {v})" for k, v in self.sysctls.items()
                 if now.sysctls[k] != v]
        for table, lines in now.iptables.items():
            before = set(self.iptables.get(table, []))
            left += [f"{table}: {line}" for line in lines if line not in before]
        left += [f"nft table {t}" for t in now.nft if t not in self.nft]
        left += [f"link {name}" for name in now.links if name not in self.links]
        for d, entries in now.shared.items():
            was = self.shared.get(d)
            if entries is not None and was is None:
                left.append(f"directory {d}")
            elif entries is not None and was is not None:
                left += [f"{d}/{e}" for e in entries if e not in was]
        left += [f"cgroup {d}" for d in _kubepods_dirs()]
        roots = [str(p) for p in [*own, RUN_DIR]]
        left += [f"mount {m}" for m in _mounts() if any(m.startswith(r) for r in roots)]
        left += [f"process {pid} {cmd}" for pid, cmd in _node_processes()]
        return left


def _links() -> list[str]:
    return sorted(link["ifname"] for link in json.loads(_out(["ip", "-j", "link"]) or "[]"))


def _node_processes() -> list[tuple[int, str]]:
    """Processes of a real node: ours by their command line (the run directory, shims of the
    k8s.io namespace) or by their cgroup (any container's process)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cgroup = (entry / "cgroup").read_text()
        except OSError:
            continue
        if str(RUN_DIR) in cmd or "/kubepods" in cgroup:
            found.append((int(entry.name), cmd.strip()[:200]))
    return found


# -- the node ----------------------------------------------------------------------------------

@dataclass
class RealNode:
    cluster: Cluster
    state: Path
    kubelet: Path
    coredns: Path
    before: HostState
    procs: list[Proc] = field(default_factory=list)
    #: The cluster's DNS server: not the node's, so a lost node does not take it along.
    dns: Proc | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return REAL_NODE_NAME

    @property
    def socket(self) -> Path:
        return RUN_DIR / "containerd.sock"

    def ctr(self, *args: str, timeout: float = 300) -> str:
        proc = subprocess.run(["ctr", "--address", str(self.socket), "-n", "k8s.io", *args],
                              capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise ToolError(f"ctr {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    @classmethod
    def start(cls, cluster: Cluster, bins: dict[str, Path], state: Path,
              load_images: Callable[[RealNode], None]) -> RealNode:
        """Start containerd, let ``load_images`` import what the pods run, start the cluster's
        DNS and the kubelet and wait for the node to be Ready with its GPU capacity."""
        requirements_or_skip()
        if _node_processes() or RUN_DIR.exists():
            raise ToolError(f"another real node runs on this machine ({RUN_DIR} or its "
                            "processes exist): one at a time (the kubelet is machine-wide)")
        node = cls(cluster=cluster, state=state, kubelet=bins["kubelet"],
                   coredns=bins["coredns"], before=HostState.read())
        try:
            node._start(load_images)
        except BaseException:
            node.stop()
            raise
        return node

    def _start(self, load_images: Callable[[RealNode], None]) -> None:
        t0 = time.monotonic()
        RUN_DIR.mkdir(parents=True)
        self.state.mkdir(parents=True, exist_ok=True)
        self._start_containerd()
        self.timings["containerd"] = time.monotonic() - t0
        load_images(self)
        self.timings["images"] = time.monotonic() - t0
        self._route_service_ip()
        self._start_dns()
        self.timings["dns"] = time.monotonic() - t0
        self._start_kubelet()
        self._advertise_gpus()
        self.timings["ready"] = time.monotonic() - t0

    def _spawn(self, name: str, args: list[str]) -> Proc:
        proc = spawn(name, args, self.state, {"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        self.procs.append(proc)
        return proc

    def _start_containerd(self) -> None:
        cni_conf = self.state / "cni" / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-durapipe.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": "durapipe",
            "plugins": [{
                "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False,
                "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                         "routes": [{"dst": "0.0.0.0/0"}],
                         "dataDir": str(self.state / "cni" / "ipam")},
            }],
        }, indent=2))
        # Under RUN_DIR, so that every process of the node names it on its command line.
        config = RUN_DIR / "containerd.toml"
        config.write_text(_containerd_config(self.state, RUN_DIR, cni_conf))
        proc = self._spawn("containerd", ["containerd", f"--config={config}"])
        _wait("containerd", lambda: self.socket.exists() and bool(
            subprocess.run(["ctr", "--address", str(self.socket), "version"],
                           capture_output=True, check=False).returncode == 0), 60,
              died(proc))

    def _route_service_ip(self) -> None:
        """kube-proxy's one job here: the `kubernetes` Service's address to the API server."""
        _run("iptables", "-t", "nat", "-A", "PREROUTING", "-d", f"{SERVICE_IP}/32", "-p", "tcp",
             "--dport", "443", "-m", "comment", "--comment", "durapipe-realnode",
             "-j", "DNAT", "--to-destination", f"{self.cluster.address}:{self.cluster.api_port}")

    def _start_dns(self) -> None:
        """CoreDNS as a cluster runs it (its ServiceAccount, CoreDNS's own ClusterRole), bound
        to this machine's address only, ready once it answers for the ``kubernetes``
        Service."""
        self.cluster.apply(coredns_rbac())
        kubeconfig = self.cluster.account_kubeconfig(DNS_ACCOUNT, DNS_NAMESPACE,
                                                     RUN_DIR / "coredns.kubeconfig")
        corefile = RUN_DIR / "Corefile"  # under RUN_DIR: on CoreDNS's command line
        corefile.write_text(_corefile(self.cluster.address, kubeconfig))
        self.dns = spawn("coredns", [str(self.coredns), "-conf", str(corefile), "-quiet"],
                         self.state, {"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        name = f"kubernetes.default.svc.{CLUSTER_DOMAIN}"
        _wait(f"cluster DNS ({name})",
              lambda: dns_lookup(self.cluster.address, name) == [SERVICE_IP], 60,
              died(self.dns))

    def _start_kubelet(self) -> None:
        st = self.state
        kubeconfig = st / "kubelet.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "node",
            "clusters": [{"name": "e2e", "cluster": {"server": self.cluster.server,
                                                      "insecure-skip-tls-verify": True}}],
            "users": [{"name": "node", "user": {"token": NODE_TOKEN}}],
            "contexts": [{"name": "node", "context": {"cluster": "e2e", "user": "node"}}],
        }))
        config = RUN_DIR / "kubelet.yaml"
        config.write_text(yaml.safe_dump(_kubelet_config(
            st, self.cluster.address, self.socket,
            self.cluster.state / "pki" / "kubelet-client-ca.crt",
            dns=self.cluster.address if self.dns is not None else None)))
        proc = self._spawn("kubelet", [
            str(self.kubelet), f"--config={config}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={st / 'kubelet'}", f"--cert-dir={st / 'kubelet-pki'}",
            f"--hostname-override={self.name}", f"--node-ip={self.cluster.address}",
            "--node-labels=" + ",".join(f"{k}={v}" for k, v in GPU_LABELS.items()),
            "--v=1",
        ])
        _wait("real node Ready", lambda: self.cluster.kubectl(
            "get", "node", self.name, "-o",
            'jsonpath={.status.conditions[?(@.type=="Ready")].status}',
            check=False).stdout.strip() == "True", 120, died(proc))

    def _advertise_gpus(self) -> None:
        patch = json.dumps([{"op": "add", "path": "/status/capacity/nvidia.com~1gpu",
                             "value": str(GPU_COUNT)}])
        self.cluster.kubectl("patch", "node", self.name, "--subresource=status",
                             "--type=json", "-p", patch)
        _wait("the real node's GPU capacity", lambda: self.cluster.kubectl(
            "get", "node", self.name, "-o",
            r"jsonpath={.status.allocatable.nvidia\.com/gpu}",
            check=False).stdout.strip() == str(GPU_COUNT), 30)

    # -- losing the node -----------------------------------------------------------------------

    def lose(self) -> None:
        """The node dies abruptly, as a reclaimed VM does: the kubelet, every container, the
        shims and containerd are SIGKILLed at once (no SIGTERM, no wait container reporting),
        and the Node object is deleted, as a cloud's node controller deletes a vanished VM.
        The cluster's DNS server is not the node's: it stays."""
        for proc in self.procs:
            if proc.popen.poll() is None:
                proc.popen.kill()
        dns_pid = self.dns.popen.pid if self.dns is not None else None
        _kill_until_gone(lambda: [pid for pid, _ in _node_processes() if pid != dns_pid])
        for proc in self.procs:
            proc.popen.wait(timeout=10)
        self.procs.clear()
        self.cluster.kubectl("delete", "node", self.name, "--wait=false")

    def rejoin(self) -> None:
        """A new machine of the same name joins: containerd and the kubelet start again over
        the old image store (nothing is imported again) and the node registers anew."""
        self._delete_new_netns()
        self._start_containerd()
        self._start_kubelet()
        self._advertise_gpus()

    # -- teardown -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop everything and put the machine back; ``leftovers()`` is then empty."""
        t0 = time.monotonic()
        for proc in self.procs:
            if proc.name == "kubelet":
                _terminate(proc)
        _kill_until_gone(lambda: [pid for pid, _ in _node_processes()
                                  if not any(p.popen.pid == pid for p in self.procs)])
        for proc in reversed(self.procs):
            _terminate(proc)
        if self.dns is not None:
            _terminate(self.dns)
        _kill_until_gone(lambda: [pid for pid, _ in _node_processes()])
        self._unmount_and_remove()
        for d in _kubepods_dirs():
            _rmdir_cgroup(d)
        if BRIDGE in _links():
            _out(["ip", "link", "delete", BRIDGE])
        self._restore_firewall()
        for key, value in self.before.sysctls.items():
            _out(["sysctl", "-qw", f"{key}={value}"])
        self.timings["teardown"] = time.monotonic() - t0

    def leftovers(self) -> list[str]:
        return self.before.leftovers(own=[self.state])

    def _delete_new_netns(self) -> None:
        """The pods' network namespaces (and with them their veths), those the node made."""
        for ns in _entries(Path("/run/netns")):
            if ns not in (self.before.shared.get("/run/netns") or []):
                _out(["ip", "netns", "delete", ns])

    def _unmount_and_remove(self) -> None:
        self._delete_new_netns()
        roots = [str(p) for p in (self.state, RUN_DIR, *SHARED_DIRS)]
        for mount in sorted((m for m in _mounts() if any(m.startswith(r) for r in roots)),
                            key=len, reverse=True):
            if _out(["umount", mount]) == "" and mount in _mounts():
                _out(["umount", "-l", mount])
        for d in SHARED_DIRS:
            was = self.before.shared.get(str(d))
            if was is None:
                shutil.rmtree(d, ignore_errors=True)
                continue
            for entry in _entries(d):
                if entry not in was:
                    path = d / entry
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        path.unlink(missing_ok=True)
        shutil.rmtree(RUN_DIR, ignore_errors=True)
        # The image store and the pods' volumes: hundreds of MB the next start imports anew.
        for big in ("containerd-root", "kubelet"):
            shutil.rmtree(self.state / big, ignore_errors=True)

    def _restore_firewall(self) -> None:
        now = _iptables_rules()
        for table, lines in now.items():
            family, name = table.split()
            before = set(self.before.iptables.get(table, []))
            for line in reversed(lines):  # rules before the chains they jump to
                if line.startswith("-A") and line not in before:
                    _out([family, "-t", name, "-D", *shlex.split(line)[1:]])
            for line in lines:
                if line.startswith(":") and line not in before:
                    _out([family, "-t", name, "-F", line[1:]])
            for line in lines:
                if line.startswith(":") and line not in before:
                    _out([family, "-t", name, "-X", line[1:]])
        for table in _nft_tables():
            if table not in self.before.nft:
                _out(["nft", "delete", "table", *table.split()[1:]])


def _terminate(proc: Proc) -> None:
    if proc.popen.poll() is None:
        proc.popen.send_signal(signal.SIGTERM)
        try:
            proc.popen.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait(timeout=10)


def _kill_until_gone(pids: Callable[[], list[int]], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (left := pids()) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


def _rmdir_cgroup(path: Path) -> None:
    deadline = time.monotonic() + 10
    while path.exists():
        try:
            path.rmdir()
        except OSError:
            if time.monotonic() > deadline:
                return  # reported by leftovers()
            time.sleep(0.2)


def _containerd_config(state: Path, run: Path, cni_conf: Path) -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""\
version = 2
root = "{state / 'containerd-root'}"
state = "{run / 'state'}"
[grpc]
  address = "{run / 'containerd.sock'}"
[ttrpc]
  address = "{run / 'containerd.sock.ttrpc'}"
[debug]
  address = ""
[metrics]
  address = ""
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # No CAP_SYS_RESOURCE here: containers keep the oom_score_adj they are given or higher.
  restrict_oom_score_adj = true
  tolerate_missing_hugepages_controller = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_cdi = false
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{run / 'runc'}"
  [{cri}.cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni_conf}"
"""



def _corefile(address: str, kubeconfig: Path) -> str:
    # No forward: nothing outside the cluster's zone is reachable from here.  No cache: a
    # name asked for before its pod has an address (torchrun's master, while pod 0 starts)
    # must not be remembered as missing.
    return f"""\
{CLUSTER_DOMAIN}:53 {{
    bind {address}
    errors
    kubernetes {CLUSTER_DOMAIN} {{
        kubeconfig {kubeconfig}
    }}
}}
"""


def coredns_rbac() -> list[dict[str, Any]]:
    """CoreDNS's ServiceAccount and the rights of its ``system:coredns`` ClusterRole (as
    kubeadm installs it: what the kubernetes plugin lists and watches)."""
    role = f"durapipe-e2e:{DNS_ACCOUNT}"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": DNS_ACCOUNT, "namespace": DNS_NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": role},
         "rules": [
             {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
              "verbs": ["list", "watch"]},
             {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
              "verbs": ["list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": role},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": role},
         "subjects": [{"kind": "ServiceAccount", "name": DNS_ACCOUNT,
                       "namespace": DNS_NAMESPACE}]},
    ]


def dns_lookup(server: str, name: str, timeout: float = 2) -> list[str]:
    """The IPv4 addresses ``server`` (port 53, UDP) answers for ``name``: one A query, as a
    pod's resolver sends it."""
    query_id = os.getpid() & 0xFFFF
    question = b"".join(bytes([len(label)]) + label.encode() for label in name.split("."))
    packet = struct.pack(">HHHHHH", query_id, 0x0100, 1, 0, 0, 0) + question + \
        b"\0" + struct.pack(">HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        sock.sendto(packet, (server, 53))
        reply = sock.recv(4096)
    rid, flags, _qd, answers = struct.unpack(">HHHH", reply[:8])
    if rid != query_id or flags & 0x000F:  # another reply, or an error (NXDOMAIN, ...)
        return []
    offset = 12 + len(question) + 1 + 4
    found = []
    for _ in range(answers):
        while reply[offset] and reply[offset] & 0xC0 != 0xC0:  # the owner name's labels
            offset += reply[offset] + 1
        offset += 2 if reply[offset] & 0xC0 == 0xC0 else 1
        rtype, _cls, _ttl, length = struct.unpack(">HHIH", reply[offset:offset + 10])
        offset += 10
        if rtype == 1 and length == 4:
            found.append(socket.inet_ntoa(reply[offset:offset + 4]))
        offset += length
    return found


def _kubelet_config(state: Path, address: str, runtime_socket: Path, client_ca: Path,
                    dns: str | None = None) -> dict[str, Any]:
    cluster_dns = {"clusterDNS": [dns], "clusterDomain": CLUSTER_DOMAIN} if dns else {}
    return {
        **cluster_dns,
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        # This machine: cgroup v1 (1.35 refuses it unless told), no systemd.
        "failCgroupV1": False, "cgroupDriver": "cgroupfs", "oomScoreAdj": 0,
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        "address": address, "port": free_port(), "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": free_port(),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(client_ca)}},
        "authorization": {"mode": "AlwaysAllow"},
        "podLogsDir": str(state / "pod-logs"),
        # Images here can never be pulled again: never collect them.
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "2%", "nodefs.available": "2%",
                         "nodefs.inodesFree": "2%", "imagefs.available": "2%"},
        "protectKernelDefaults": False, "failSwapOn": False,
        "serializeImagePulls": False, "resolvConf": "/etc/resolv.conf",
        "cgroupsPerQOS": True, "enforceNodeAllocatable": ["pods"],
        "maxPods": 40, "syncFrequency": "5s", "fileCheckFrequency": "5s",
        "nodeStatusUpdateFrequency": "5s",
    }
