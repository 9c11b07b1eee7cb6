"""A job's children over its life: kept whole (a deleted Service, NetworkPolicy, claim or
ConfigMap comes back; hand-scaling is set back), creations that admission refuses for
good (the job fails with the apiserver's words, no retry loop), suspension, and the end
(`finish`: the terminal status first, then cleanPodPolicy).
"""

from __future__ import annotations

from typing import Any, Optional

import kopf

from tianji.control.contracts.accounting import Accounting
from tianji.control.contracts.addressing import actor_set_name
from tianji.control.contracts.ports import PortBlock, with_block
from tianji.control.planner.plan import kept_dependencies
from tianji.control.spec import SpecError, TianJiJob, parse_job

from .. import status as st
from ..context import Operator, adopt, manifest_of, run_policy_of, update_status
from ..kube import ApiError
from ..timers.counting import counted_fields
from . import builders as b

# ----------------------------------------------------------------- children kept whole
# Children the monitor re-creates when deleted, besides pods and StatefulSets (which it sees
# in its listing) and the ConfigMap (re-created from the job and status.plan).
KEPT_WHOLE = ("Service", "NetworkPolicy", "PersistentVolumeClaim")


async def child_exists(op: Operator, kind: str, ns: Optional[str], name: str) -> bool:
    # Literal kinds: tests/operator/test_chart_rbac.py derives the RBAC rules from these calls.
    if kind == "Service":
        return await op.kube.get("Service", ns, name) is not None
    if kind == "NetworkPolicy":
        return await op.kube.get("NetworkPolicy", ns, name) is not None
    if kind == "PersistentVolumeClaim":
        return await op.kube.get("PersistentVolumeClaim", ns, name) is not None
    raise ValueError(f"not a kept child: {kind}")


def _resolved_from_plan(body: Any, plan: dict) -> Optional[TianJiJob]:
    """The planned job rebuilt from the live spec and status.plan (as tianji.control.planner.plan.resolve
    builds it), for a ConfigMap that was deleted."""
    try:
        live = parse_job(manifest_of(body))
        doc = live.to_manifest()
        # The spec's groupSync stays: status.plan carries only the counts.
        doc["spec"]["topology"] = {
            **doc["spec"]["topology"],
            "auto": False,
            **{k: int(v) for k, v in plan["topology"].items()},
        }
        for role in ("actor", "buffer", "learner"):
            rp = plan[role]
            doc["spec"]["resources"][role] = {
                "cpu": rp["cpu"],
                "memory": rp["memory"],
                "gpu": rp["gpu"],
                "threads": rp["threads"],
            }
        block = PortBlock.from_status((body.get("status") or {}).get("hostPorts") or {})
        if block is not None:  # hostNetwork: the ports the pods were given
            with_block(doc, block)
        return kept_dependencies(TianJiJob.model_validate(doc), live)  # the plan's, as resolve() keeps them
    except (SpecError, KeyError, TypeError, ValueError):
        return None


async def recreate_configmap(op: Operator, body: Any, plan: dict, logger: kopf.Logger) -> Optional[dict]:
    resolved = _resolved_from_plan(body, plan)
    if resolved is None:
        logger.warning("the job's ConfigMap is gone and cannot be rebuilt from its spec and status.plan")
        return None
    obj = b.configmap(resolved, parse_job(manifest_of(body)).spec, body["metadata"].get("generation") or 0, plan)
    got, created = await op.kube.ensure(adopt(obj, body))
    if created:
        kopf.warn(
            body, reason="Recreated", message=f"ConfigMap/{obj['metadata']['name']} (from the spec and status.plan)"
        )
    return got


async def reconcile_manual_scaling(
    op: Operator, body: Any, resolved: TianJiJob, sets: dict, logger: kopf.Logger
) -> None:
    """autoscale.mode off: actor StatefulSets have spec.topology.actors replicas; a manual
    `kubectl scale sts` is set back (Warning event ScaleReconciled). external: adopted
    (never touched); planner: the autoscaler's next decision applies.

    Before setting anything back the job is read again: the tick's copy may predate a
    `kubectl scale tjj` whose handler has patched the StatefulSets since (it records the applied
    spec last), and setting them back would delete and re-make the new actors."""
    if resolved.spec.autoscale.effective_mode != "off":
        return
    want = resolved.spec.topology.actors
    off = {
        g: have
        for g, s in sets.items()
        if s is not None and (have := int(((s or {}).get("spec") or {}).get("replicas") or 0)) != want
    }
    if not off:
        return
    meta = body["metadata"]
    fresh = await op.kube.get("TianJiJob", meta.get("namespace"), meta["name"])
    try:
        live = parse_job(manifest_of(fresh)).spec if fresh is not None else None
    except SpecError:
        return
    if (
        live is None
        or live.autoscale.effective_mode != "off"
        or (not live.topology.auto and live.topology.actors != want)
    ):
        return  # gone, or an edit the update handler is applying right now
    for g in off:
        await op.kube.patch(
            "StatefulSet", meta.get("namespace"), actor_set_name(meta["name"], g), {"spec": {"replicas": want}}
        )
    kopf.warn(
        body,
        reason="ScaleReconciled",
        message=(
            "actor replicas set back to spec.topology.actors "
            "(autoscale.mode off; use mode external to let "
            "another scaler own them): " + ", ".join(f"group {g}: {have} -> {want}" for g, have in off.items())
        )[:900],
    )


# ----------------------------------------------------------------- refused creations, suspension
def refused_for_good(e: ApiError) -> bool:
    """A create that retrying cannot fix: admission (Pod Security, policy webhooks) refused it
    (403, but a quota may free up) or the object is invalid (422)."""
    return e.status == 422 or (e.status == 403 and "exceeded quota" not in e.message)


