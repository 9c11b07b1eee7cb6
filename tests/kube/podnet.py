"""A pod network without a cluster, for the image tier (tests/images): containers run by crun
directly, each on its own loopback address, find each other by name through one hosts file.

* `LoopbackIPAM` hands out pod IPs, as a CNI plugin's IP address management would;
* `ClusterDNS` keeps the records cluster DNS would serve for headless Services, in a hosts
  file every container bind-mounts at /etc/hosts.

On the local cluster (tests/cluster) the node agent and CoreDNS do both for real.
"""
from __future__ import annotations

import random
from pathlib import Path


class LoopbackIPAM:
    """Stands in for the CNI plugin's IP address management: each pod gets its own address in
    127/8 (Linux routes the whole block to `lo`, so any of them binds without set-up).

    Addresses come from one random 127.B.C.0/24..-style range per instance (so that two harnesses
    on one machine do not collide) and are never reused within it."""

    def __init__(self, seed: int | None = None):
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
    """Stands in for cluster DNS (CoreDNS's records for headless Services): one hosts file that
    every container bind-mounts at /etc/hosts, written before the containers start.

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

    def sync(self, pods: list[dict], services: list[dict]) -> None:
        """Write the hosts file with the records of `pods` and `services`."""
        self.path.write_text(self.HEADER + "".join(f"{ip}\t{' '.join(names)}\n"
                                                   for ip, names in self.records(pods, services)))
