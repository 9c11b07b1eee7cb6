"""NetworkPolicy on the real nodes: kube-network-policies (sigs.k8s.io, what kind runs) in each node.

It hands each new connection to user space through NFQUEUE and decides it there against the
cluster's NetworkPolicies. Its own hook is an nftables `queue` rule. A kernel without that
expression (CONFIG_NFT_QUEUE) but with iptables' NFQUEUE target (this machine's) refuses the
rule, so here the hook is an iptables chain with the same matches, in each node's namespace, and
kube-network-policies still decides every connection. A kernel with neither enforces nothing:
`status()` says so with the kernel's answers, found by trying each hook in a node's namespace
before anything relies on it."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from . import network
from .controlplane import Proc

if TYPE_CHECKING:
    from .cluster import LocalCluster

PROGRAM = "kube-network-policies"
SERVICE_ACCOUNT = "kube-network-policies"
QUEUE = 100
RBAC = f"""
apiVersion: v1
kind: ServiceAccount
metadata: {{name: {SERVICE_ACCOUNT}, namespace: kube-system}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: "tianji:kube-network-policies"}}
rules:
- {{apiGroups: [""], resources: [pods, namespaces, nodes], verbs: [get, list, watch]}}
- {{apiGroups: [networking.k8s.io], resources: [networkpolicies], verbs: [get, list, watch]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: "tianji:kube-network-policies"}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "tianji:kube-network-policies"}}
subjects: [{{kind: ServiceAccount, name: {SERVICE_ACCOUNT}, namespace: kube-system}}]
"""
# Its client is in-cluster only: a token where every pod has one, the API server in the environment.
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


# The iptables hook: kube-network-policies' own postrouting chain (v0.8.0, controller.go) less its
# set of policy-selected local pods, so every new connection is queued; a pod no policy selects is
# accepted by its evaluation as by the set. No bypass: with no listener, new connections drop.
CHAIN = "TIANJI-NETPOL"
IPTABLES_HOOK = [
    ["-t", "mangle", "-N", CHAIN],
    # The node's own root processes (kubelet probes, the runtime's pulls): its `meta skuid 0 accept`.
    ["-t", "mangle", "-A", CHAIN, "-m", "owner", "--uid-owner", "0", "-j", "RETURN"],
    ["-t", "mangle", "-A", CHAIN, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"],
    ["-t", "mangle", "-A", CHAIN, "-j", "NFQUEUE", "--queue-num", str(QUEUE)],
    ["-t", "mangle", "-A", "POSTROUTING", "-j", CHAIN],
]


def _said(res: subprocess.CompletedProcess) -> str:
    return " ".join(line.strip() for line in res.stderr.splitlines() if line.strip())


def queue_missing(netns: str) -> Optional[str]:
    """None if nftables can queue packets to user space in `netns`; else the kernel's refusal."""
    if shutil.which("nft") is None:
        return "nft is not installed (Debian's nftables; `make cluster` installs it)"
    probe = (f"table inet tianji_queue_probe {{\n chain forward {{\n  type filter hook forward priority 0;\n"
             f"  queue num {QUEUE} bypass\n }}\n}}\n")
    res = subprocess.run(["ip", "netns", "exec", netns, "nft", "-f", "-"], input=probe, capture_output=True,
                         text=True, timeout=30)
    subprocess.run(["ip", "netns", "exec", netns, "nft", "delete", "table", "inet", "tianji_queue_probe"],
                   capture_output=True, timeout=30)
    if res.returncode == 0:
        return None
    return f"nftables cannot queue packets here (`nft` adding `queue num {QUEUE}`: {_said(res)})"


