"""Pods stranded on a node that went away.

When a node stops answering, its pods' objects stay: Running (Ready False) until the node
lifecycle controller evicts them (the not-ready/unreachable toleration, 300 s by default),
then Terminating for ever, since only that node's kubelet may confirm that they stopped. The
StatefulSet controller and this operator re-create a pod only once its object is gone, so a
job whose learner or buffer sat on the dead node would stall, silently.

The operator force-deletes a job pod whose graceful deletion is overdue by `FORCE_AFTER_S`
(what `kubectl delete pod --force --grace-period=0` does by hand), names the pod and its node
in a Warning event and in the job's Ready condition, and the pod is made again where the
scheduler finds room: the learner and buffer pods by the monitor's self-healing, actor pods
by their StatefulSet. Peers find the new pod by its DNS name. A kubelet that is alive confirms
a deletion within the pod's grace period, so only pods of nodes that stopped answering are
ever overdue. Their checkpoints are what the learner's state volume kept."""

from __future__ import annotations

from typing import Any

import kopf

from .. import status as st
from ..context import Operator
from ..kube import ApiError

FORCE_AFTER_S = 20.0  # past the pod's own deadline (deletionTimestamp = deletion request + grace)


def overdue(pods: list[dict], now: float, after: float = FORCE_AFTER_S) -> list[dict]:
    """Pods whose graceful deletion should have ended more than `after` seconds ago."""
    out = []
    for p in pods:
        due = st.parse_iso(p["metadata"].get("deletionTimestamp"))
        if due is not None and now - due > after:
            out.append(p)
    return out


async def release(op: Operator, body: Any, pods: list[dict], now: float, logger: kopf.Logger) -> list[str]:
    """Force-delete the job's overdue pods; one line per pod released ("pod P on node N ...")."""
    out = []
    for p in overdue(pods, now):
        meta = p["metadata"]
        node = (p.get("spec") or {}).get("nodeName") or "(no node)"
        try:
            gone = await op.kube.delete("Pod", meta.get("namespace"), meta["name"], grace_seconds=0, uid=meta["uid"])
        except ApiError as e:
            if e.status == 409:  # another object of that name already: nothing of this one is left
                continue
            raise
        if gone:
            due = st.parse_iso(meta["deletionTimestamp"]) or now  # overdue() read it: never `now`
            line = (
                f"pod {meta['name']} on node {node}: its deletion was not confirmed by the node for "
                f"{now - due:.0f} s past its grace period "
                f"(node lost?); force-deleted to be re-created on another node"
            )
            logger.warning(line)
            kopf.warn(body, reason="NodeLost", message=line[:900])
            out.append(line)
    return out
