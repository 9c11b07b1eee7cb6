"""The control plane of the local cluster, as a kubeadm cluster runs it, one process each:
etcd, kube-apiserver (Node,RBAC authorization, PodSecurity and NodeRestriction admission,
service-account tokens), kube-controller-manager (every default controller, each with its own
service account; node IPAM hands out podCIDRs), kube-scheduler and CoreDNS.

Timings are shortened for tests where Kubernetes makes them flags: a lost node is noticed in
`node_grace` seconds (default 40 on a real cluster) and its pods are evicted after
`eviction_toleration` seconds (default 300)."""
from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from .kubeletserver import API_SERVER_CLIENT
from .network import Addressing
from .pki import PKI, Pair

DOMAIN = "cluster.local"


@dataclass
class Proc:
    name: str
    argv: list[str]
    log: Path
    popen: Optional[subprocess.Popen] = None

    def start(self, env: Optional[dict] = None) -> Proc:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True, env=env)
        (self.log.parent / f"{self.name}.pid").write_text(str(self.popen.pid))
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        if not self.alive():
            return
        os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


def kubeconfig(path: Path, server: str, ca: Path, user: Pair, name: str = "tianji-local") -> Path:
    b64 = lambda p: base64.b64encode(Path(p).read_bytes()).decode()
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": name,
           "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": b64(ca)}}],
           "users": [{"name": name, "user": {"client-certificate-data": b64(user.cert),
                                             "client-key-data": b64(user.key)}}],
           "contexts": [{"name": name, "context": {"cluster": name, "user": name}}]}
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return path


def wait_port(host: str, port: int, timeout: float, proc: Proc) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.tail()}")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{proc.name} did not listen on {host}:{port} within {timeout:g} s:\n{proc.tail()}")


