"""NetworkPolicy on the real nodes: kube-network-policies (sigs.k8s.io, what kind runs) in each node.

It programs nftables and hands each new connection to user space through an NFQUEUE to decide it.
A kernel without nftables' `queue` expression (CONFIG_NFT_QUEUE) cannot take its rules: then no
policy is enforced, and `status()` says so with the kernel's own answer, found by adding such a
rule in a node's namespace before anything relies on it."""
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
    said = " ".join(line.strip() for line in res.stderr.splitlines() if line.strip())
    return f"nftables cannot queue packets here (`nft` adding `queue num {QUEUE}`: {said})"


class PolicyEnforcer:
    """kube-network-policies in each real node, or why NetworkPolicy is not enforced."""

    def __init__(self, cluster: LocalCluster):
        self.cluster = cluster
        self.procs: list[Proc] = []
        self.off: Optional[str] = None

    @property
    def enforced(self) -> bool:
        return self.off is None and bool(self.procs)

    def status(self) -> str:
        return "enforced by kube-network-policies" if self.enforced else f"not enforced: {self.off}"

    def start(self) -> PolicyEnforcer:
        c = self.cluster
        nodes = c.real_nodes
        self.off = queue_missing(nodes[0].netns) if nodes else "no real node"
        if self.off is None and not (c.bin / PROGRAM).is_file():
            self.off = f"{PROGRAM} is not built in {c.bin} (`make cluster`)"
        if self.off is None:
            sa = self._credentials()
            for n in nodes:
                self.procs.append(self._start_in(n, sa))
        (c.root / "network-policy").write_text(self.status() + "\n")
        return self

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
            "--metrics-bind-address=127.0.0.1:9080"], c.root / "logs" / f"{PROGRAM}-{node.name}.log").start(env)

    def stop(self) -> None:
        for p in self.procs:
            p.stop(5.0)
        self.procs = []
