"""A kubelet for the API emulator: every Pod runs as a local process started from its spec.

The pod runtime itself (volumes, env, container processes, probes, restarts, status,
graceful termination) is the local cluster's (cluster/localcluster/pods.py), shared with the
node agent that runs pods for a real API server. This module adds what only the emulator needs:

* scheduler: binds each new pod to its node (`spec.nodeName`); there is no node capacity;
* pod sandbox: one loopback address per pod (`LoopbackIPAM`) as `status.podIP`; `ClusterDNS`
  keeps one cluster hosts file, bind-mounted at /etc/hosts in every pod (headless-Service
  records), in place of cluster DNS;
* API writes go straight into the emulator's store (status as the kubelet, binding as the
  scheduler, the final delete with a grace period of 0); the emulator marks deleted pods
  with deletionTimestamp (`graceful_pod_deletion`). The final delete comes `removal_delay`
  seconds after the pod's terminal status (0: at once): a deleted pod whose worker has
  stopped lingers, as under a slow kubelet or a finalizer;
* persistentVolumeClaim volumes (a provisioner's): the claim must exist; each claim object
  gets one directory under `root`/pvc, kept while pods come and go (`claim_dirs`).

Each container incarnation is an `Incarnation` (in `Kubelet.incarnations`): its pid, argv, env,
log file and termination-message file stay on disk under `root` after the pod is gone.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
from pathlib import Path
from typing import Any, Optional

import aiohttp
import kmock

from localcluster.pods import (  # noqa: F401  (re-exported for the tests)
    Incarnation, Node, PodStartError, PodWorker, processes_in_groups, unavailable_reason)

from .emulator import KubeEmulator, Write

log = logging.getLogger("tests.kubelet")

PODS = "v1/pods"
SERVICES = "v1/services"


# ----------------------------------------------------------------- network
class LoopbackIPAM:
    """Stands in for the CNI plugin's IP address management: each pod gets its own address in
    127/8 (Linux routes the whole block to `lo`, so any of them binds without set-up).

    Addresses come from one random 127.B.C.0/24..-style range per instance (so that two harnesses
    on one machine do not collide) and are never reused within it."""

    def __init__(self, seed: Optional[int] = None):
        rnd = random.Random(seed)
        self._b = rnd.randrange(64, 250)
        self._n = rnd.randrange(0, 200) * 256 + 2

    def allocate(self) -> str:
        c, d = divmod(self._n, 256)
        self._n += 1
        if d in (0, 255):  # skip network/broadcast-looking addresses
            return self.allocate()
        return f"127.{self._b}.{c % 256}.{d}"


class ClusterDNS:
    """Stands in for cluster DNS (CoreDNS's records for headless Services) and the kubelet-managed
    /etc/hosts: one hosts file, bind-mounted at /etc/hosts in every pod and rewritten in place
    (same inode, so the bind mounts see it) whenever the records change.

    A pod gets records when it has a podIP, `spec.hostname` and `spec.subdomain`, and a headless
    Service named like the subdomain in its namespace selects it, ready or not when the Service
    has publishNotReadyAddresses (else only while Ready), until the pod reaches a terminal phase:

        <hostname>.<subdomain>.<namespace>.svc.<domain>  <hostname>.<subdomain>.<namespace>.svc
        <hostname>.<subdomain>.<namespace>  <hostname>.<subdomain>

    The short forms are what the resolver's search path (<namespace>.svc.<domain>, svc.<domain>)
    would expand in a pod of that namespace."""

    HEADER = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"

    def __init__(self, path: Path, domain: str = "cluster.local"):
        self.path = Path(path)
        self.domain = domain
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(self.HEADER)
        self.content = self.HEADER
        self.rewrites = 0

    @staticmethod
    def _selects(svc: dict, labels: dict) -> bool:
        sel = (svc.get("spec") or {}).get("selector") or {}
        return bool(sel) and all(labels.get(k) == v for k, v in sel.items())

    def records(self, pods: list[dict], services: list[dict]) -> list[tuple[str, list[str]]]:
        headless = {(s["metadata"].get("namespace"), s["metadata"]["name"]): s for s in services
                    if (s.get("spec") or {}).get("clusterIP") == "None"}
        out = []
        for pod in pods:
            meta, spec, st = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
            ip, host, sub, ns = st.get("podIP"), spec.get("hostname"), spec.get("subdomain"), meta.get("namespace")
            if not (ip and host and sub) or st.get("phase") in ("Succeeded", "Failed"):
                continue
            svc = headless.get((ns, sub))
            if svc is None or not self._selects(svc, meta.get("labels") or {}):
                continue
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
            if not ready and not (svc.get("spec") or {}).get("publishNotReadyAddresses"):
                continue
            fq = f"{host}.{sub}.{ns}.svc"
            out.append((ip, [f"{fq}.{self.domain}", fq, f"{host}.{sub}.{ns}", f"{host}.{sub}"]))
        return sorted(out, key=lambda r: r[1][0])

    def sync(self, pods: list[dict], services: list[dict]) -> bool:
        """Rewrite the hosts file if its records changed (same inode); True if it did."""
        text = self.HEADER + "".join(f"{ip}\t{' '.join(names)}\n" for ip, names in self.records(pods, services))
        if text == self.content:
            return False
        data = text.encode()
        # Overwrite, then cut: a reader never sees an empty file (at worst a stale tail).
        fd = os.open(self.path, os.O_WRONLY)
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)
        self.content = text
        self.rewrites += 1
        return True

    def resolve(self, name: str) -> Optional[str]:
        for line in self.content.splitlines():
            parts = line.split()
            if len(parts) > 1 and name in parts[1:]:
                return parts[0]
        return None




class Kubelet(Node):
    """Stands in for the scheduler and the kubelet of one node, over `KubeEmulator` (module doc)."""

    def __init__(self, kube: KubeEmulator, root: Path, *, node_name: str = "local-node",
                 removal_delay: float = 0.0, **kwargs: Any):
        super().__init__(root, node_name=node_name, host_ip="127.0.0.1", **kwargs)
        self.kube = kube
        self.removal_delay = removal_delay
        self.ipam = LoopbackIPAM()
        self.dns = ClusterDNS(self.root / "cluster-hosts")
        self._task: Optional[asyncio.Task] = None

    # ------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> "Kubelet":
        self.root.mkdir(parents=True, exist_ok=True)
        self.http = aiohttp.ClientSession()
        self.kube.graceful_pod_deletion = True
        self._task = asyncio.create_task(self._loop(), name="kubelet")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    async def stop(self, grace: float = 5.0) -> None:
        """Stop syncing; SIGTERM every container, SIGKILL what is left after `grace` seconds."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.stop_pods(grace)
        if self.http is not None:
            await self.http.close()

    # ------------------------------------------------------------ the node's hooks, on the emulator
    def _store(self, worker: PodWorker, change, write: Write) -> Optional[dict]:
        def guarded(obj: dict) -> dict:
            if obj["metadata"].get("uid") != worker.uid:
                raise kmock.KubernetesObjectNotFoundError()
            return change(obj)

        return self.kube._update(kmock.resource(PODS), worker.namespace, worker.name, guarded, write)

    async def admit(self, worker: PodWorker) -> bool:
        def bind(obj: dict) -> dict:
            obj.setdefault("spec", {})["nodeName"] = self.node_name
            return obj

        try:
            async with self.kube._lock:
                worker.pod = self._store(worker, bind, Write(agent="kube-scheduler", verb="update",
                                                             as_controller=True))
            worker.spec = worker.pod["spec"]
            return True
        except kmock.KubernetesObjectNotFoundError:
            worker.gone = True
            return False

    async def sandbox(self, worker: PodWorker) -> str:
        return self.ipam.allocate()

    def sandbox_files(self, worker: PodWorker) -> list[tuple[Path, str, bool]]:
        return [(self.dns.path, "/etc/hosts", True)]

    async def read(self, resource: str, namespace: str, name: str) -> Optional[dict]:
        return self.kube.obj(f"v1/{resource}", namespace, name)

    async def write_status(self, worker: PodWorker) -> None:
        def put(obj: dict) -> dict:
            obj["status"] = json.loads(json.dumps(worker.status))
            return obj

        with contextlib.suppress(kmock.KubernetesObjectNotFoundError):
            async with self.kube._lock:
                self._store(worker, put, Write(agent="kubelet", verb="update", subresource="status",
                                               as_controller=True))

    async def volume_source(self, worker: PodWorker, vol: dict) -> Optional[Path]:
        if "persistentVolumeClaim" not in vol:
            return None
        claim = vol["persistentVolumeClaim"]["claimName"]
        pvc = self.kube.obj("v1/persistentvolumeclaims", worker.namespace, claim)
        if pvc is None:
            raise PodStartError("ContainerCreating", f'persistentvolumeclaim "{claim}" not found')
        target = self.root / "pvc" / f"{worker.namespace}_{claim}_{pvc['metadata']['uid'][:8]}"
        target.mkdir(parents=True, exist_ok=True)
        return target

    def claim_dirs(self, namespace: str, claim: str) -> list[Path]:
        """The directories that backed the claim `claim` (one per claim object that was used)."""
        return sorted((self.root / "pvc").glob(f"{namespace}_{claim}_*"))

    async def remove(self, worker: PodWorker) -> None:
        if not worker.gone and self.removal_delay:
            await asyncio.sleep(self.removal_delay)  # deleted, terminal, and still there a while
        with contextlib.suppress(kmock.KubernetesObjectNotFoundError):
            async with self.kube._lock:
                obj = self.kube.obj(PODS, worker.namespace, worker.name)
                if obj is not None and obj["metadata"]["uid"] == worker.uid:
                    self.kube._delete(kmock.resource(PODS), worker.namespace, worker.name, 0)

    def pods_changed(self) -> None:
        self.refresh_dns()

    # ------------------------------------------------------------ the sync loop
    async def _loop(self) -> None:
        while True:
            changed = self.kube._signal()
            try:
                self._sync()
            except Exception as e:
                log.exception("kubelet sync")
                self.errors.append(f"sync: {type(e).__name__}: {e}")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait(), 0.5)
            await asyncio.sleep(0.02)  # coalesce bursts of changes

    def _sync(self) -> None:
        seen = set()
        for pod in self.kube.live(PODS):
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            w = self.workers.get(uid)
            if w is None:
                if pod["metadata"].get("deletionTimestamp") and not (pod.get("spec") or {}).get("nodeName"):
                    continue
                self.start_worker(pod)
            else:
                w.observe(pod)
        for uid, w in list(self.workers.items()):
            if uid not in seen:
                w.observe(None)
                if w.task is not None and w.task.done():
                    del self.workers[uid]
        self.refresh_dns()

    def refresh_dns(self) -> None:
        self.dns.sync(self.kube.live(PODS), self.kube.live(SERVICES))
