"""A one-node cluster whose pods really run: the API emulator, the local kubelet and
StatefulSet controller, and the real Kopf operator (the disruption cases that need a pod
to linger or a claim to persist at a chosen moment; everything else that runs pods is on
the real control plane, tests/cluster/).

    async with PodCluster(tmp_path) as c:
        await c.kube.create_job(manifest)
        ...
    assert not c.leftovers

Everything it starts stops in `__aexit__` (operator, controllers, then every
container: SIGTERM, SIGKILL after a few seconds); `leftovers` lists any process of theirs still
alive afterwards. When the block raises, the job's status, the pods and the tail of every
container's log are printed (pytest shows them with the failure).
"""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any, Optional

from .kubelet import Kubelet, processes_in_groups
from .operator_harness import JOBS, NAMESPACE, RunningOperator, start_cluster
from .statefulset import StatefulSetController

DEFAULT_STORAGE_CLASS = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "provisioner": "tianji.test/local",
                         "metadata": {"name": "standard", "annotations": {
                             "storageclass.kubernetes.io/is-default-class": "true"}}}
# How the operator starts workers here: this interpreter, with the test's PYTHONPATH (the image's).
WORKER_COMMAND = [sys.executable, "-m", "tianji.cli", "worker"]


class PodCluster:
    """The emulator + `Kubelet` + `StatefulSetController` + `RunningOperator`."""

    def __init__(self, root: Path, *, operator: Optional[dict] = None,
                 kubelet: Optional[dict] = None, default_storage_class: bool = True):
        self.root = Path(root)
        self.default_storage_class = default_storage_class  # as kind, minikube and cloud clusters have
        self.operator_config = {"worker_command": WORKER_COMMAND, "monitor_interval": 0.5, "autoscale_tick": 0.5,
                                "handler_backoff": 0.5, "http_timeout": 3.0, **(operator or {})}
        self.kubelet_config = {"backoff_base": 1.0, "backoff_max": 10.0, "probe_period_cap": 1.0, **(kubelet or {})}
        self.kube: Any = None
        self.kubelet: Optional[Kubelet] = None
        self.statefulsets: Optional[StatefulSetController] = None
        self.operator: Optional[RunningOperator] = None
        self.leftovers: list[tuple[int, str]] = []
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> "PodCluster":
        try:
            self.kube = await start_cluster(self._stack)
            if self.default_storage_class:
                await self.kube.put_object("storage.k8s.io/v1/storageclasses", DEFAULT_STORAGE_CLASS)
            self.kubelet = await self._stack.enter_async_context(
                Kubelet(self.kube, self.root / "node", **self.kubelet_config))
            self.statefulsets = await self._stack.enter_async_context(StatefulSetController(self.kube))
            self.operator = await self._stack.enter_async_context(RunningOperator(self.kube, **self.operator_config))
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            print(self.diagnostics())
        try:
            await self._close()
        except BaseException:
            if exc_type is None:
                print(self.diagnostics())
            raise

    async def _close(self) -> None:
        try:
            await self._stack.aclose()  # the operator first, the kubelet (every container) last
        finally:
            pgids = set(self.kubelet.pgids) if self.kubelet else set()
            self.leftovers = processes_in_groups(pgids)

    # ------------------------------------------------------------ reading the cluster
    def job(self, name: str, namespace: str = NAMESPACE) -> dict:
        return self.kube.obj(JOBS, namespace, name) or {}

    def status(self, name: str, namespace: str = NAMESPACE) -> dict:
        return self.job(name, namespace).get("status") or {}

    def pods(self, job: str, namespace: str = NAMESPACE, role: Optional[str] = None) -> list[dict]:
        return [p for p in self.kube.live("v1/pods", namespace)
                if p["metadata"].get("labels", {}).get("tianji.dev/job") == job
                and (role is None or p["metadata"]["labels"].get("tianji.dev/role") == role)]

    def diagnostics(self) -> str:
        out = ["===== PodCluster diagnostics"]
        if self.kube is not None:
            for job in self.kube.live(JOBS):
                out.append(f"--- TianJiJob {job['metadata']['name']} status:\n"
                           + json.dumps(job.get("status"), indent=1)[:4000])
            for pod in self.kube.live("v1/pods"):
                st = pod.get("status") or {}
                cs = (st.get("containerStatuses") or [{}])[0]
                out.append(f"--- Pod {pod['metadata']['name']} phase={st.get('phase')} ip={st.get('podIP')} "
                           f"deleting={bool(pod['metadata'].get('deletionTimestamp'))} "
                           f"restarts={cs.get('restartCount')} state={json.dumps(cs.get('state'))[:300]}")
            for sts in self.kube.live("apps/v1/statefulsets"):
                out.append(f"--- StatefulSet {sts['metadata']['name']} replicas={sts['spec'].get('replicas')} "
                           f"status={sts.get('status')}")
        if self.statefulsets is not None and self.statefulsets.errors:
            out.append("--- statefulset controller errors:\n" + "\n".join(self.statefulsets.errors))
        if self.kubelet is not None:
            out.append(self.kubelet.log_tails())
        return "\n".join(out)
