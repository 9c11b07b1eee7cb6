"""The node agent: one node of the local cluster, a kubelet for the real API server.

    nsenter --net=/run/netns/<node ns> python -m localcluster.nodeagent --name node-1 --ip ... \\
        --server https://10.200.0.1:6443 --ca ca.crt --cert node-1.crt --key node-1.key --root DIR

It registers its Node (capacity from flags: cpu, memory, nvidia.com/gpu, extended resources such
as an RDMA device), renews its Lease in kube-node-lease, and runs the pods that the scheduler
binds to it (`spec.nodeName`) as processes (localcluster.pods): a hostNetwork pod in the node's
network namespace on the node IP, any other pod in a namespace of its own with an IP from the
node's podCIDR (allocated by the controller manager's node IPAM). Every pod gets /etc/hosts,
/etc/resolv.conf pointing at the cluster DNS (dnsPolicy honoured), the service-account token
through its projected volume (TokenRequest, bound to the pod), and KUBERNETES_SERVICE_HOST/PORT.
Its identity is `system:node:<name>`, so the Node authorizer limits it to its own pods' objects.

`--runtime=crun`: each pod's container runs from its image under crun instead (crunruntime.py),
in the same network namespace, with the same volumes, env, stop and log file."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import shutil
import signal
from pathlib import Path
from typing import Any, Optional
from urllib.parse import quote

import aiohttp

from . import network
from .api import Api, ApiError, retrying
from .crunruntime import CrunRuntime
from .kubeletserver import KubeletServer
from .nodeobject import NodeSpec
from .pods import Incarnation, Node, PodStartError, PodWorker, iso

log = logging.getLogger("tianji.localcluster.nodeagent")
LEASE_S, RENEW_S, STATUS_S = 40, 2.0, 10.0
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def pod_path(namespace: str, name: str, sub: str = "") -> str:
    return f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}" + (f"/{sub}" if sub else "")


class NodeAgent(Node):
    def __init__(self, api: Api, spec: NodeSpec, root: Path, *, cluster_ns: str, dns_ip: str, domain: str,
                 api_host: str, api_port: int, runtime: str = "process", **kwargs: Any):
        super().__init__(root, node_name=spec.name, host_ip=spec.ip, **kwargs)
        self.crun: Optional[CrunRuntime] = CrunRuntime(self) if runtime == "crun" else None
        self.api, self.spec = api, spec
        self.net_api: Optional[Api] = None  # the network plugin's identity (routes between nodes)
        self.node_ns, self.dns_ip, self.domain = cluster_ns, dns_ip, domain
        self.api_host, self.api_port = api_host, api_port
        self.pod_cidr: Optional[str] = None
        self.free_ips: list[str] = []
        self.cache: dict[str, dict] = {}  # uid -> pod, from the watch
        self.wake = asyncio.Event()

    # ------------------------------------------------------------ registration and heartbeats
    async def register(self) -> None:
        """Every request tried again while the API server is busy (a node that gave up here would
        be a node that never runs a pod)."""
        async def create() -> None:
            try:
                await self.api.create("/api/v1/nodes", self.spec.object())
            except ApiError as e:
                if e.status != 409:  # already registered (a restarted node keeps its object)
                    raise
        await retrying("registering the node", create, log)
        await retrying("the node's status", lambda: self.api.merge_patch(
            f"/api/v1/nodes/{self.node_name}/status", {"status": self.spec.status()}), log)
        while self.pod_cidr is None:  # node IPAM in the controller manager hands out the podCIDR
            node = await retrying("reading the node", lambda: self.api.get(f"/api/v1/nodes/{self.node_name}"),
                                  log) or {}
            self.pod_cidr = (node.get("spec") or {}).get("podCIDR")
            if self.pod_cidr is None:
                await asyncio.sleep(0.5)
        hosts = list(ipaddress.ip_network(self.pod_cidr).hosts())
        self.free_ips = [str(h) for h in hosts[1:]]  # the first is cbr0, the pods' gateway
        network.up_pod_bridge(self.node_ns, self.pod_cidr)
        log.info("node %s registered, podCIDR %s", self.node_name, self.pod_cidr)

    async def heartbeat(self) -> None:
        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.node_name}"
        last_status = 0.0
        loop = asyncio.get_running_loop()
        while True:
            try:
                if await self.api.merge_patch(lease_path, self.spec.lease(LEASE_S)) is None:
                    await self.api.create("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                                          self.spec.lease(LEASE_S))
                if loop.time() - last_status > STATUS_S:
                    await self.api.merge_patch(f"/api/v1/nodes/{self.node_name}/status",
                                               {"status": self.spec.status()})
                    last_status = loop.time()
            except (ApiError, aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                log.warning("heartbeat: %s", e)
            try:
                await self.sync_routes()
            except (ApiError, aiohttp.ClientError, asyncio.TimeoutError, OSError, RuntimeError) as e:
                log.warning("routes: %s", e)
            await asyncio.sleep(RENEW_S)

    async def sync_routes(self) -> None:
        """Every other node's podCIDR via its IP (host-gateway routing). Read with the network
        identity (`net_api`): the Node authorizer lets a node read only its own Node, as a CNI
        plugin's daemon reads nodes with credentials of its own."""
        if self.net_api is None:
            return
        nodes = (await self.net_api.get("/api/v1/nodes") or {}).get("items") or []
        for n in nodes:
            cidr = (n.get("spec") or {}).get("podCIDR")
            ip = next((a["address"] for a in (n.get("status") or {}).get("addresses") or []
                       if a.get("type") == "InternalIP"), None)
            if cidr and ip and n["metadata"]["name"] != self.node_name:
                network.route(cidr, ip)

    # ------------------------------------------------------------ pods from the API
    def on_list(self, items: list[dict]) -> None:
        self.cache = {p["metadata"]["uid"]: p for p in items}
        self.wake.set()

    def on_event(self, kind: str, pod: dict) -> None:
        uid = pod["metadata"]["uid"]
        if kind == "DELETED":
            self.cache.pop(uid, None)
        else:
            self.cache[uid] = pod
        self.wake.set()

    async def sync_loop(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            for uid, pod in list(self.cache.items()):
                w = self.workers.get(uid)
                if w is not None:
                    w.observe(pod)
                elif pod["metadata"].get("deletionTimestamp"):
                    await self._remove_unstarted(pod)  # nothing of it runs here
                elif (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                    self.start_worker(pod)
            for uid, w in list(self.workers.items()):
                if uid not in self.cache:
                    w.observe(None)
                    if w.task is not None and w.task.done():
                        del self.workers[uid]

    async def _remove_unstarted(self, pod: dict) -> None:
        meta = pod["metadata"]
        with contextlib.suppress(ApiError):
            await self.api.delete(pod_path(meta["namespace"], meta["name"]),
                                  {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})

    # ------------------------------------------------------------ the Node hooks
    def _host_network(self, w: PodWorker) -> bool:
        return bool(w.spec.get("hostNetwork"))

    async def sandbox(self, w: PodWorker) -> str:
        if self._host_network(w):
            ip = self.host_ip
        else:
            ip = self.free_ips.pop(0)
            w.sandbox_ns = network.pod_ns_name(self.node_ns, w.uid)
            await asyncio.to_thread(network.up_pod, self.node_ns, w.sandbox_ns, ip, self.pod_cidr)
        self._write_pod_files(w, ip)
        return ip

    async def release_sandbox(self, w: PodWorker) -> None:
        if self.crun is not None:
            await self.crun.release(w)
        ns = w.sandbox_ns
        if ns:
            await asyncio.to_thread(network.down_pod, ns)
            w.sandbox_ns = None
            if w.ip:
                self.free_ips.append(w.ip)

    def sandbox_prefix(self, w: PodWorker) -> list[str]:
        ns = w.sandbox_ns
        return ["nsenter", f"--net={network.NETNS_DIR / ns}"] if ns else []

    def _write_pod_files(self, w: PodWorker, ip: str) -> None:
        etc = w.dir / "etc"
        etc.mkdir(parents=True, exist_ok=True)
        names = [w.hostname]
        if w.spec.get("subdomain"):
            fq = f"{w.hostname}.{w.spec['subdomain']}.{w.namespace}.svc.{self.domain}"
            names = [fq, w.hostname]
        (etc / "hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                                   f"{ip}\t{' '.join(names)}\n")
        (etc / "resolv.conf").write_text(self._resolv_conf(w))

    def _resolv_conf(self, w: PodWorker) -> str:
        policy = w.spec.get("dnsPolicy", "ClusterFirst")
        if policy == "Default" or (policy == "ClusterFirst" and self._host_network(w)):
            return Path("/etc/resolv.conf").read_text() if Path("/etc/resolv.conf").exists() else ""
        search = [f"{w.namespace}.svc.{self.domain}", f"svc.{self.domain}", self.domain]
        servers = [self.dns_ip]
        options = ["ndots:5"]
        cfg = w.spec.get("dnsConfig") or {}
        if policy == "None":
            servers, search, options = [], [], []
        servers += cfg.get("nameservers") or []
        search += cfg.get("searches") or []
        options += [o["name"] + (f":{o['value']}" if o.get("value") else "") for o in cfg.get("options") or []]
        return "".join(f"nameserver {s}\n" for s in servers) + (
            f"search {' '.join(search)}\n" if search else "") + (f"options {' '.join(options)}\n" if options else "")

    def sandbox_files(self, w: PodWorker) -> list[tuple[Path, str, bool]]:
        return [(w.dir / "etc" / "hosts", "/etc/hosts", False),
                (w.dir / "etc" / "resolv.conf", "/etc/resolv.conf", True)]

    def pod_env(self, w: PodWorker) -> dict[str, str]:
        # No kube-proxy: the API server's own endpoint stands in for the `kubernetes` Service's IP.
        port = str(self.api_port)
        return {"KUBERNETES_SERVICE_HOST": self.api_host, "KUBERNETES_SERVICE_PORT": port,
                "KUBERNETES_SERVICE_PORT_HTTPS": port, "KUBERNETES_PORT": f"tcp://{self.api_host}:{port}"}

    async def volume_source(self, w: PodWorker, vol: dict) -> Optional[Path]:
        if "persistentVolumeClaim" in vol:
            return await self._claim_folder(w, vol["persistentVolumeClaim"]["claimName"])
        if "projected" not in vol:
            return None
        from .projected import project

        target = w.dir / "volumes" / "projected" / vol["name"]
        return await project(self, w, vol["projected"], target)

    async def base_env(self, w: PodWorker) -> dict[str, str]:
        return await self.crun.base_env(w) if self.crun is not None else await super().base_env(w)

    async def launch(self, w: PodWorker, inc: Incarnation, mounts: list[tuple[Path, str, bool]]) -> None:
        if self.crun is not None:
            await self.crun.launch(w, inc, mounts)
        else:
            await super().launch(w, inc, mounts)

    async def _claim_folder(self, w: PodWorker, claim: str) -> Path:
        """A bound claim's folder (the local cluster's volumes are hostPath PVs: provisioner.py). The
        Node authorizer lets this node read the claims and volumes of its own pods only."""
        pvc = await self._pod_input(f"/api/v1/namespaces/{w.namespace}/persistentvolumeclaims/{claim}")
        if pvc is None or (pvc.get("status") or {}).get("phase") != "Bound":
            raise PodStartError("ContainerCreating", f'persistentvolumeclaim "{claim}" is not bound')
        pv = await self._pod_input(f"/api/v1/persistentvolumes/{pvc['spec']['volumeName']}")
        path = ((pv or {}).get("spec") or {}).get("hostPath", {}).get("path")
        if not path:
            raise PodStartError("ContainerCreating", f'volume of claim "{claim}" is not a local folder')
        Path(path).mkdir(parents=True, exist_ok=True)
        return Path(path)

    async def read(self, resource: str, namespace: str, name: str) -> Optional[dict]:
        return await self._pod_input(f"/api/v1/namespaces/{quote(namespace)}/{resource}/{quote(name)}")

    async def _pod_input(self, path: str) -> Optional[dict]:
        """GET an object a pod's start needs (None: not found). The Node authorizer lets a node read
        a pod's configmaps, secrets and claims only once its graph holds the pod's binding, which
        trails the binding by an informer's delay: a 403 then (or a lost connection) is a start to
        retry, as the kubelet's "MountVolume.SetUp failed", not a pod worker that dies."""
        try:
            return await self.api.get(path)
        except (ApiError, aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise PodStartError("ContainerCreating", f"MountVolume.SetUp failed: {e}") from e

    async def write_status(self, w: PodWorker) -> None:
        body = {"metadata": {"uid": w.uid}, "status": json.loads(json.dumps(w.status))}
        try:
            await self.api.merge_patch(pod_path(w.namespace, w.name, "status"), body)
        except ApiError as e:
            if e.status != 409:  # 409: the uid differs (a new pod of the same name): not ours any more
                log.warning("status of %s/%s: %s", w.namespace, w.name, e)

    async def remove(self, w: PodWorker) -> None:
        with contextlib.suppress(ApiError):
            await self.api.delete(pod_path(w.namespace, w.name),
                                  {"gracePeriodSeconds": 0, "preconditions": {"uid": w.uid}})

    def event(self, w: PodWorker, reason: str, message: str = "") -> None:
        super().event(w, reason, message)
        asyncio.get_running_loop().create_task(self._post_event(w, reason, message))

    async def _post_event(self, w: PodWorker, reason: str, message: str) -> None:
        t = iso()
        ev = {"apiVersion": "v1", "kind": "Event",
              "metadata": {"generateName": f"{w.name}.", "namespace": w.namespace},
              "involvedObject": {"kind": "Pod", "namespace": w.namespace, "name": w.name, "uid": w.uid,
                                 "apiVersion": "v1"},
              "reason": reason, "message": message or reason, "type": "Warning" if reason == "BackOff" else "Normal",
              "source": {"component": "kubelet", "host": self.node_name}, "firstTimestamp": t, "lastTimestamp": t,
              "count": 1}
        with contextlib.suppress(ApiError, aiohttp.ClientError, asyncio.TimeoutError, OSError):
            await self.api.create(f"/api/v1/namespaces/{quote(w.namespace)}/events", ev)

    # ------------------------------------------------------------ run
    async def run(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.http = aiohttp.ClientSession()
        await self.register()
        tasks = [asyncio.create_task(self.heartbeat(), name="heartbeat"),
                 asyncio.create_task(self.sync_loop(), name="sync"),
                 asyncio.create_task(self.api.list_and_watch(
                     "/api/v1/pods", self.on_list, self.on_event, fieldSelector=f"spec.nodeName={self.node_name}"),
                     name="watch")]
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        done = asyncio.create_task(stop.wait())
        await asyncio.wait([done, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for t in tasks:  # a loop that died (not cancelled) is a bug: say so
            if not t.cancelled() and t.exception() is not None:
                log.error("node agent: %s failed: %r", t.get_name(), t.exception())
        await self.stop_pods(grace=5.0)
        if self.crun is not None:
            await self.crun.close()
        await self.http.close()


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m localcluster.nodeagent", description=__doc__.split("\n")[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--ip", required=True)
    ap.add_argument("--netns", required=True, help="this node's network namespace (pods' sandboxes hang off it)")
    ap.add_argument("--server", required=True)
    ap.add_argument("--ca", required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--net-cert", help="client certificate of the network plugin (reads every Node's podCIDR)")
    ap.add_argument("--net-key")
    ap.add_argument("--serving-cert", help="the kubelet port's certificate (for this node's IP): `kubectl logs`")
    ap.add_argument("--serving-key")
    ap.add_argument("--root", required=True, type=Path)
    ap.add_argument("--dns", required=True, help="cluster DNS server address")
    ap.add_argument("--domain", default="cluster.local")
    ap.add_argument("--cpu", default="4")
    ap.add_argument("--memory", default="8Gi")
    ap.add_argument("--gpus", type=int, default=0)
    ap.add_argument("--resource", action="append", default=[], metavar="NAME=COUNT",
                    help="an extended resource, e.g. rdma/hca=4")
    ap.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--backoff-base", type=float, default=10.0)
    ap.add_argument("--backoff-max", type=float, default=300.0)
    ap.add_argument("--probe-period-cap", type=float, default=None)
    ap.add_argument("--runtime", choices=["process", "crun"], default="process",
                    help="pods as processes from this host's Python, or as crun containers from their images")
    a = ap.parse_args(argv)
    missing = [t for t in ("crun", "buildah", "unshare") if a.runtime == "crun" and shutil.which(t) is None]
    if missing:
        ap.error(f"--runtime=crun needs {', '.join(missing)} (make image-tools)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec = NodeSpec(a.name, a.ip, cpu=a.cpu, memory=a.memory, gpus=a.gpus,
                    extended=dict(r.split("=", 1) for r in a.resource), labels=dict(x.split("=", 1) for x in a.label))
    host = a.server.split("//", 1)[1].rsplit(":", 1)

    async def amain() -> None:
        async with contextlib.AsyncExitStack() as stack:
            api = await stack.enter_async_context(Api(a.server, a.ca, a.cert, a.key))
            agent = NodeAgent(api, spec, a.root, cluster_ns=a.netns, dns_ip=a.dns, domain=a.domain,
                              api_host=host[0], api_port=int(host[1]), backoff_base=a.backoff_base,
                              backoff_max=a.backoff_max, probe_period_cap=a.probe_period_cap,
                              runtime=a.runtime)
            if a.net_cert:
                agent.net_api = await stack.enter_async_context(Api(a.server, a.ca, a.net_cert, a.net_key))
            if a.serving_cert:
                server = KubeletServer(agent, a.ip, Path(a.ca), Path(a.serving_cert), Path(a.serving_key))
                await server.start()
                stack.push_async_callback(server.stop)
            await agent.run()

    os.environ.pop("KUBECONFIG", None)
    asyncio.run(amain())


if __name__ == "__main__":
    main()
