"""A StatefulSet controller for the API emulator (what kube-controller-manager's does, in part).

For every StatefulSet it keeps pods `<name>-<ordinal>` for ordinals 0..replicas-1:

* each pod is built from `spec.template`: its labels and annotations, plus
  `statefulset.kubernetes.io/pod-name` and `apps.kubernetes.io/pod-index`; its
  spec with `hostname` = the pod name and `subdomain` = `spec.serviceName`; a
  controller ownerReference to the StatefulSet (so garbage collection deletes
  the pods with it);
* podManagementPolicy Parallel (the only one emulated, and what the operator
  asks for): all missing pods are created at once, and all pods above the
  replica count are deleted at once (highest ordinal first);
* a pod that is deleted is created again once its object is gone (graceful
  deletion keeps the name taken until the kubelet removes it); a pod in phase
  Failed is deleted, then created again, as the real controller does;
* `status`: observedGeneration, replicas (pods that exist), readyReplicas and
  availableReplicas (Running and Ready, not terminating), currentReplicas,
  updatedReplicas.

Not emulated: OrderedReady, rolling updates and revisions (a changed template
reaches only pods created after the change), volumeClaimTemplates, minReadySeconds,
persistentVolumeClaimRetentionPolicy, adoption of orphans.
"""
from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from typing import Any, Optional

import kmock

from .emulator import KubeEmulator, Write

log = logging.getLogger("tests.statefulset")

STATEFULSETS = "apps/v1/statefulsets"
PODS = "v1/pods"


def _ready(pod: dict) -> bool:
    st = pod.get("status") or {}
    return st.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])


class StatefulSetController:
    """Stands in for the StatefulSet controller of kube-controller-manager (module doc)."""

    def __init__(self, kube: KubeEmulator):
        self.kube = kube
        self.created: list[str] = []  # pod names, in creation order (a recreated pod appears again)
        self.deleted: list[str] = []
        self.errors: list[str] = []
        self._task: Optional[asyncio.Task] = None

    async def __aenter__(self) -> "StatefulSetController":
        self._task = asyncio.create_task(self._loop(), name="statefulset-controller")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _loop(self) -> None:
        while True:
            changed = self.kube._signal()
            try:
                async with self.kube._lock:
                    for sts in self.kube.live(STATEFULSETS):
                        self._sync(sts)
            except Exception as e:
                log.exception("statefulset controller")
                self.errors.append(f"{type(e).__name__}: {e}")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait(), 0.5)
            await asyncio.sleep(0.02)

    # ------------------------------------------------------------ one StatefulSet (under the lock)
    def _pod(self, sts: dict, ordinal: int) -> dict:
        meta, spec = sts["metadata"], sts["spec"]
        tmpl = copy.deepcopy(spec.get("template") or {})
        tmeta = tmpl.get("metadata") or {}
        name = f"{meta['name']}-{ordinal}"
        labels = {**(tmeta.get("labels") or {}), "statefulset.kubernetes.io/pod-name": name,
                  "apps.kubernetes.io/pod-index": str(ordinal)}
        pod_spec = tmpl.get("spec") or {}
        pod_spec["hostname"] = name
        if spec.get("serviceName"):
            pod_spec["subdomain"] = spec["serviceName"]
        pmeta: dict = {"name": name, "namespace": meta.get("namespace"), "labels": labels,
                       "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": meta["name"],
                                            "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]}
        if tmeta.get("annotations"):
            pmeta["annotations"] = dict(tmeta["annotations"])
        return {"apiVersion": "v1", "kind": "Pod", "metadata": pmeta, "spec": pod_spec}

    def _owned(self, sts: dict) -> dict[int, dict]:
        """Existing pods (terminating included) that this StatefulSet controls, by ordinal."""
        uid, prefix = sts["metadata"]["uid"], sts["metadata"]["name"] + "-"
        out = {}
        for pod in self.kube.live(PODS, sts["metadata"].get("namespace")):
            refs = pod["metadata"].get("ownerReferences") or []
            if not any(r.get("uid") == uid and r.get("controller") for r in refs):
                continue
            tail = pod["metadata"]["name"][len(prefix):]
            if pod["metadata"]["name"].startswith(prefix) and tail.isdigit():
                out[int(tail)] = pod
        return out

    def _sync(self, sts: dict) -> None:
        ns, res = sts["metadata"].get("namespace"), kmock.resource(PODS)
        if sts["metadata"].get("deletionTimestamp"):
            return
        replicas = int((sts.get("spec") or {}).get("replicas", 1))
        pods = self._owned(sts)
        for ordinal in range(replicas):
            pod = pods.get(ordinal)
            if pod is None:
                pods[ordinal] = self.kube._create(res, ns, self._pod(sts, ordinal),
                                                  Write(agent="statefulset-controller", as_controller=True))
                self.created.append(pods[ordinal]["metadata"]["name"])
            elif (pod.get("status") or {}).get("phase") == "Failed" and not pod["metadata"].get("deletionTimestamp"):
                self._delete(res, ns, pod)
        for ordinal in sorted((o for o in pods if o >= replicas), reverse=True):
            if not pods[ordinal]["metadata"].get("deletionTimestamp"):
                self._delete(res, ns, pods[ordinal])
        pods = self._owned(sts)
        live = [p for p in pods.values() if not p["metadata"].get("deletionTimestamp")]
        ready = sum(1 for p in live if _ready(p))
        status = {"observedGeneration": sts["metadata"].get("generation", 1), "replicas": len(pods),
                  "readyReplicas": ready, "availableReplicas": ready, "currentReplicas": len(live),
                  "updatedReplicas": len(live)}
        if any((sts.get("status") or {}).get(k) != v for k, v in status.items()):
            name = sts["metadata"]["name"]
            self.kube._update(kmock.resource(STATEFULSETS), ns, name,
                              lambda o: {**o, "status": {**(o.get("status") or {}), **status}},
                              Write(agent="statefulset-controller", verb="update", subresource="status",
                                    as_controller=True))

    def _delete(self, res: Any, ns: Optional[str], pod: dict) -> None:
        with contextlib.suppress(kmock.KubernetesObjectNotFoundError):
            self.kube._delete(res, ns, pod["metadata"]["name"])
            self.deleted.append(pod["metadata"]["name"])
