"""The monitor timer: count, watch the children, end the job.

Each tick reads the pods' reports into the job's accounting (counting.py), derives phase
and readiness from the children, re-creates what is missing, applies the run policy
(backoffLimit, activeDeadlineSeconds, ttlSecondsAfterFinished), and ends the job on its
stop rule (tianji.control.accounting.StopRule, as `tianji run`). After the end it only
counts the final reports of the pods still stopping.
"""
from __future__ import annotations

import logging
from typing import Any, Optional

import kopf

from tianji.control.accounting import StopRule

from tianji.control.addressing import actor_set_name
from tianji.control.spec import SpecError, parse_job

from . import builders as b
from . import status as st
from .children import KEPT_WHOLE, PRIVILEGED_HINT, child_exists, finish, reconcile_manual_scaling, recreate_configmap
from .context import JobMemory, Operator, actor_sets, adopt, current_spec, manifest_of, read_applied, run_policy_of, update_status
from .counting import count_reports, counted_fields, elapsed_since_start, final_counted_fields
from .kube import ApiError
from .nodelost import release as release_lost_pods


def _count_restarts(mem: JobMemory, pods: list[dict]) -> tuple[int, str]:
    """Container restarts of the job's pods, also of pods since gone (by uid); and the last one."""
    last, last_n = "", -1
    for p in pods:
        uid = p["metadata"].get("uid") or p["metadata"]["name"]
        for c in (p.get("status") or {}).get("containerStatuses") or []:
            n = int(c.get("restartCount") or 0)
            mem.restarts[uid] = max(mem.restarts.get(uid, 0), n)
            if n > last_n and n:
                term = (c.get("lastState") or {}).get("terminated") or {}
                detail = ", ".join(x for x in (term.get("reason"), f"exit code {term['exitCode']}"
                                               if "exitCode" in term else None) if x)
                last, last_n = f"pod {p['metadata']['name']} restarted {n} time(s)" + (
                    f" ({detail})" if detail else ""), n
    return sum(mem.restarts.values()), last


async def _failed_creates(op: Operator, body: Any, groups: list[dict]) -> list[str]:
    """The StatefulSet controller's FailedCreate events of groups short of actors (e.g. admission
    refused the actor pods): what went wrong, once as a Warning event of the job too."""
    ns, name = body["metadata"].get("namespace"), body["metadata"]["name"]
    mem = op.memory(ns, name)
    out = []
    for e in groups:
        if e["actors"]["ready"] >= e["actors"]["desired"]:
            continue
        sts = actor_set_name(name, e["group"])
        events = await op.kube.list("Event", ns, field_selector=(
            f"involvedObject.kind=StatefulSet,involvedObject.name={sts},reason=FailedCreate"))
        if not events:
            continue
        last = max(events, key=lambda ev: (ev.get("lastTimestamp") or ev.get("eventTime") or "",
                                          ev["metadata"].get("resourceVersion", "")))
        message = f"StatefulSet {sts}: {last.get('message') or 'FailedCreate'}"
        live = current_spec(body)
        if "violates PodSecurity" in message and live and (live.network.host_network or live.network.rdma):
            message += f"; {PRIVILEGED_HINT}"
        out.append(message)
        key = f"failedcreate/{last['metadata'].get('uid') or last['metadata']['name']}"
        if key not in mem.warned:
            mem.warned.add(key)
            kopf.warn(body, reason="FailedCreate", message=message[:900])
    return out


