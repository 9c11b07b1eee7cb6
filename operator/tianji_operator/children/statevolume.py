"""Where learner state lives, decided once when a job is created, and what status says of it.

A learner's checkpoints (model, optimizer, policy version, counters) are the job's progress
and its output. By default they must outlive the pod: a deleted, evicted or suspended learner
resumes from its last checkpoint. So, unless the spec names a claim (checkpoint.
persistentVolumeClaim, or checkpoint.size for one the operator creates) or asks for an emptyDir
(checkpoint.ephemeral), each learner pod (and each buffer pod with replaySnapshot) gets a claim
of its own from the cluster's default StorageClass: per pod and ReadWriteOnce, so learners on
different nodes never share a volume. A cluster without a default class gets emptyDirs, and the
job says so (condition Durable False, NoDefaultStorageClass) rather than silently starting over
after a disruption.

The decision is recorded in the plan (`stateVolume`, in status.plan and on the ConfigMap), so
a class added or removed later never switches a running job's volumes.
"""

from __future__ import annotations

from typing import Optional

from tianji.control.spec import TianJiJob

from .. import status as st
from ..context import Operator
from ..kube import ApiError
from . import builders as b

DEFAULT_CLASS_ANNOTATIONS = (
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
)


async def default_storage_class(op: Operator) -> tuple[Optional[str], str]:
    """(name of the cluster's default StorageClass or None, why none)."""
    try:
        classes = await op.kube.list("StorageClass", None)
    except ApiError as e:  # e.g. a namespaced install without the discovery ClusterRole
        return None, f"cannot list StorageClasses ({e.status} {e.reason})"
    for sc in sorted(classes, key=lambda c: c["metadata"]["name"]):
        ann = sc["metadata"].get("annotations") or {}
        if any(ann.get(k) == "true" for k in DEFAULT_CLASS_ANNOTATIONS):
            return sc["metadata"]["name"], ""
    return None, "the cluster has no default StorageClass"


async def decide(op: Operator, job: TianJiJob) -> dict:
    """The plan's `stateVolume` for a job being created."""
    c = job.spec.checkpoint
    if c.persistent_volume_claim or c.size:
        return {"mode": "spec"}
    if c.ephemeral:
        return {"mode": "emptyDir", "reason": "Ephemeral"}
    name, why = await default_storage_class(op)
    if name is None:
        return {"mode": "emptyDir", "reason": "NoDefaultStorageClass", "detail": why}
    return {"mode": "claims", "storageClass": name}


def durable(job: TianJiJob, plan: Optional[dict]) -> bool:
    return b.checkpoint_claim(job) is not None or b.per_pod_claims(job, plan)


def describe(job: TianJiJob, plan: Optional[dict]) -> tuple[bool, str, str]:
    """(durable, reason, message) of the Durable condition."""
    sv = (plan or {}).get("stateVolume") or {}
    claim = b.checkpoint_claim(job)
    if claim:
        return (
            True,
            "Claim",
            (
                f"learner checkpoints on PersistentVolumeClaim {claim}: a replaced or resumed "
                "learner continues from its last checkpoint"
            ),
        )
    if b.per_pod_claims(job, plan):
        return (
            True,
            "DefaultStorageClass",
            (
                f"each learner keeps its checkpoints on its own claim <pod>-state (StorageClass "
                f"{sv.get('storageClass', 'default')}): a replaced or resumed learner continues from its last "
                "checkpoint"
            ),
        )
    lost = (
        "learner state is in an emptyDir, lost with its pod: a replaced or resumed learner starts again "
        "from policy version 0 (counts are kept in status)"
    )
    if sv.get("reason") == "NoDefaultStorageClass":
        return (
            False,
            "NoDefaultStorageClass",
            (
                f"{sv.get('detail') or 'no default StorageClass'}: {lost}; set "
                "spec.checkpoint.size (with storageClassName) or "
                "spec.checkpoint.persistentVolumeClaim to keep it"
            ),
        )
    if job.spec.checkpoint.ephemeral:
        return False, "Ephemeral", f"spec.checkpoint.ephemeral: {lost}"
    return False, "EmptyDir", lost  # a job created by an older operator: its volumes stay as they are


def condition(job: TianJiJob, plan: Optional[dict], now: float, generation: Optional[int]) -> dict:
    ok, reason, message = describe(job, plan)
    return st.condition("Durable", ok, reason, message, now=now, generation=generation)


def suspend_message(job: TianJiJob, plan: Optional[dict]) -> str:
    """What runPolicy.suspend really keeps."""
    if durable(job, plan):
        return "runPolicy.suspend is true: pods deleted; counts and learner checkpoints kept"
    return (
        "runPolicy.suspend is true: pods deleted; counts kept, but learner state is in an emptyDir and "
        "is lost: on resume the learners start again from policy version 0"
    )