PRIVILEGED_HINT = (
    "host networking and RDMA (spec.network.hostNetwork, spec.network.rdma) need a namespace "
    "whose Pod Security level is privileged (label pod-security.kubernetes.io/enforce=privileged); "
    "see docs/kubernetes.md"
)


async def creation_refused(
    op: Operator, body: Any, resolved: TianJiJob, obj: dict, e: ApiError, now: float, logger: kopf.Logger, handler: str
) -> None:
    """The job fails with the apiserver's words (status and a Warning Event) instead of
    retrying a create that admission will refuse every time."""
    security = "violates PodSecurity" in e.message
    reason = "PodSecurityRejected" if security else "FailedCreate"
    message = f"creating {obj['kind']} {obj['metadata']['name']} was refused: {e.status} {e.reason}: {e.message}"
    net = resolved.spec.network
    if security and (net.host_network or net.rdma):
        message += f"; {PRIVILEGED_HINT}"
    logger.warning("%s: %s", reason, message)
    op.metrics.reconciles.labels(handler=handler, result=reason).inc()
    ns, name = body["metadata"].get("namespace"), body["metadata"]["name"]
    pods = await op.kube.list("Pod", ns, b.label_selector(name))
    mem = op.memory(ns, name)
    acc = mem.accounting(dict(body.get("status") or {}))
    await finish(op, body, resolved, pods, acc, st.FAILED, reason, message, now)


async def delete_role_pods(op: Operator, ns: Optional[str], name: str) -> list[str]:
    """Delete the job's learner, buffer and evaluator pods (suspension); the names deleted."""
    gone = []
    for p in await op.kube.list("Pod", ns, b.label_selector(name)):
        if p["metadata"].get("labels", {}).get(b.LABEL_ROLE) in b.POD_ROLES:
            if await op.kube.delete("Pod", ns, p["metadata"]["name"]):
                gone.append(p["metadata"]["name"])
    return gone


async def clean_up(
    op: Operator,
    ns: Optional[str],
    name: str,
    resolved: TianJiJob,
    pods: list[dict],
    policy: str,
    sets: Optional[dict] = None,
) -> tuple[list[str], bool]:
    """cleanPodPolicy: Running deletes learner/buffer/evaluator pods not yet finished, All every
    one; both scale the actors to 0. Idempotent (pods being deleted and sets at 0, as read in
    `sets`, are left alone): the monitor repeats it after the end, so an operator stopped
    between the end's status write and the clean-up still cleans up. (pods deleted, scaled?)"""
    cleaned: list[str] = []
    if policy not in ("Running", "All"):
        return cleaned, False
    for p in pods:
        if p["metadata"].get("labels", {}).get(b.LABEL_ROLE) not in b.POD_ROLES or p["metadata"].get(
            "deletionTimestamp"
        ):
            continue
        if policy == "All" or st.pod_phase(p) in ("Pending", "Running", "Unknown"):
            if await op.kube.delete("Pod", ns, p["metadata"]["name"]):
                cleaned.append(p["metadata"]["name"])
    scaled = False
    for g in range(resolved.spec.topology.groups):
        if sets is not None and not int(((sets.get(g) or {}).get("spec") or {}).get("replicas") or 0):
            continue
        try:
            await op.kube.patch("StatefulSet", ns, actor_set_name(name, g), {"spec": {"replicas": 0}})
            scaled = True
        except ApiError as e:
            if e.status != 404:
                raise
    return cleaned, scaled


async def finish(
    op: Operator,
    body: Any,
    resolved: TianJiJob,
    pods: list[dict],
    acc: Accounting,
    phase: str,
    reason: str,
    message: str,
    now: float,
    extra: Optional[dict] = None,
    conditions: tuple[dict, ...] = (),
) -> None:
    """Record the end (status first, from a fresh read: if another tick ended the job
    already, nothing changes), then clean up. The pods' final reports arrive afterwards
    (termination messages) and are counted by the monitor and the pod event handler.
    `extra`: status fields written with the end (the restart counts its message names; an
    endReason, else `reason` is it); `conditions`: more conditions set with the end."""
    ns, name = body["metadata"].get("namespace"), body["metadata"]["name"]
    policy = run_policy_of(body, resolved).clean_pod_policy
    ended = phase == st.SUCCEEDED
    gen = body["metadata"].get("generation")
    conds = [
        st.condition("Progressing", False, "JobSucceeded" if ended else "JobFailed", message, now=now, generation=gen),
        st.condition("Ready", False, reason, message, now=now, generation=gen),
        st.condition("Succeeded", ended, reason if ended else "JobFailed", message, now=now, generation=gen),
        st.condition("Failed", not ended, "JobSucceeded" if ended else reason, message, now=now, generation=gen),
        *conditions,
    ]
    won = False

    def compute(fresh: dict) -> Optional[dict]:
        nonlocal won
        cur = fresh.get("status") or {}
        if cur.get("phase") in st.TERMINAL:
            won = False
            return None
        won = True
        return {
            "endReason": reason,
            **(extra or {}),
            "phase": phase,
            "completionTime": st.iso(now),
            "conditions": st.set_conditions(cur.get("conditions"), *conds),
            **counted_fields(acc, cur, now),
        }

    await update_status(op, ns, name, compute)
    if not won:
        return
    cleaned, _ = await clean_up(op, ns, name, resolved, pods, policy)
    msg = f"{reason}: {message}; cleanPodPolicy {policy}" + (
        f": deleted {len(cleaned)} pod(s), actors scaled to 0" if policy != "None" else ""
    )
    if ended:
        kopf.info(body, reason="Succeeded", message=msg)
    else:
        kopf.warn(body, reason="Failed", message=msg)