def _unschedulable(pods: list[dict]) -> list[tuple[str, str]]:
    """(pod, scheduler message) of the pods the scheduler cannot place."""
    out = []
    for p in pods:
        for c in (p.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
                out.append((p["metadata"]["name"], c.get("message") or "unschedulable"))
    return out


async def _expire(op: Operator, body: Any, status: dict, now: float, logger: logging.Logger) -> bool:
    """runPolicy.ttlSecondsAfterFinished: delete a job that ended long enough ago. True if deleted."""
    rp = run_policy_of(body, None)
    done = st.parse_iso(status.get("completionTime"))
    if rp is None or rp.ttl_seconds_after_finished is None or done is None or status.get("phase") not in st.TERMINAL:
        return False
    if now - done < rp.ttl_seconds_after_finished:
        return False
    ns, name = body["metadata"].get("namespace"), body["metadata"]["name"]
    logger.info("%s ended %.0f s ago: ttlSecondsAfterFinished %d, deleting it", name, now - done,
                rp.ttl_seconds_after_finished)
    await op.kube.delete("TianJiJob", ns, name)
    return True


# ----------------------------------------------------------------- monitor
async def monitor(op: Operator, body: Any, patch: Any, logger: logging.Logger, pods: list[dict]) -> None:
    """One tick for one job; `pods`: the job's pods as the watch last saw them (an index)."""
    meta = body["metadata"]
    name, ns = meta["name"], meta.get("namespace")
    status = dict(body.get("status") or {})
    now = op.now()
    if await _expire(op, body, status, now, logger):
        return
    if not status.get("plan"):
        return  # not reconciled yet (the children may be being created)
    cm = await op.kube.get("ConfigMap", ns, b.configmap_name(name))
    if cm is None and status.get("phase") not in st.TERMINAL:
        cm = await recreate_configmap(op, body, status["plan"], logger)
    if cm is None:
        return
    _, resolved = read_applied(cm)
    topo = resolved.spec.topology
    mem = op.memory(ns, name)
    mem.accounting(status)
    acc = await count_reports(op, mem, name, pods, resolved.spec.network.metrics_port)
    acc.sample(now)
    lost = await release_lost_pods(op, body, pods, now, logger)
    if lost:  # their objects are gone: the self-healing below (or the StatefulSet) makes them again
        gone = {ln.split()[1] for ln in lost}
        pods = [p for p in pods if p["metadata"]["name"] not in gone]
        mem.node_lost = "; ".join(lost)
    if status.get("phase") in st.TERMINAL:
        # Ended: no more phase changes, only the final counts of the pods still stopping.
        await update_status(op, ns, name, lambda fresh: final_counted_fields(acc, fresh.get("status") or {}, now))
        return
    rp = run_policy_of(body, resolved)
    if rp.suspend or status.get("phase") == st.SUSPENDED:
        return  # reconcile deletes the pods on suspend and re-creates them on resume
    gen = meta.get("generation")

    sets = await actor_sets(op, ns, name, topo.groups)
    by_name = {p["metadata"]["name"]: p for p in pods}
    fixed_pods = [p for p in pods if p["metadata"].get("labels", {}).get(b.LABEL_ROLE) in ("learner", "buffer")]
    learners = [p for p in pods if p["metadata"].get("labels", {}).get(b.LABEL_ROLE) == "learner"]
    failed = [p for p in fixed_pods if st.pod_phase(p) == "Failed"]

    reason = None
    if learners and len(learners) == topo.groups * topo.learners and all(
            st.pod_phase(p) == "Succeeded" for p in learners):
        reason = "all learner pods completed"
    elif status.get("phase") == st.RUNNING:
        try:
            live_spec = parse_job(manifest_of(body)).spec
        except SpecError:
            live_spec = resolved.spec
        rule = StopRule(live_spec.stop)
        elapsed = elapsed_since_start(status, now)
        why = rule.check(acc, elapsed)
        reason = rule.message(why, acc, elapsed) if why else None
    if reason is not None:
        return await finish(op, body, resolved, pods, acc, st.SUCCEEDED, "StopConditionReached", reason, now)
    if failed:
        p = failed[0]
        why = (p.get("status") or {}).get("reason") or (p.get("status") or {}).get("message") or "Failed"
        return await finish(op, body, resolved, pods, acc, st.FAILED, "PodFailed",
                             f"pod {p['metadata']['name']} failed: {why}", now)
    restarts, last_restart = _count_restarts(mem, pods)
    if restarts > rp.backoff_limit:
        return await finish(op, body, resolved, pods, acc, st.FAILED, "BackoffLimitExceeded",
                             f"{restarts} container restarts exceed runPolicy.backoffLimit ({rp.backoff_limit}); "
                             f"last: {last_restart}", now)
    since = st.parse_iso(status.get("activeSince"))
    if rp.active_deadline_seconds is not None and since is not None and now - since >= rp.active_deadline_seconds:
        return await finish(op, body, resolved, pods, acc, st.FAILED, "DeadlineExceeded",
                             f"active for {now - since:.0f} s: runPolicy.activeDeadlineSeconds is "
                             f"{rp.active_deadline_seconds}", now)

    # Self-healing: a learner/buffer pod or a StatefulSet that is gone comes back.
    expected = b.children(resolved, resolved.spec, {g: topo.actors for g in range(topo.groups)},
                          scrapers=op.config.metrics_scrapers, command=op.config.worker_command,
                          defaults=op.config.worker_defaults)
    recreated = []
    try:
        for obj in expected:
            kind, oname = obj["kind"], obj["metadata"]["name"]
            missing = (kind == "Pod" and oname not in by_name) or (
                kind == "StatefulSet" and sets.get(int(obj["metadata"]["labels"][b.LABEL_GROUP])) is None) or (
                kind in KEPT_WHOLE and not await child_exists(op, kind, ns, oname))
            if missing:
                if kind == "StatefulSet" and resolved.spec.autoscale.effective_mode == "planner":
                    a = resolved.spec.autoscale
                    obj["spec"]["replicas"] = min(max(obj["spec"]["replicas"], a.min_actors), a.max_actors)
                got, created = await op.kube.ensure(adopt(obj, body))
                if created:
                    recreated.append(f"{kind}/{oname}")
                if kind == "StatefulSet":
                    sets[int(obj["metadata"]["labels"][b.LABEL_GROUP])] = got
    except ApiError as e:
        op.metrics.errors.labels(where="api").inc()
        logger.warning("monitor: %s", e)
    if recreated:
        kopf.warn(body, reason="Recreated", message=", ".join(recreated)[:900])
    await reconcile_manual_scaling(op, body, resolved, sets, logger)

    groups, actors = st.summarize(topo, pods, sets, b.LABEL_ROLE, b.LABEL_GROUP)
    want_fixed = topo.groups * (topo.learners + topo.buffers)
    running = len(fixed_pods) == want_fixed and all(st.pod_phase(p) == "Running" for p in fixed_pods)
    ready = st.all_ready(groups) and running
    stuck = _unschedulable(pods)
    for pod_name, why in stuck:
        if f"unschedulable/{pod_name}" not in mem.warned:
            mem.warned.add(f"unschedulable/{pod_name}")
            kopf.warn(body, reason="Unschedulable", message=f"pod {pod_name}: {why}"[:900])
    refused = [] if ready else await _failed_creates(op, body, groups)
    if ready:
        mem.node_lost = ""
        conds = [st.condition("Ready", True, "AllPodsReady", f"actors {actors} ready", now=now, generation=gen)]
    elif refused:
        conds = [st.condition("Ready", False, "FailedCreate", "; ".join(refused)[:1000], now=now, generation=gen)]
    elif mem.node_lost:
        conds = [st.condition("Ready", False, "NodeLost", mem.node_lost[:1000], now=now, generation=gen)]
    elif stuck:
        conds = [st.condition("Ready", False, "Unschedulable", "; ".join(f"pod {p}: {w}" for p, w in stuck)[:1000],
                              now=now, generation=gen)]
    else:
        conds = [st.condition("Ready", False, "PodsNotReady", _not_ready(groups), now=now, generation=gen)]
    if running:
        conds.append(st.condition("Progressing", True, "Training", "learners and buffers are running", now=now,
                                  generation=gen))
    else:
        conds.append(st.condition("Progressing", True, "Starting", "waiting for learner and buffer pods", now=now,
                                  generation=gen))

    def compute(fresh: dict) -> Optional[dict]:
        cur = fresh.get("status") or {}
        if cur.get("phase") in st.TERMINAL:
            return None  # ended meanwhile (another tick): the next tick counts the final reports
        if cur.get("phase") == st.SUSPENDED:
            return None  # suspended meanwhile
        fields: dict[str, Any] = {"groups": groups, "actors": actors, "phase": st.RUNNING if running else st.PENDING,
                                  "conditions": st.set_conditions(cur.get("conditions"), *conds),
                                  "restarts": restarts, **_scale_status(name, groups)}
        if not cur.get("activeSince"):  # a job created by an older operator
            fields["activeSince"] = st.iso(now)
        if running and not cur.get("startTime"):
            fields["startTime"] = st.iso(now)
        if cur.get("startTime") or running:
            fields.update(counted_fields(acc, {**cur, **fields}, now))
        return fields

    await update_status(op, ns, name, compute)


def _scale_status(name: str, groups: list[dict]) -> dict:
    """What the CRD's scale subresource reads (HPA, KEDA): actors per group, the actors' selector."""
    per_group = min((e["actors"]["desired"] for e in groups), default=0)
    return {"actorReplicas": per_group, "actorSelector": f"{b.LABEL_JOB}={name},{b.LABEL_ROLE}=actor"}


def _not_ready(groups: list[dict]) -> str:
    parts = []
    for e in groups:
        for r in ("learners", "buffers", "actors"):
            if e[r]["ready"] < e[r]["desired"]:
                parts.append(f"group {e['group']} {r} {e[r]['ready']}/{e[r]['desired']}")
    return "not ready: " + ", ".join(parts) if parts else "pods not running"
