"""The Node object, its status and its Lease, as a kubelet writes them."""
from __future__ import annotations

import datetime
import platform
from dataclasses import dataclass, field

KUBELET_VERSION = "v1.37.2-tianji-node-agent"


def now_iso(micro: bool = False) -> str:
    t = datetime.datetime.now(datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


@dataclass
class NodeSpec:
    """What a node offers: flags of the agent (`--cpu 4 --memory 8Gi --gpus 1 ...`)."""

    name: str
    ip: str
    cpu: str = "4"
    memory: str = "8Gi"
    pods: int = 110
    gpus: int = 0
    extended: dict[str, str] = field(default_factory=dict)  # e.g. {"rdma/hca": "4"}
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict] = field(default_factory=list)

    def capacity(self) -> dict[str, str]:
        cap = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.pods), "ephemeral-storage": "50Gi"}
        if self.gpus:
            cap["nvidia.com/gpu"] = str(self.gpus)
        cap.update(self.extended)
        return cap

    def object(self) -> dict:
        labels = {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux",
                  "kubernetes.io/arch": "amd64", **self.labels}
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.name, "labels": labels},
                "spec": {"taints": self.taints} if self.taints else {}}

    def status(self, ready: bool = True) -> dict:
        t = now_iso()
        cond = lambda ctype, ok, reason, msg: {
            "type": ctype, "status": "True" if ok else "False", "reason": reason, "message": msg,
            "lastHeartbeatTime": t, "lastTransitionTime": t}
        return {
            "capacity": self.capacity(), "allocatable": self.capacity(),
            "addresses": [{"type": "InternalIP", "address": self.ip}, {"type": "Hostname", "address": self.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": self.name, "systemUUID": self.name, "bootID": self.name,
                         "kernelVersion": platform.release(), "osImage": "TianJi local node agent",
                         "containerRuntimeVersion": "process://local", "kubeletVersion": KUBELET_VERSION,
                         "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
            "conditions": [
                cond("MemoryPressure", False, "KubeletHasSufficientMemory", "kubelet has sufficient memory"),
                cond("DiskPressure", False, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                cond("PIDPressure", False, "KubeletHasSufficientPID", "kubelet has sufficient PID"),
                cond("Ready", ready, "KubeletReady" if ready else "KubeletNotReady",
                     "kubelet is posting ready status" if ready else "starting"),
            ],
        }

    def lease(self, duration: int) -> dict:
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": self.name, "leaseDurationSeconds": duration,
                         "renewTime": now_iso(micro=True)}}
