"""A real node: the kubelet and containerd (CRI, runc, the bridge CNI plugin), as a machine of its own.

Each node is a PID, mount and network namespace: its first process (`probe pause`, PID 1 of the
node) holds them, containerd and the kubelet are entered into them, and every shim and container
they start lives inside. So a node is switched off the way a power loss does it: SIGKILL to its
PID 1 and the kernel kills every process of the node; its mounts go with its mount namespace.

    root namespace                     node tjc<C>-<node> (own net, mount and PID namespace)
    bridge tjc<C>br 10.<B>.0.1   <-->  eth0 node IP; kubelet :10250; containerd (socket in its folder)
    registry :5000, API server,        cni0 (bridge CNI plugin, host-local IPAM from the node's podCIDR)
    cluster DNS                          <--> pods, each in a sandbox of the probe image

The kubelet runs on this machine's cgroup v1 hybrid layout with `failCgroupV1: false` (KEP-5573),
the cgroupfs driver and a cgroup root of the node's own name; images come from the cluster's
registry (http, `hosts.toml`), the pod sandbox is the probe image (`cluster/go/probe`)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from . import network
from .controlplane import DOMAIN, Proc, kubeconfig
from .kubeletserver import API_SERVER_CLIENT

if TYPE_CHECKING:
    from .cluster import NodeHandle

REAL_PROGRAMS = ("kubelet", "containerd", "containerd-shim-runc-v2", "bridge", "host-local", "loopback",
                 "portmap", "registry", "crane", "probe")
RUNC = "/usr/sbin/runc"
REGISTRY_PORT = 5000
PROBE_IMAGE = "tianji/probe:1"
KIND_LABEL = "tianji.local/node-kind"
# A cluster of real nodes (`make cluster-up NODES=real`, the tests' `real`) has one process-mode
# node more, for the operator's pod (it runs from the checkout: no operator image to build). The
# real nodes are tainted, so that only pods that ask land there: the operator's worker pods do,
# with WORKER_DEFAULTS as the chart's `operator.workerDefaults`, as an admin gives a node pool.
TAINT_KEY = "tianji.local/real-node"
TAINT = f"{TAINT_KEY}=true:NoSchedule"
TOLERATION = {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
WORKER_DEFAULTS = {"nodeSelector": {KIND_LABEL: "real"}, "tolerations": [TOLERATION]}

# The API server's client certificate may use every kubelet API (logs, exec, port-forward), as
# kubeadm binds it; the kubelet asks the API server (webhook authorization) for each request.
KUBELET_API_RBAC = f"""
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: "tianji:apiserver-kubelet-client"}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:kubelet-api-admin"}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: "{API_SERVER_CLIENT}"}}]
"""


def cgroup_root(node: NodeHandle) -> str:
    return f"/{node.netns}"


def _containerd_config(node: NodeHandle, bin_dir: Path) -> Path:
    d = node.root / "containerd"
    reg = node.cluster.registry_host
    hosts = d / "certs.d" / reg / "hosts.toml"
    hosts.parent.mkdir(parents=True, exist_ok=True)
    hosts.write_text(f'server = "http://{reg}"\n\n[host."http://{reg}"]\n  capabilities = ["pull", "resolve"]\n')
    cni = node.root / "cni"
    (cni / "net.d").mkdir(parents=True, exist_ok=True)
    # containerd writes the node's CNI configuration from this template once the kubelet tells it
    # the node's podCIDR (CRI UpdateRuntimeConfig).
    (cni / "template").write_text(json.dumps({
        "cniVersion": "1.0.0", "name": "tianji", "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": "{{.PodCIDR}}"}]],
                      "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(cni / "ipam")}},
            {"type": "portmap", "capabilities": {"portMappings": True}}]}, indent=1))
    cri_rt, cri_img = '"io.containerd.cri.v1.runtime"', '"io.containerd.cri.v1.images"'
    config = d / "config.toml"
    config.write_text(f"""version = 3
root = "{d / 'root'}"
state = "{d / 'state'}"
[grpc]
  address = "{d / 'containerd.sock'}"
[plugins.{cri_rt}]
  enable_cdi = false
  # No CAP_SYS_RESOURCE in this machine's bounding set: an OOM score below the runtime's own
  # (the kubelet asks -998 for sandboxes) is refused by the kernel; clamp it instead.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
[plugins.{cri_rt}.containerd]
  default_runtime_name = "runc"
[plugins.{cri_rt}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins.{cri_rt}.containerd.runtimes.runc.options]
  BinaryName = "{RUNC}"
  Root = "{d / 'runc'}"
  SystemdCgroup = false
[plugins.{cri_rt}.cni]
  bin_dirs = ["{bin_dir}"]
  conf_dir = "{cni / 'net.d'}"
  conf_template = "{cni / 'template'}"
[plugins.{cri_img}]
  snapshotter = "overlayfs"
  discard_unpacked_layers = true  # the checkout image is 5 GB: the node keeps its snapshot only
