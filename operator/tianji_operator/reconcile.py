"""Reconciliation (create, resume, update): level-based and idempotent.

Validate the spec (pydantic) → compare with the applied spec stored on the ConfigMap
(immutable changes are refused as a whole) → plan once (tianji.control.plan.resolve) →
create whatever child is missing (fixed names; 409 means "already there") → status.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Optional

import kopf

from tianji.control.plan import PlanError, resolve
from tianji.control.ports import HOST_PORT_REASONS, HostPortError, PortBlock, block_of, is_pinned, with_block
from tianji.control.spec import SpecError, TianJiJob, deprecated_fields

from . import builders as b
from . import hostports as hp
from . import state
from . import status as st
from .children import creation_refused, delete_role_pods, refused_for_good
from .context import (InvalidSpec, Operator, actor_sets, adopt, checked_job, is_mutable, read_applied,
                      update_status)
from .kube import ApiError


# ----------------------------------------------------------------- reconcile
async def reconcile(op: Operator, body: Any, patch: Any, logger: logging.Logger, handler: str) -> None:
    meta = body["metadata"]
    name, ns, gen = meta["name"], meta.get("namespace"), meta.get("generation")
    # The live status, not the handler's copy: a resume or update handler may carry a body from
    # before the job ended, and acting on it would bring an ended job's actors back.
    fresh = await op.kube.get("TianJiJob", ns, name)
    if fresh is None:
        return
    status = dict(fresh.get("status") or {})
    now = op.now()
    cm = await op.kube.get("ConfigMap", ns, b.configmap_name(name))

    async def refuse(reason: str, message: str) -> None:
        conds = [st.condition("Planned", False, reason, message, now=now, generation=gen)]
        fields: dict[str, Any] = {"observedGeneration": gen}
        if cm is None:  # never ran: the job fails; nothing is created
            fields["phase"] = st.FAILED
            fields["completionTime"] = st.iso(now)
            conds += [st.condition("Failed", True, reason, message, now=now, generation=gen),
                      st.condition("Succeeded", False, reason, message, now=now, generation=gen),
                      st.condition("Ready", False, reason, "no pods were created", now=now, generation=gen),
                      st.condition("Progressing", False, reason, message, now=now, generation=gen)]
        else:
            applied_gen = (cm["metadata"].get("annotations") or {}).get(b.ANNOTATION_GENERATION, "?")
            conds[0]["message"] = f"{message}; the job keeps running its applied spec (generation {applied_gen})"

        def compute(fresh: dict) -> Optional[dict]:
            cur = fresh.get("status") or {}
            if cur.get("phase") in st.TERMINAL and cm is not None:
                return None  # a job that ran and ended keeps its final conditions
            return {**fields, "conditions": st.set_conditions(cur.get("conditions"), *conds)}

        await update_status(op, ns, name, compute)
        kopf.warn(body, reason=reason, message=message[:900])
        op.metrics.reconciles.labels(handler=handler, result=reason).inc()
        logger.warning("%s: %s", reason, message)

    try:
        job = checked_job(body)
    except InvalidSpec as e:
        return await refuse("InvalidSpec", str(e))

    new_spec = json.loads(b.spec_json(job.spec))
    plan_json: Optional[dict] = None  # a new plan, made now
    plan_record: Optional[dict] = None  # the plan in force (new, or from the ConfigMap)
    actors_changed = False
    if cm is not None:
        applied, resolved = read_applied(cm)
        plan_record = json.loads(cm["metadata"].get("annotations", {}).get(b.ANNOTATION_PLAN) or "null")
        changes = st.diff_paths(applied, new_spec)
        fixed = [c for c in changes if not is_mutable(c[0])]
        if fixed:
            listing = "; ".join(f"{p}: {json.dumps(o)} -> {json.dumps(n)}" for p, o, n in fixed[:8])
            return await refuse("ImmutableFieldChanged",
                                f"{listing}{' ...' if len(fixed) > 8 else ''} cannot change on a created job "
                                "(delete and re-create it); no change was applied")
        if changes:
            doc = resolved.to_manifest()
            doc["spec"]["autoscale"] = new_spec["autoscale"]
            doc["spec"]["runPolicy"] = new_spec["runPolicy"]
            if any(p == "spec.topology.actors" for p, _, _ in changes) and not job.spec.topology.auto:
                doc["spec"]["topology"]["actors"] = job.spec.topology.actors
                actors_changed = True
            resolved = TianJiJob.model_validate(doc)
    else:
        if status.get("phase") == st.FAILED and handler != "update" and any(
                c.get("type") == "Failed" and c.get("reason") in HOST_PORT_REASONS
                for c in status.get("conditions") or []):
            # refused its ports: a restart does not rewrite that end (a spec edit tries again)
            op.metrics.reconciles.labels(handler=handler, result="KeptFailed").inc()
            return
        try:
            resolved, plan = resolve(job, op.profile)
        except (PlanError, SpecError, ValueError) as e:
            return await refuse("PlanFailed", str(e))
        plan_json = plan_record = st.camel_keys(plan.to_json())
        plan_json["stateVolume"] = await state.decide(op, resolved)  # where learner state lives, for good

    host_block: Optional[PortBlock] = None  # hostNetwork: the job's node ports (tianji.control.ports)
    if resolved.spec.network.host_network:
        if cm is not None:  # ports fixed at creation: as recorded, else as the planned job has them
            host_block = PortBlock.from_status(hp.recorded_block(body) or {}) or block_of(
                resolved, is_pinned(job.spec.network))
            op.host_ports[hp.key(ns, name)] = host_block
        else:
            try:
                host_block = await hp.job_block(op, ns, name, resolved, job, hp.recorded_block(body))
                resolved = TianJiJob.model_validate(with_block(resolved.to_manifest(), host_block))
            except HostPortError as e:
                return await refuse(e.reason, str(e))
            except ValueError as e:  # pinned ports that do not fit the planned topology
                hp.release(op, ns, name)
                return await refuse("PlanFailed", str(e))

    for note in deprecated_fields(body.get("spec")):
        kopf.warn(body, reason="DeprecatedField", message=note)
    terminal = status.get("phase") in st.TERMINAL and cm is not None
    a = resolved.spec.autoscale
    topo = resolved.spec.topology
    suspended = resolved.spec.run_policy.suspend
    resuming = not suspended and status.get("phase") == st.SUSPENDED
    try:
        sets = await actor_sets(op, ns, name, topo.groups)
        desired: dict[int, int] = {}
        for g in range(topo.groups):
            n = topo.actors
            mode = a.effective_mode
            if mode != "off" and sets[g] is not None and not actors_changed and not resuming:
                n = int(sets[g]["spec"].get("replicas") or 0)  # the autoscaler / external scaler owns replicas
            if mode == "planner":
                n = min(max(n, a.min_actors), a.max_actors)
            desired[g] = 0 if suspended else n
        objs = b.children(resolved, job.spec, desired, scrapers=op.config.metrics_scrapers,
                          command=op.config.worker_command,
                          defaults=op.config.worker_defaults, generation=gen or 0, plan=plan_record)
        if suspended:  # no learner/buffer pods; actors at 0 replicas
            objs = [o for o in objs if o["kind"] != "Pod"]
            if not terminal:
                await delete_role_pods(op, ns, name)
        created = []
        if not terminal:
            for obj in objs:
                adopt(obj, body)
                try:
                    got, was_created = await op.kube.ensure(obj)
                except ApiError as e:
                    if not refused_for_good(e):
                        raise
                    return await creation_refused(op, body, resolved, obj, e, now, logger, handler)
                if was_created:
                    created.append(f"{obj['kind']}/{obj['metadata']['name']}")
                elif obj["kind"] == "StatefulSet":
                    g = int(obj["metadata"]["labels"][b.LABEL_GROUP])
                    if (got.get("spec") or {}).get("replicas") != desired[g]:
                        await op.kube.patch("StatefulSet", ns, obj["metadata"]["name"],
                                            {"spec": {"replicas": desired[g]}})
        if cm is not None:  # the ConfigMap records what is applied: written last
            want = objs[0]
            if (want["data"] != cm.get("data")
                    or want["metadata"]["annotations"][b.ANNOTATION_SPEC]
                    != cm["metadata"].get("annotations", {}).get(b.ANNOTATION_SPEC)):
                await op.kube.patch("ConfigMap", ns, want["metadata"]["name"], {
                    "data": want["data"], "metadata": {"annotations": want["metadata"]["annotations"]}})
    except ApiError as e:
        op.metrics.errors.labels(where="api").inc()
        kopf.warn(body, reason="ApiError", message=str(e)[:500])
        raise kopf.TemporaryError(str(e), delay=op.config.handler_backoff)

    planned = [st.condition("Planned", True, "Planned", _plan_summary_from(plan_record, desired), now=now,
                            generation=gen),
               st.condition("Failed", False, "SpecValid", "the spec is valid and planned", now=now,
                            generation=gen),
               state.condition(resolved, plan_record, now, gen)]
    starting = [st.condition("Ready", False, "PodsStarting", "waiting for the pods", now=now, generation=gen),
                st.condition("Progressing", True, "Starting", "creating pods", now=now, generation=gen)]
    why = state.suspend_message(resolved, plan_record)
    suspended_conds = [st.condition("Suspended", True, "Suspended", why, now=now, generation=gen),
                       st.condition("Ready", False, "Suspended", why, now=now, generation=gen),
                       st.condition("Progressing", False, "Suspended", why, now=now, generation=gen)]

    def compute(fresh: dict) -> Optional[dict]:
        cur = fresh.get("status") or {}
        fields: dict[str, Any] = {}
        if plan_record is not None and (plan_json is not None or not cur.get("plan")):
            fields["plan"] = plan_record  # also after a restart that interrupted the first status write
        if host_block is not None:
            fields["hostPorts"] = host_block.to_status()
        if cur.get("phase") in st.TERMINAL and cm is not None:
            return fields  # a job that ran and ended keeps its final phase and conditions
        fields["observedGeneration"] = gen
        conds = list(planned)
        if suspended != (cur.get("phase") == st.SUSPENDED):
            fields["podsSeen"] = {}  # pods the operator deletes or re-creates itself are no disruption
        if suspended:
            fields["phase"] = st.SUSPENDED
            conds += suspended_conds
        elif cur.get("phase") not in (st.PENDING, st.RUNNING):
            fields["phase"] = st.PENDING
            conds += starting
            if cur.get("phase") == st.SUSPENDED:
                conds.append(st.condition("Suspended", False, "Resumed", "runPolicy.suspend is false: "
                                          "pods re-created", now=now, generation=gen))
        if not suspended and (not cur.get("activeSince") or cur.get("phase") == st.SUSPENDED):
            fields["activeSince"] = st.iso(now)  # runPolicy.activeDeadlineSeconds counts from here
        if "groups" not in cur or plan_json is not None:
            groups, actors = st.summarize(topo, [], {g: {"spec": {"replicas": n}} for g, n in desired.items()},
                                          b.LABEL_ROLE, b.LABEL_GROUP)
            fields["groups"], fields["actors"] = groups, actors
        fields["conditions"] = st.set_conditions(cur.get("conditions"), *conds)
        return fields

    await update_status(op, ns, name, compute)
    op.metrics.reconciles.labels(handler=handler, result="ok").inc()
    if plan_json is not None:
        kopf.info(body, reason="Planned", message=_plan_summary_from(plan_json))
    if created and cm is not None:
        kopf.info(body, reason="Recreated", message=", ".join(created)[:900])
    elif cm is not None and handler == "update":
        kopf.info(body, reason="Updated", message="applied the changed mutable fields")


def _plan_summary_from(plan_json: Optional[dict], desired: Optional[dict[int, int]] = None) -> str:
    """The plan in words, with the actors the groups have now (a /scale or spec edit changes them)."""
    if not plan_json:
        return "planned"
    p = plan_json
    now = sorted(set((desired or {}).values()))
    actors = f"{p['actors']} actors" if not now or now == [p["actors"]] else (
        f"{'/'.join(map(str, now))} actors (planned {p['actors']})")
    return (f"{p['groups']} group(s) x ({actors}, {p['buffers']} buffers, {p['learners']} learners); "
            f"{p['cpusUsed']:g} cores, {p['gpusUsed']} GPUs; predicted {p['producedFps']:.0f} frames/s produced, "
            f"{p['consumedSps']:.0f} samples/s consumed; {p['bottleneck']}")
