"""The local cluster's network, made of Linux network namespaces (root needed).

    root namespace                node namespace tjc<C>-<node>          pod namespace tjc<C>-<node>-<uid8>
    bridge tjc<C>br  <--veth-->  eth0 = node IP (hostNetwork pods)
    10.<B>.0.1 (API server,      cbr0 = first address of the node's    eth0 = a pod IP from the podCIDR
    cluster DNS)                 podCIDR  <--veth-->                   (default route: cbr0)

A node forwards between its pods and the bridge; every node routes each other node's podCIDR
to that node's IP on the bridge (the host-gateway scheme of kubenet and flannel's host-gw),
and the root namespace has the same routes, so the API server and DNS answer pod IPs.
Traffic never leaves the machine: every address lives on interfaces made here.
Service ClusterIPs are allocated by the API server but not routed (no kube-proxy): the
agent points KUBERNETES_SERVICE_HOST at the API server's own endpoint, and TianJi's peers
find each other through headless Services (DNS answers pod IPs)."""
from __future__ import annotations

import hashlib
import ipaddress
import subprocess
from dataclasses import dataclass
from pathlib import Path

NETNS_DIR = Path("/run/netns")


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {res.stderr.strip() or res.stdout.strip()}")
    return res


def in_ns(ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return sh("ip", "netns", "exec", ns, *args, check=check)


@dataclass(frozen=True)
class Addressing:
    """The address plan of cluster number `index` (0-15): separate ranges, so clusters coexist."""

    index: int = 0

    @property
    def prefix(self) -> str:
        return f"tjc{self.index}"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def node_net(self) -> ipaddress.IPv4Network:
        return ipaddress.ip_network(f"10.{200 + self.index}.0.0/24")

    @property
    def gateway(self) -> str:  # the root namespace's address: API server, cluster DNS
        return str(self.node_net.network_address + 1)

    @property
    def cluster_cidr(self) -> str:  # pods: a /24 per node, allocated by the node-IPAM controller
        return f"10.{220 + self.index}.0.0/16"

    @property
    def service_cidr(self) -> str:
        return f"10.{240 + self.index}.0.0/24"

    def node_ip(self, number: int) -> str:
        return str(self.node_net.network_address + 10 + number)

    def node_ns(self, node: str) -> str:
        return f"{self.prefix}-{node}"



def pod_ns_name(node_ns: str, uid: str) -> str:
    """A pod's network namespace: named after its node's, so a stopped node's are found."""
    return f"{node_ns}-{uid[:8]}"


def _veth_name(tag: str, key: str) -> str:
    return f"{tag}{hashlib.sha1(key.encode()).hexdigest()[:10]}"  # interface names: at most 15 bytes


def namespaces() -> list[str]:
    return sorted(p.name for p in NETNS_DIR.iterdir()) if NETNS_DIR.is_dir() else []


def pids_in(ns: str) -> list[int]:
    res = sh("ip", "netns", "pids", ns, check=False)
    return [int(p) for p in res.stdout.split()] if res.returncode == 0 else []


def delete_ns(ns: str) -> None:
    sh("ip", "netns", "delete", ns, check=False)


def blackholes(a: Addressing) -> list[str]:
    """The cluster's whole ranges: never routed off the machine. Service IPs (no kube-proxy), a
    stopped node's pods, or a bridge gone with a crashed run would otherwise follow the default
    route out; these less specific routes drop them here."""
    return [f"10.{200 + a.index}.0.0/16", a.cluster_cidr, f"10.{240 + a.index}.0.0/16"]


def _host_in_use(resolv: Path) -> list[tuple[str, str]]:
    """(what, address or network) the machine itself uses: its nameservers, the addresses and routes
    of its own interfaces (every local cluster's, `tjc*`, and the blackholes left out)."""
    used = [("nameserver", line.split()[1]) for line in (resolv.read_text().splitlines() if resolv.exists() else [])
            if line.split()[:1] == ["nameserver"] and len(line.split()) > 1]
    for line in sh("ip", "-o", "-4", "addr", "show", check=False).stdout.splitlines():
        f = line.split()
        if len(f) > 3 and not f[1].startswith("tjc"):
            used.append((f"address of {f[1]}", f[3]))
    for line in sh("ip", "-4", "route", "show", check=False).stdout.splitlines():
        f = line.split()
        dev = f[f.index("dev") + 1] if "dev" in f[:-1] else ""
        if f and f[0] not in ("default", "blackhole") and not dev.startswith("tjc"):
            used.append((f"route via {dev or '?'}", f[0]))
    return used


def conflicts(a: Addressing, resolv: Path = Path("/etc/resolv.conf")) -> list[str]:
    """What of the machine's own network the cluster's ranges would swallow: its blackhole routes
    would cut a nameserver, an interface or a route inside them off (DNS gone for the whole host)."""
    ours = [ipaddress.ip_network(n) for n in blackholes(a)]
    out = []
    for what, addr in _host_in_use(resolv):
        try:
            net = ipaddress.ip_interface(addr).network if "/" in addr else ipaddress.ip_network(addr)
        except ValueError:
            continue
        if net.version == 4 and any(net.overlaps(o) for o in ours):
            out.append(f"{what} {addr}")
    return out


def usable(index: int) -> bool:
    """Cluster number `index` is free (its bridge absent) and its ranges clash with nothing of the host's."""
    a = Addressing(index)
    return not Path(f"/sys/class/net/{a.bridge}").exists() and not conflicts(a)


def up_bridge(a: Addressing) -> None:
    """The cluster's bridge in the root namespace (idempotent), and its ranges held here."""
    clash = conflicts(a)
    if clash:
        raise RuntimeError(f"local cluster {a.index}: its ranges {', '.join(blackholes(a))} hold the host's "
                           f"{'; '.join(clash)}; pick another --index")
    for net in blackholes(a):
        sh("ip", "route", "replace", "blackhole", net)
    if sh("ip", "link", "show", a.bridge, check=False).returncode != 0:
        sh("ip", "link", "add", a.bridge, "type", "bridge")
    sh("ip", "addr", "replace", f"{a.gateway}/{a.node_net.prefixlen}", "dev", a.bridge)
    sh("ip", "link", "set", a.bridge, "up")


def down_all(a: Addressing) -> None:
    """Remove every namespace, route and the bridge of this cluster (what a crashed run left too)."""
    for ns in namespaces():
        if ns == a.prefix or ns.startswith(a.prefix + "-"):
            delete_ns(ns)
    sh("ip", "link", "delete", a.bridge, check=False)
    for net in blackholes(a):
        sh("ip", "route", "del", "blackhole", net, check=False)
    for line in sh("ip", "route", "show", check=False).stdout.splitlines():
        f = line.split()
        dest = f[0] if f else ""
        if "dev" in f[:-1] and not f[f.index("dev") + 1].startswith(a.prefix):
            continue  # the host's own route, never this cluster's to remove
        try:
            if ipaddress.ip_network(dest).subnet_of(ipaddress.ip_network(a.cluster_cidr)):
                sh("ip", "route", "del", dest, check=False)
        except (ValueError, TypeError):
            continue


def up_node(a: Addressing, node: str, number: int) -> str:
    """A node's namespace, wired to the bridge; returns the node's IP."""
    ns, ip = a.node_ns(node), a.node_ip(number)
    delete_ns(ns)
    sh("ip", "netns", "add", ns)
    host_end, node_end = _veth_name("tjn", ns), _veth_name("tjx", ns)
    sh("ip", "link", "delete", host_end, check=False)
    sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", node_end)
    sh("ip", "link", "set", node_end, "netns", ns)
    sh("ip", "link", "set", host_end, "master", a.bridge)
    sh("ip", "link", "set", host_end, "up")
    in_ns(ns, "ip", "link", "set", node_end, "name", "eth0")
    in_ns(ns, "ip", "addr", "add", f"{ip}/{a.node_net.prefixlen}", "dev", "eth0")
    in_ns(ns, "ip", "link", "set", "eth0", "up")
    in_ns(ns, "ip", "link", "set", "lo", "up")
    in_ns(ns, "ip", "route", "add", "default", "via", a.gateway)
    in_ns(ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
    return ip


def up_pod_bridge(ns: str, pod_cidr: str) -> str:
    """The node's pod bridge cbr0 holding the podCIDR's first address; returns that gateway."""
    net = ipaddress.ip_network(pod_cidr)
    gw = str(net.network_address + 1)
    if in_ns(ns, "ip", "link", "show", "cbr0", check=False).returncode != 0:
        in_ns(ns, "ip", "link", "add", "cbr0", "type", "bridge")
    in_ns(ns, "ip", "addr", "replace", f"{gw}/{net.prefixlen}", "dev", "cbr0")
    in_ns(ns, "ip", "link", "set", "cbr0", "up")
    return gw


def route(pod_cidr: str, via: str, ns: str | None = None) -> None:
    """Route a node's podCIDR to that node (in `ns`, or in the root namespace)."""
    cmd = ("ip", "route", "replace", pod_cidr, "via", via)
    (in_ns(ns, *cmd) if ns else sh(*cmd))


def up_pod(node_ns: str, pod_ns: str, ip: str, pod_cidr: str) -> None:
    """A pod's own namespace (its sandbox) with `ip`, on the node's cbr0."""
    net = ipaddress.ip_network(pod_cidr)
    delete_ns(pod_ns)
    sh("ip", "netns", "add", pod_ns)
    host_end, pod_end = _veth_name("vp", pod_ns), _veth_name("vq", pod_ns)
    in_ns(node_ns, "ip", "link", "delete", host_end, check=False)
    in_ns(node_ns, "ip", "link", "add", host_end, "type", "veth", "peer", "name", pod_end)
    in_ns(node_ns, "ip", "link", "set", pod_end, "netns", pod_ns)
    in_ns(node_ns, "ip", "link", "set", host_end, "master", "cbr0")
    in_ns(node_ns, "ip", "link", "set", host_end, "up")
    in_ns(pod_ns, "ip", "link", "set", pod_end, "name", "eth0")
    in_ns(pod_ns, "ip", "addr", "add", f"{ip}/{net.prefixlen}", "dev", "eth0")
    in_ns(pod_ns, "ip", "link", "set", "eth0", "up")
    in_ns(pod_ns, "ip", "link", "set", "lo", "up")
    in_ns(pod_ns, "ip", "route", "add", "default", "via", str(net.network_address + 1))


def down_pod(pod_ns: str) -> None:
    delete_ns(pod_ns)  # its veth goes with it
