"""The autoscale timer: per-group rates (Prometheus or the job's accounting) → the
rescaling decision (autoscaler.py) → the actor StatefulSets. A job that is not Running,
checked on a fresh read just before the write, is never rescaled.
"""

from __future__ import annotations

from typing import Any, Optional

import kopf

from tianji.control.contracts.addressing import actor_set_name
from tianji.control.spec import SpecError, TianJiJob, parse_job

from .. import status as st
from ..children import builders as b
from ..context import Operator, StatusConflict, actor_sets, manifest_of, read_applied, update_status
from . import autoscaler as asc


# ----------------------------------------------------------------- autoscale
async def autoscale(op: Operator, body: Any, patch: Any, logger: kopf.Logger) -> None:
    meta = body["metadata"]
    name, ns = meta["name"], meta.get("namespace")
    status = dict(body.get("status") or {})
    if status.get("phase") != st.RUNNING:
        return
    try:
        spec = parse_job(manifest_of(body)).spec
    except SpecError:
        return
    mem = op.memory(ns, name)
    now = op.now()
    if mem.last_sample is not None and now - mem.last_sample < spec.autoscale.interval_seconds:
        return
    cm = await op.kube.get("ConfigMap", ns, b.configmap_name(name))
    if cm is None:
        return
    _, resolved = read_applied(cm)
    url = spec.autoscale.prometheus_url
    if url and not asc.prometheus_allowed(url, op.config.prometheus_allowed):
        if f"prometheus/{url}" not in mem.warned:
            mem.warned.add(f"prometheus/{url}")
            kopf.warn(
                body,
                reason="PrometheusNotAllowed",
                message=f"spec.autoscale.prometheusUrl {url} is not in the operator's allow-list "
                "(chart operator.prometheusAllowList): counting from the pods' reports instead"[:900],
            )
        url = None
    obs: Optional[asc.Observation]
    try:
        if url:
            obs = await asc.query_prometheus(
                op.http(),
                url,
                asc.promql_queries(
                    name, ns, op.config.promql_window, op.config.promql_job_label, op.config.promql_namespace_label
                ),
            )
        else:
            obs = asc.from_accounting(mem.acc, after=mem.last_sample) if mem.acc is not None else None
    except asc.MetricsError as e:
        mem.last_sample = now  # try again after the interval, not on every tick
        op.metrics.errors.labels(where="metrics").inc()
        logger.warning("metrics: %s", e)
        return
    if obs is None:
        return  # the monitor has not counted a fresh window yet: try on the next tick
    mem.last_sample = now
    try:
        await _observe_and_rescale(op, body, spec, resolved, obs, now, logger)
    except StatusConflict:
        mem.last_sample = None  # the job changed meanwhile: measure again on the next tick
        raise


async def _observe_and_rescale(
    op: Operator, body: Any, spec: Any, resolved: TianJiJob, obs: asc.Observation, now: float, logger: kopf.Logger
) -> None:
    name, ns = body["metadata"]["name"], body["metadata"].get("namespace")
    sets = await actor_sets(op, ns, name, resolved.spec.topology.groups)
    current = {g: int((s.get("spec") or {}).get("replicas") or 0) for g, s in sets.items() if s is not None}
    ready = {g: int((s.get("status") or {}).get("readyReplicas") or 0) for g, s in sets.items() if s is not None}
    decided: dict[str, Any] = {}

    def compute(fresh: dict) -> Optional[dict]:
        cur = fresh.get("status") or {}
        decided.clear()
        if cur.get("phase") != st.RUNNING:
            return None  # ended (or restarted) since the tick began: never rescale a finished job
        auto = dict(cur.get("autoscale") or {})
        mode = spec.autoscale.effective_mode
        if mode != "planner":
            auto["lastEvaluation"] = {
                "time": st.iso(now),
                "decision": "disabled" if mode == "off" else "external",
                **obs.record(),
            }
            return {"autoscale": auto}
        decision = asc.decide(
            spec, obs.throughput(current), current, st.parse_iso(auto.get("lastRescaleTime")), now, ready=ready
        )
        record = {
            "time": st.iso(now),
            "decision": decision.kind,
            "message": decision.message,
            "actors": {str(g): n for g, n in sorted(decision.desired.items())},
            **obs.record(),
        }
        decided["decision"] = decision
        auto["lastEvaluation"] = record
        if decision.desired == decision.current:
            return {"autoscale": auto}
        # Record the decision first (its time starts the cooldown), then act on it.
        auto.update({"lastRescaleTime": st.iso(now), "lastDecision": record})
        if decision.kind in ("up", "down"):
            auto[f"lastScale{decision.kind.capitalize()}Time"] = st.iso(now)
        reason = {"up": "ScaledUp", "down": "ScaledDown", "bounds": "Clamped"}[decision.kind]
        return {
            "autoscale": auto,
            "conditions": st.set_conditions(
                cur.get("conditions"), st.condition("Rescaled", True, reason, decision.message, now=now)
            ),
        }

    await update_status(op, ns, name, compute)
    decision = decided.get("decision")
    if decision is None:
        return
    op.metrics.rescales.labels(decision=decision.kind).inc()
    if decision.desired == decision.current:
        return
    for g, n in decision.desired.items():
        if n != decision.current[g]:
            await op.kube.patch("StatefulSet", ns, actor_set_name(name, g), {"spec": {"replicas": n}})
    kopf.info(body, reason="Rescaled", message=decision.message[:900])
    logger.info("rescaled: %s", decision.message)