[plugins.{cri_img}.pinned_images]
  sandbox = "{reg}/{PROBE_IMAGE}"
[plugins.{cri_img}.registry]
  config_path = "{d / 'certs.d'}"
[plugins."io.containerd.nri.v1.nri"]
  disable = true  # its socket is machine-wide (/var/run/nri), and the nodes share the machine
""")
    return config


def _kubelet_config(node: NodeHandle, serving) -> Path:
    c = node.cluster
    d = node.root / "kubelet"
    d.mkdir(parents=True, exist_ok=True)
    resolv = node.root / "resolv.conf"
    resolv.write_text(f"nameserver {c.net.gateway}\n")
    doc = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "failCgroupV1": False, "failSwapOn": False, "cgroupDriver": "cgroupfs", "cgroupRoot": cgroup_root(node),
        "address": node.ip, "port": 10250, "readOnlyPort": 0, "healthzBindAddress": node.ip,
        "tlsCertFile": str(serving.cert), "tlsPrivateKeyFile": str(serving.key),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(c.cp.pki.ca.cert)}},
        "authorization": {"mode": "Webhook"},
        "clusterDNS": [c.net.gateway], "clusterDomain": DOMAIN, "resolvConf": str(resolv),
        "containerRuntimeEndpoint": f"unix://{node.root / 'containerd' / 'containerd.sock'}",
        "podLogsDir": str(node.root / "pod-logs"), "staticPodPath": "",
        "registerNode": True, "nodeStatusUpdateFrequency": "4s", "nodeLeaseDurationSeconds": 10,
        "syncFrequency": "10s", "fileCheckFrequency": "10s", "imageMinimumGCAge": "1h",
        # One machine holds every node: eviction by disk or memory would be the machine's, not the node's.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "localStorageCapacityIsolation": False, "protectKernelDefaults": False,
        "serializeImagePulls": False, "shutdownGracePeriod": "0s",
        "registerWithTaints": [_taint(t) for t in node.taints],
    }
    path = d / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _taint(text: str) -> dict:
    """key=value:Effect (or key:Effect) as the kubelet's registerWithTaints takes it."""
    kv, _, effect = text.rpartition(":")
    key, _, value = kv.partition("=")
    return {"key": key, "value": value, "effect": effect} if value else {"key": key, "effect": effect}