def iptables_queue_missing(netns: str) -> Optional[str]:
    """None if iptables' NFQUEUE target works in `netns` (probed in a scratch chain); else why not."""
    if shutil.which("iptables") is None:
        return "iptables is not installed (Debian's iptables; `make cluster` installs it)"
    probe = "TIANJI-QUEUE-PROBE"
    run = lambda *a: subprocess.run(["ip", "netns", "exec", netns, "iptables", "-t", "mangle", *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=30)
    run("-N", probe)
    res = run("-A", probe, "-j", "NFQUEUE", "--queue-num", str(QUEUE), "--queue-bypass")
    run("-F", probe)
    run("-X", probe)
    return None if res.returncode == 0 else f"iptables' NFQUEUE target is refused too: {_said(res)}"


def install_iptables_hook(netns: str) -> None:
    for rule in IPTABLES_HOOK:
        network.in_ns(netns, "iptables", *rule)


class PolicyEnforcer:
    """kube-network-policies in each real node, or why NetworkPolicy is not enforced."""

    def __init__(self, cluster: LocalCluster):
        self.cluster = cluster
        self.procs: list[Proc] = []
        self.off: Optional[str] = None
        self.hook = "nftables"  # or "iptables": who hands new connections to its queue
        self.nft_refusal: Optional[str] = None
        self.sa: Optional[Path] = None

    @property
    def enforced(self) -> bool:
        return self.off is None and bool(self.procs)

    def status(self) -> str:
        if not self.enforced:
            return f"not enforced: {self.off}"
        if self.hook == "iptables":
            return (f"enforced by kube-network-policies (hooked by iptables' NFQUEUE target: {self.nft_refusal})")
        return "enforced by kube-network-policies"

    def start(self) -> PolicyEnforcer:
        c = self.cluster
        nodes = c.real_nodes
        self.off = self._hook_missing(nodes[0].netns) if nodes else "no real node"
        if self.off is None and not (c.bin / PROGRAM).is_file():
            self.off = f"{PROGRAM} is not built in {c.bin} (`make cluster`)"
        if self.off is None:
            self.sa = self._credentials()
            for n in nodes:
                self.node_started(n)
        (c.root / "network-policy").write_text(self.status() + "\n")
        return self

    def node_started(self, node) -> None:
        """Run in `node` as a DaemonSet's pod would: again after each power loss, which kills it."""
        if self.off is not None or self.sa is None:
            return
        self.procs = [p for p in self.procs if p.name != f"{PROGRAM}-{node.name}"]
        self.procs.append(self._start_in(node, self.sa))
        if self.hook == "iptables" and network.in_ns(node.netns, "iptables", "-t", "mangle", "-S", CHAIN,
                                                     check=False).returncode != 0:
            install_iptables_hook(node.netns)

    def _hook_missing(self, netns: str) -> Optional[str]:
        self.nft_refusal = queue_missing(netns)
        if self.nft_refusal is None:
            return None
        ipt = iptables_queue_missing(netns)
        if ipt is not None:
            return f"{self.nft_refusal}; {ipt}"
        self.hook = "iptables"
        return None

    def _credentials(self) -> Path:
        c = self.cluster
        c.kubectl("apply", "-f", "-", input=RBAC)
        token = c.kubectl("create", "token", "-n", "kube-system", SERVICE_ACCOUNT, "--duration=48h").stdout.strip()
        sa = c.root / "kube-network-policies-sa"
        sa.mkdir(exist_ok=True)
        (sa / "token").write_text(token)
        (sa / "ca.crt").write_bytes(Path(c.cp.pki.ca.cert).read_bytes())
        (sa / "namespace").write_text("kube-system")
        return sa

    def _start_in(self, node, sa: Path) -> Proc:
        c = self.cluster
        mount = ["nsenter", f"--target={node.init_pid}", "--mount", "--"]
        network.sh(*mount, "sh", "-c", f'mkdir -p {SA_DIR} && mount --bind "$0" {SA_DIR}', str(sa))
        host, port = c.cp.server.removeprefix("https://").rsplit(":", 1)
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "KUBERNETES_SERVICE_HOST": host,
               "KUBERNETES_SERVICE_PORT": port}
        return Proc(f"{PROGRAM}-{node.name}", [
            "nsenter", f"--target={node.init_pid}", "--net", "--mount", "--pid", "--", str(c.bin / PROGRAM),
            f"--hostname-override={node.name}", "--disable-nri", f"--nfqueue-id={QUEUE}",
            # Its DNS workaround is for kernels before 6.12 and needs the nftables hook.
            f"--netfilter-bug-1766-fix={'false' if self.hook == 'iptables' else 'true'}",
            "--metrics-bind-address=127.0.0.1:9080"], c.root / "logs" / f"{PROGRAM}-{node.name}.log").start(env)

    def stop(self) -> None:
        for p in self.procs:
            p.stop(5.0)
        self.procs = []