@dataclass
class ControlPlane:
    bin: Path
    root: Path
    net: Addressing
    api_port: int = 6443
    node_grace: int = 16
    eviction_toleration: int = 30
    procs: dict[str, Proc] = field(default_factory=dict)

    @property
    def server(self) -> str:
        return f"https://{self.net.gateway}:{self.api_port}"

    @property
    def etcd_port(self) -> int:
        return 23790 + 10 * self.net.index

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    def _proc(self, name: str, *args: str) -> Proc:
        p = Proc(name, [str(self.bin / name), *args], self.root / "logs" / f"{name}.log")
        self.procs[name] = p
        return p

    def start(self) -> None:
        self.pki = PKI(self.root / "pki")
        pki, gw = self.pki, self.net.gateway
        self.sa = pki.signing_key("sa")
        serving = pki.issue("apiserver", "kube-apiserver", server=True, hosts=(
            gw, "127.0.0.1", self._kubernetes_ip(), "kubernetes", "kubernetes.default",
            "kubernetes.default.svc", f"kubernetes.default.svc.{DOMAIN}", "localhost"))
        admin = pki.issue("admin", "tianji-admin", ("system:masters",))
        kubeconfig(self.admin_kubeconfig, self.server, pki.ca.cert, admin)
        self._etcd()
        self._apiserver(serving)
        self._wait_ready()
        self._controller_manager()
        self._scheduler()

    def _kubernetes_ip(self) -> str:
        import ipaddress

        return str(ipaddress.ip_network(self.net.service_cidr).network_address + 1)

    def _etcd(self) -> None:
        data = self.root / "etcd"
        data.mkdir(parents=True, exist_ok=True)
        data.chmod(0o700)
        p, peer = self.etcd_port, self.etcd_port + 1
        self._proc("etcd", f"--data-dir={data}", "--name=tianji-local",
                   f"--listen-client-urls=http://127.0.0.1:{p}", f"--advertise-client-urls=http://127.0.0.1:{p}",
                   f"--listen-peer-urls=http://127.0.0.1:{peer}",
                   f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                   f"--initial-cluster=tianji-local=http://127.0.0.1:{peer}",
                   "--quota-backend-bytes=2147483648", "--log-level=warn").start()
        wait_port("127.0.0.1", p, 60, self.procs["etcd"])

    def _apiserver(self, serving: Pair) -> None:
        pki = self.pki
        kubelet_client = pki.issue("apiserver-kubelet-client", API_SERVER_CLIENT)
        self._proc(
            "kube-apiserver", f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            f"--bind-address={self.net.gateway}", f"--advertise-address={self.net.gateway}",
            f"--secure-port={self.api_port}", f"--service-cluster-ip-range={self.net.service_cidr}",
            f"--client-ca-file={pki.ca.cert}", f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            # `kubectl logs` goes through the node agents' kubelet port (kubeletserver.py)
            f"--kubelet-client-certificate={kubelet_client.cert}", f"--kubelet-client-key={kubelet_client.key}",
            f"--kubelet-certificate-authority={pki.ca.cert}", "--kubelet-preferred-address-types=InternalIP",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            f"--service-account-issuer=https://kubernetes.default.svc.{DOMAIN}",
            f"--service-account-key-file={self.sa.cert}", f"--service-account-signing-key-file={self.sa.key}",
            "--allow-privileged=true", "--enable-priority-and-fairness=false",
            f"--default-not-ready-toleration-seconds={self.eviction_toleration}",
            f"--default-unreachable-toleration-seconds={self.eviction_toleration}",
            "--profiling=false", "--v=1").start()
        wait_port(self.net.gateway, self.api_port, 120, self.procs["kube-apiserver"])

    def kubectl(self, *args: str, check: bool = True, timeout: float = 60,
                input: Optional[str] = None) -> subprocess.CompletedProcess:
        res = subprocess.run([str(self.bin / "kubectl"), f"--kubeconfig={self.admin_kubeconfig}", *args],
                             capture_output=True, text=True, timeout=timeout, input=input)
        if check and res.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {res.stderr.strip()}")
        return res

    def _wait_ready(self, timeout: float = 120) -> None:
        """/readyz answers ok once the post-start hooks ran (bootstrap RBAC roles among them)."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if not self.procs["kube-apiserver"].alive():
                raise RuntimeError(f"kube-apiserver exited:\n{self.procs['kube-apiserver'].tail()}")
            res = self.kubectl("get", "--raw=/readyz", check=False, timeout=10)
            if res.returncode == 0 and res.stdout.strip() == "ok":
                return
            last = res.stderr.strip() or res.stdout.strip()
            time.sleep(0.5)
        raise RuntimeError(f"kube-apiserver not ready within {timeout:g} s: {last}")

    def _component_kubeconfig(self, name: str, user: str) -> Path:
        return kubeconfig(self.root / f"{name}.kubeconfig", self.server, self.pki.ca.cert,
                          self.pki.issue(name, user))

    def _controller_manager(self) -> None:
        kc = self._component_kubeconfig("controller-manager", "system:kube-controller-manager")
        self._proc(
            "kube-controller-manager", f"--kubeconfig={kc}", "--leader-elect=false", "--secure-port=0",
            "--use-service-account-credentials=true", "--controllers=*",
            f"--service-account-private-key-file={self.sa.key}", f"--root-ca-file={self.pki.ca.cert}",
            f"--cluster-signing-cert-file={self.pki.ca.cert}", f"--cluster-signing-key-file={self.pki.ca.key}",
            "--allocate-node-cidrs=true", f"--cluster-cidr={self.net.cluster_cidr}", "--node-cidr-mask-size=24",
            f"--service-cluster-ip-range={self.net.service_cidr}",
            f"--node-monitor-grace-period={self.node_grace}s", "--node-monitor-period=2s",
            "--concurrent-statefulset-syncs=5", "--v=1").start()

    def _scheduler(self) -> None:
        kc = self._component_kubeconfig("scheduler", "system:kube-scheduler")
        self._proc("kube-scheduler", f"--kubeconfig={kc}", "--leader-elect=false", "--secure-port=0",
                   "--v=1").start()

    def stop(self) -> None:
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            if name in self.procs:
                self.procs[name].stop()
