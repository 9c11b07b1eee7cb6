"""A whole local cluster: network, control plane, cluster DNS and N nodes (root needed).

    with LocalCluster(nodes=2) as c:        # or `python -m localcluster up` / `down`
        c.kubectl("get", "nodes")
        c.nodes[1].stop()                   # a node goes away: agent and every process of it killed
        c.nodes[1].start()                  # and comes back

Binaries come from `make cluster` (cluster/build.sh) in ~/.cache/tianji/k8s-<version>/bin."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from . import netpolicy, network, realnode
from .controlplane import DOMAIN, ControlPlane, Proc
from .provisioner import STORAGE

HERE = Path(__file__).resolve().parent
K8S_VERSION = next(w[1] for w in map(str.split, (HERE.parent / "go" / "k8s" / "go.mod").read_text().splitlines())
                   if len(w) >= 2 and w[0] == "k8s.io/kubernetes" and w[1].startswith("v"))
BIN = Path(os.environ.get("K8S_CACHE", Path.home() / ".cache" / "tianji" / f"k8s-{K8S_VERSION}")) / "bin"
PROGRAMS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "coredns", "helm")

# Cluster DNS and the network plugin's node agents read cluster-wide what they serve, each with an
# identity of its own (a node's own identity may read only its own Node).
COREDNS_RBAC = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- {apiGroups: [""], resources: [endpoints, services, pods, namespaces], verbs: [list, watch]}
- {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:coredns"}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "tianji:local-network"}
rules: [{apiGroups: [""], resources: [nodes], verbs: [get, list, watch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "tianji:local-network"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "tianji:local-network"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "tianji:local-network"}]
"""


def module_env() -> dict[str, str]:
    """This environment, with `localcluster` importable (`python -m localcluster.<part>`)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))}


def missing_programs(bin_dir: Path = BIN, real: bool = False) -> list[str]:
    """What `make cluster` has not built (with `real`: what real nodes need too)."""
    missing = [p for p in (*PROGRAMS, *(realnode.REAL_PROGRAMS if real else ())) if not (bin_dir / p).is_file()]
    return missing + ([realnode.RUNC] if real and not Path(realnode.RUNC).is_file() else [])


@dataclass
class NodeHandle:
    cluster: LocalCluster
    name: str
    number: int
    cpu: str = "4"
    memory: str = "8Gi"
    gpus: int = 0
    resources: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    real: bool = False  # the kubelet and containerd (realnode.py), not the process-mode node agent
    taints: tuple[str, ...] = ()  # a real node's, registered by its kubelet (key=value:Effect)
    agent: Optional[Proc] = None  # a real node: the process that holds its namespaces
    init_pid: Optional[int] = None
    containerd: Optional[Proc] = None
    kubelet: Optional[Proc] = None

    @property
    def ip(self) -> str:
        return self.cluster.net.node_ip(self.number)

    @property
    def netns(self) -> str:
        return self.cluster.net.node_ns(self.name)

    @property
    def root(self) -> Path:
        return self.cluster.root / "nodes" / self.name

    def alive(self) -> bool:
        return realnode.alive(self) if self.real else self.agent is not None and self.agent.alive()

    def start(self) -> None:
        if self.real:
            realnode.start(self)
            if self.cluster.network_policy is not None:
                self.cluster.network_policy.node_started(self)
            return
        c = self.cluster
        network.up_node(c.net, self.name, self.number)
        pair = c.cp.pki.issue(f"node-{self.name}", f"system:node:{self.name}", ("system:nodes",))
        net = c.cp.pki.issue(f"network-{self.name}", "tianji:local-network")
        serving = c.cp.pki.issue(f"kubelet-{self.name}", f"system:node:{self.name}", server=True,
                                 hosts=(self.ip, self.name))
        argv = ["nsenter", f"--net={network.NETNS_DIR / self.netns}", sys.executable, "-m", "localcluster.nodeagent",
                f"--name={self.name}", f"--ip={self.ip}", f"--netns={self.netns}", f"--server={c.cp.server}",
                f"--ca={c.cp.pki.ca.cert}", f"--cert={pair.cert}", f"--key={pair.key}", f"--net-cert={net.cert}",
                f"--net-key={net.key}", f"--serving-cert={serving.cert}", f"--serving-key={serving.key}",
                f"--root={self.root}",
                f"--dns={c.net.gateway}", f"--domain={DOMAIN}", f"--cpu={self.cpu}", f"--memory={self.memory}",
                f"--gpus={self.gpus}", *(f"--resource={k}={v}" for k, v in self.resources.items()),
                *(f"--label={k}={v}" for k, v in self.labels.items()), *c.agent_args]
        # The pods' "image" is this venv: its bin first on PATH (`tianji`, `python`).
        venv_bin = str(Path(sys.executable).parent)
        env = {**module_env(), "PATH": os.pathsep.join([venv_bin, os.environ.get("PATH", "/usr/bin:/bin")])}
        self.agent = Proc(f"node-{self.name}", argv, c.root / "logs" / f"node-{self.name}.log").start(env)

    def processes(self) -> list[int]:
        """Every process in this node's network namespaces (agent, hostNetwork pods, pods)."""
        out: list[int] = []
        for ns in network.namespaces():
            if ns == self.netns or ns.startswith(self.netns + "-"):
                out += network.pids_in(ns)
        return out

    def stop(self) -> None:
        """The machine goes off: the agent and every process of the node are SIGKILLed at once;
        its pods' objects stay as they were (the control plane notices through the Lease)."""
        if self.real:
            realnode.stop(self)
            return
        for _ in range(5):
            pids = self.processes()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        if self.agent is not None and self.agent.popen is not None:
            self.agent.popen.wait(10)
        for ns in network.namespaces():
            if ns.startswith(self.netns + "-"):
                network.delete_ns(ns)
        if "--runtime=crun" in self.cluster.agent_args:  # pods' containers an agent killed left behind
            from .crunruntime import sweep

            sweep(self.root)

    def shutdown(self, grace: float = 15.0) -> None:
        """A clean stop: the agent stops its pods (SIGTERM, grace), then everything left is killed.
        A real kubelet leaves its pods running when stopped (as on a machine shut down, they go with it)."""
        if self.agent is not None and not self.real:
            self.agent.stop(grace)
        self.stop()


