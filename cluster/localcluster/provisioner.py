"""The local cluster's storage: a default StorageClass and its dynamic provisioner.

Every real cluster TianJi targets has a default StorageClass, and the operator keeps each
learner's checkpoints on a claim of it, so a deleted, evicted or moved learner resumes where it
stopped. Here a claim of class `local-shared` gets a PersistentVolume backed by a folder under
the cluster's directory (`<root>/volumes/pvc-<uid>`). All nodes are namespaces of one machine,
so every node reaches every volume, as with network storage: a learner re-created on another
node after its node was lost finds its checkpoints (a node-local volume would pin it to the
lost node). Binding is the kube-controller-manager's own PV controller; this process only
provisions (claims the controller annotated with this provisioner's name) and deletes what a
released claim leaves (reclaimPolicy Delete), as an external provisioner does. It runs with an
identity of its own (`tianji:local-provisioner`) and polls, which is plenty at test scale.

The node agent mounts a bound claim's folder (nodeagent.volume_source).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import shutil
import signal
from pathlib import Path
from typing import Optional

from .api import Api, ApiError

log = logging.getLogger("tianji.localcluster.provisioner")
CLASS = "local-shared"
PROVISIONER = "tianji.dev/local-shared"
PROVISIONER_ANNOTATIONS = ("volume.kubernetes.io/storage-provisioner", "volume.beta.kubernetes.io/storage-provisioner")
POLL_S = 1.0

STORAGE = f"""
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: {CLASS}
  annotations: {{storageclass.kubernetes.io/is-default-class: "true"}}
provisioner: {PROVISIONER}
reclaimPolicy: Delete
volumeBindingMode: Immediate
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: "tianji:local-provisioner"}}
rules:
- {{apiGroups: [""], resources: [persistentvolumeclaims], verbs: [get, list, watch]}}
- {{apiGroups: [""], resources: [persistentvolumes], verbs: [get, list, watch, create, delete]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: "tianji:local-provisioner"}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "tianji:local-provisioner"}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: "tianji:local-provisioner"}}]
"""


def volume_name(claim: dict) -> str:
    return f"pvc-{claim['metadata']['uid']}"


def persistent_volume(claim: dict, folder: Path) -> dict:
    """The PV for `claim`, pre-bound to it (claimRef), backed by `folder`."""
    meta, spec = claim["metadata"], claim["spec"]
    return {"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": volume_name(claim), "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
            "spec": {"capacity": {"storage": spec["resources"]["requests"]["storage"]},
                     "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Delete", "storageClassName": CLASS,
                     "volumeMode": spec.get("volumeMode", "Filesystem"),
                     "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": meta["namespace"],
                                  "name": meta["name"], "uid": meta["uid"]},
                     "hostPath": {"path": str(folder), "type": "DirectoryOrCreate"}}}


def wants_volume(claim: dict) -> bool:
    ann = claim["metadata"].get("annotations") or {}
    return (claim.get("status") or {}).get("phase") == "Pending" and not claim["spec"].get("volumeName") and \
        any(ann.get(k) == PROVISIONER for k in PROVISIONER_ANNOTATIONS)


class Provisioner:
    def __init__(self, api: Api, volumes: Path):
        self.api, self.volumes = api, volumes

    async def sync(self) -> None:
        claims = (await self.api.get("/api/v1/persistentvolumeclaims") or {}).get("items") or []
        pvs = {pv["metadata"]["name"]: pv for pv in (await self.api.get("/api/v1/persistentvolumes") or {})
               .get("items") or []}
        for claim in claims:
            if wants_volume(claim) and volume_name(claim) not in pvs:
                folder = self.volumes / volume_name(claim)
                folder.mkdir(parents=True, exist_ok=True)
                # Writable by the pods' users, as local-path-provisioner makes its folders: a
                # hostPath volume gets no fsGroup ownership from the kubelet.
                folder.chmod(0o777)
                await self.api.create("/api/v1/persistentvolumes", persistent_volume(claim, folder))
                log.info("provisioned %s for %s/%s", volume_name(claim), claim["metadata"]["namespace"],
                         claim["metadata"]["name"])
        for name, pv in pvs.items():
            mine = (pv["metadata"].get("annotations") or {}).get("pv.kubernetes.io/provisioned-by") == PROVISIONER
            if mine and (pv.get("status") or {}).get("phase") == "Released" and \
                    pv["spec"].get("persistentVolumeReclaimPolicy") == "Delete":
                await self.api.delete(f"/api/v1/persistentvolumes/{name}")
                shutil.rmtree(self.volumes / name, ignore_errors=True)
                log.info("deleted %s (its claim is gone)", name)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.sync()
            except ApiError as e:
                log.warning("provisioner: %s", e)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), POLL_S)


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m localcluster.provisioner", description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--ca", required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--volumes", required=True, type=Path, help="where the volumes' folders go")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def amain() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with Api(a.server, a.ca, a.cert, a.key) as api:
            await Provisioner(api, a.volumes).run(stop)

    asyncio.run(amain())


if __name__ == "__main__":
    main()