def _init_pid(unshare: Proc, timeout: float = 10.0) -> int:
    """The node's PID 1 as this machine sees it: the child `unshare --fork` made."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            kids = Path(f"/proc/{unshare.popen.pid}/task/{unshare.popen.pid}/children").read_text().split()
        except FileNotFoundError:
            kids = []
        if kids:
            return int(kids[0])
        if not unshare.alive():
            raise RuntimeError(f"node namespace holder exited:\n{unshare.tail()}")
        time.sleep(0.05)
    raise RuntimeError("node namespace holder started no child")


def _wait_socket(path: Path, proc: Proc, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(str(path))
                return
            except OSError:
                pass
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.tail(40)}")
        time.sleep(0.1)
    raise RuntimeError(f"{proc.name}: no socket {path} within {timeout:g} s:\n{proc.tail(40)}")


def start(node: NodeHandle) -> None:
    """Switch the node on: its namespaces, containerd, then the kubelet, which registers the Node."""
    c = node.cluster
    network.up_node(c.net, node.name, node.number)
    network.in_ns(node.netns, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1", check=False)
    pair = c.cp.pki.issue(f"node-{node.name}", f"system:node:{node.name}", ("system:nodes",))
    serving = c.cp.pki.issue(f"kubelet-{node.name}", f"system:node:{node.name}", server=True,
                             hosts=(node.ip, node.name))
    make_cgroups(cgroup_root(node))
    logs = c.root / "logs"
    env = {**os.environ, "PATH": os.pathsep.join([str(c.bin), "/usr/sbin", "/usr/bin", "/sbin", "/bin"])}
    holder = Proc(f"node-{node.name}", ["nsenter", f"--net={network.NETNS_DIR / node.netns}", "unshare",
                                         "--mount", "--pid", "--fork", "--mount-proc", "--propagation", "private",
                                         "--", str(c.bin / "probe"), "pause"], logs / f"node-{node.name}.log")
    node.agent = holder.start(env)
    node.init_pid = _init_pid(holder)
    enter = ["nsenter", f"--target={node.init_pid}", "--net", "--mount", "--pid", "--"]
    for state in ("state", "runc"):  # what a running node keeps in memory: gone at a power loss
        shutil.rmtree(node.root / "containerd" / state, ignore_errors=True)
    for sock in (node.root / "containerd").glob("containerd.sock*"):
        sock.unlink()
    config = _containerd_config(node, c.bin)
    node.containerd = Proc(f"containerd-{node.name}", [*enter, str(c.bin / "containerd"), "--config", str(config)],
                           logs / f"containerd-{node.name}.log").start(env)
    _wait_socket(node.root / "containerd" / "containerd.sock", node.containerd)
    kc = kubeconfig(node.root / "kubelet.kubeconfig", c.cp.server, c.cp.pki.ca.cert, pair)
    labels = ",".join(f"{k}={v}" for k, v in node.labels.items())
    node.kubelet = Proc(f"kubelet-{node.name}", [
        *enter, str(c.bin / "kubelet"), f"--config={_kubelet_config(node, serving)}", f"--kubeconfig={kc}",
        f"--hostname-override={node.name}", f"--node-ip={node.ip}", f"--root-dir={node.root / 'kubelet'}",
        f"--cert-dir={node.root / 'kubelet' / 'pki'}", *([f"--node-labels={labels}"] if labels else []), "--v=1"],
        logs / f"kubelet-{node.name}.log").start(env)


def alive(node: NodeHandle) -> bool:
    return all(p is not None and p.alive() for p in (node.agent, node.containerd, node.kubelet))


def tails(node: NodeHandle, lines: int = 30) -> str:
    return "\n".join(f"--- {p.name} ({'running' if p.alive() else 'exited'})\n{p.tail(lines)}"
                     for p in (node.agent, node.containerd, node.kubelet) if p is not None)


def stop(node: NodeHandle) -> None:
    """Power off: the node's PID 1 SIGKILLed takes every process of the node with it."""
    pid = node.init_pid
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for p in (node.kubelet, node.containerd, node.agent):
        if p is not None and p.popen is not None:
            try:
                os.killpg(p.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.popen.wait(10)
    node.init_pid = None
    remove_cgroups(cgroup_root(node))


def make_cgroups(root: str) -> None:
    """The node's cgroup root in every v1 hierarchy (the kubelet makes what is below it)."""
    base = Path("/sys/fs/cgroup")
    for hierarchy in base.iterdir() if base.is_dir() else ():
        if hierarchy.name == "unified" or not (hierarchy / "cgroup.procs").exists():
            continue
        top = hierarchy / root.lstrip("/")
        top.mkdir(exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):  # v1 cpuset: empty until copied from the parent
            if (top / knob).exists() and not (top / knob).read_text().strip():
                (top / knob).write_text((hierarchy / knob).read_text())


def remove_cgroups(root: str) -> None:
    """The kubelet's cgroups of a node that is off (empty now), deepest first, in every v1 hierarchy."""
    base = Path("/sys/fs/cgroup")
    for hierarchy in base.iterdir() if base.is_dir() else ():
        top = hierarchy / root.lstrip("/")
        if not top.is_dir():
            continue
        for folder in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            _rmdir(folder)
        _rmdir(top)


def sweep_cgroups(prefix: str) -> None:
    """Every node cgroup root of cluster `prefix` (tjc<N>-*) a killed cluster left."""
    names = {p.name for p in Path("/sys/fs/cgroup").glob(f"*/{prefix}-*") if p.is_dir()}
    for name in sorted(names):
        remove_cgroups(f"/{name}")


def _rmdir(folder: Path) -> None:
    for _ in range(50):  # a killed process leaves its cgroup a moment after it is reaped
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


def route_pods(node: NodeHandle, cidrs: dict[str, tuple[str, str]]) -> None:
    """This node's routes to every other node's pods (host-gateway, as the process mode's agent keeps)."""
    for name, (cidr, ip) in cidrs.items():
        if name != node.name:
            network.route(cidr, ip, node.netns)


def start_registry(cluster) -> Proc:
    """The cluster's image registry (distribution), on the bridge address; storage under the cluster's folder."""
    cfg = cluster.root / "registry.yaml"
    cfg.write_text(yaml.safe_dump({
        "version": 0.1, "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(cluster.root / "registry")}, "delete": {"enabled": True}},
        "http": {"addr": cluster.registry_host}}))
    proc = Proc("registry", [str(cluster.bin / "registry"), "serve", str(cfg)],
                cluster.root / "logs" / "registry.log").start()
    from .controlplane import wait_port

    wait_port(cluster.net.gateway, REGISTRY_PORT, 30, proc)
    return proc


def push_probe_image(cluster) -> str:
    """The probe image (one static binary: the sandbox's pause and the tests' probes), pushed by crane."""
    import tarfile

    layer = cluster.root / "probe-layer.tar"
    with tarfile.open(layer, "w") as tar:
        info = tar.gettarinfo(str(cluster.bin / "probe"), arcname="probe")
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        with open(cluster.bin / "probe", "rb") as f:
            tar.addfile(info, f)
    ref = f"{cluster.registry_host}/{PROBE_IMAGE}"
    crane = str(cluster.bin / "crane")
    for argv in ([crane, "append", "--insecure", "-f", str(layer), "-t", ref],
                 [crane, "mutate", "--insecure", ref, "--entrypoint=/probe", "--cmd=pause"]):
        res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {res.stderr.strip()}")
    return ref