class LocalCluster:
    def __init__(self, nodes: int = 2, *, index: int = 0, root: Optional[Path] = None, bin_dir: Path = BIN,
                 node_cpu: str = "4", node_memory: str = "8Gi", agent_args: tuple[str, ...] = (),
                 real_nodes: int = 0, real_taints: tuple[str, ...] = ()):
        """`nodes` process-mode nodes, then `real_nodes` real ones (kubelet + containerd, realnode.py)."""
        self.net = network.Addressing(index)
        self.root = Path(root or f"/tmp/tianji-cluster-{index}")
        self.bin = bin_dir
        self.cp = ControlPlane(bin_dir, self.root, self.net)
        self.agent_args = list(agent_args)
        self.nodes = [NodeHandle(self, f"node-{i + 1}", i + 1, cpu=node_cpu, memory=node_memory)
                      for i in range(nodes)]
        self.nodes += [NodeHandle(self, f"node-{i + 1}", i + 1, real=True, taints=tuple(real_taints),
                                  labels={realnode.KIND_LABEL: "real"}) for i in range(nodes, nodes + real_nodes)]
        self.coredns: Optional[Proc] = None
        self.provisioner: Optional[Proc] = None
        self.registry: Optional[Proc] = None
        self.network_policy: Optional[netpolicy.PolicyEnforcer] = None

    @property
    def real_nodes(self) -> list[NodeHandle]:
        return [n for n in self.nodes if n.real]

    @property
    def registry_host(self) -> str:
        """host:port of the cluster's image registry (real nodes pull from it)."""
        return f"{self.net.gateway}:{realnode.REGISTRY_PORT}"

    def checkout_image(self, log=print) -> str:
        """This checkout's worker image in the cluster's registry (checkoutimage.py), pushed where
        the registry lacks a layer of it; its reference."""
        if self.registry is None:
            raise RuntimeError("the checkout image is for real nodes: this cluster has no registry")
        from . import checkoutimage

        return checkoutimage.push(self.registry_host, log=log)

    @property
    def kubeconfig(self) -> Path:
        return self.cp.admin_kubeconfig

    def kubectl(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.cp.kubectl(*args, **kw)

    def up(self, wait_nodes: bool = True) -> LocalCluster:
        missing = missing_programs(self.bin, real=bool(self.real_nodes))
        if missing:
            raise RuntimeError(f"missing {', '.join(missing)} in {self.bin}: run `make cluster` first")
        network.down_all(self.net)  # whatever a crashed run left
        self.root.mkdir(parents=True, exist_ok=True)
        network.up_bridge(self.net)
        self.cp.start()
        self.kubectl("apply", "-f", "-", input=COREDNS_RBAC + "---" + STORAGE)
        self._start_dns()
        self._start_provisioner()
        if self.real_nodes:
            self.kubectl("apply", "-f", "-", input=realnode.KUBELET_API_RBAC)
            self.registry = realnode.start_registry(self)
            realnode.push_probe_image(self)
        for n in self.nodes:
            n.start()
        if self.real_nodes:
            self.network_policy = netpolicy.PolicyEnforcer(self).start()
        if wait_nodes:
            self.wait_nodes_ready()
        return self

    def _start_dns(self) -> None:
        from .controlplane import kubeconfig

        kc = kubeconfig(self.root / "coredns.kubeconfig", self.cp.server, self.cp.pki.ca.cert,
                        self.cp.pki.issue("coredns", "system:coredns"))
        corefile = self.root / "Corefile"
        corefile.write_text(
            f".:53 {{\n  bind {self.net.gateway}\n  errors\n"
            f"  kubernetes {DOMAIN} in-addr.arpa ip6.arpa {{\n    kubeconfig {kc} tianji-local\n"
            f"    pods insecure\n    fallthrough in-addr.arpa ip6.arpa\n    ttl 5\n  }}\n  cache 5\n}}\n")
        self.coredns = Proc("coredns", [str(self.bin / "coredns"), "-conf", str(corefile)],
                            self.root / "logs" / "coredns.log").start()

    def _start_provisioner(self) -> None:
        """The default StorageClass's provisioner (provisioner.py), with an identity of its own."""
        pair = self.cp.pki.issue("provisioner", "tianji:local-provisioner")
        self.provisioner = Proc("provisioner", [
            sys.executable, "-m", "localcluster.provisioner", f"--server={self.cp.server}",
            f"--ca={self.cp.pki.ca.cert}", f"--cert={pair.cert}", f"--key={pair.key}",
            f"--volumes={self.root / 'volumes'}"], self.root / "logs" / "provisioner.log").start(module_env())

    def wait_nodes_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        want = {n.name for n in self.nodes}
        while time.monotonic() < deadline:
            ready, cidrs = self._node_states()
            if want <= ready and want <= set(cidrs):
                self.route_pods(cidrs)
                return
            for n in self.nodes:
                if n.agent is not None and not n.alive():
                    raise RuntimeError(f"node {n.name} stopped:\n{realnode.tails(n) if n.real else n.agent.tail(40)}")
            time.sleep(0.5)
        raise RuntimeError(f"nodes not Ready within {timeout:g} s: {self.kubectl('get', 'nodes', check=False).stdout}")

    def _node_states(self) -> tuple[set[str], dict[str, tuple[str, str]]]:
        res = self.kubectl("get", "nodes", "-o", "yaml", check=False)
        items = (yaml.safe_load(res.stdout) or {}).get("items") or [] if res.returncode == 0 else []
        ready, cidrs = set(), {}
        for n in items:
            name = n["metadata"]["name"]
            conds = {c["type"]: c["status"] for c in (n.get("status") or {}).get("conditions") or []}
            if conds.get("Ready") == "True":
                ready.add(name)
            ip = next((a["address"] for a in n["status"].get("addresses", []) if a["type"] == "InternalIP"), None)
            if n["spec"].get("podCIDR") and ip:
                cidrs[name] = (n["spec"]["podCIDR"], ip)
        return ready, cidrs

    def route_pods(self, cidrs: Optional[dict[str, tuple[str, str]]] = None) -> None:
        """Root-namespace routes to every node's pods (the API server and DNS answer pods)."""
        cidrs = cidrs if cidrs is not None else self._node_states()[1]
        for cidr, ip in cidrs.values():
            network.route(cidr, ip)
        for n in self.real_nodes:  # a process-mode agent keeps its node's routes itself
            if n.alive():
                realnode.route_pods(n, cidrs)

    def down(self) -> None:
        if self.network_policy is not None:
            self.network_policy.stop()
        for n in self.nodes:
            n.shutdown(grace=5.0)
        for p in (self.registry, self.provisioner, self.coredns):
            if p is not None:
                p.stop()
        self.cp.stop()
        network.down_all(self.net)

    def __enter__(self) -> LocalCluster:
        try:
            return self.up()
        except BaseException:
            self.down()
            raise

    def __exit__(self, *exc) -> None:
        self.down()

    def logs(self, lines: int = 30) -> str:
        procs = [*self.cp.procs.values(), *(p for p in (self.coredns, self.provisioner, self.registry) if p),
                 *(p for n in self.nodes for p in (n.agent, n.containerd, n.kubelet) if p)]
        return "\n".join(f"----- {p.name} ({'running' if p.alive() else 'exited'})\n{p.tail(lines)}" for p in procs)
