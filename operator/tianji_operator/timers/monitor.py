"""The monitor timer: count, watch the children, end the job.

Each tick reads the pods' reports into the job's accounting (counting.py), derives phase
and readiness from the children, re-creates what is missing, applies the run policy
(backoffLimit, activeDeadlineSeconds, ttlSecondsAfterFinished), and ends the job on its
stop rule (tianji.control.contracts.accounting.StopRule, as `tianji run`). After the end it only
counts the final reports of the pods still stopping.
"""

from __future__ import annotations

from typing import Any, Optional

import kopf

from tianji.control.contracts import episodes
from tianji.control.contracts.accounting import StopRule
from tianji.control.contracts.addressing import actor_set_name
from tianji.control.spec import SpecError, parse_job

from .. import status as st
from ..children import builders as b
from ..children.lifecycle import (
    KEPT_WHOLE,
    PRIVILEGED_HINT,
    child_exists,
    clean_up,
    finish,
    reconcile_manual_scaling,
    recreate_configmap,
)
from ..context import Operator, actor_sets, adopt, current_spec, manifest_of, read_applied, run_policy_of, update_status
from ..kube import ApiError
from .confirm import confirm_pods, confirm_target, describe, passed_fields
from .counting import count_reports, counted_fields, elapsed_since_start, final_counted_fields, learners_behind
from .nodelost import release as release_lost_pods
from .outcome import target_outcome
from .restarts import Ledger, expected_pods


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
        events = await op.kube.list(
            "Event",
            ns,
            field_selector=(f"involvedObject.kind=StatefulSet,involvedObject.name={sts},reason=FailedCreate"),
        )
        if not events:
            continue
        last = max(
            events,
            key=lambda ev: (
                ev.get("lastTimestamp") or ev.get("eventTime") or "",
                ev["metadata"].get("resourceVersion", ""),
            ),
        )
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


# A container's waiting reasons (the kubelet's) that no restart cures: its image cannot be had.
IMAGE_PULL_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "RegistryUnavailable",
        "SignatureValidationFailed",
    }
)


def _image_pull_failures(pods: list[dict]) -> list[tuple[str, str]]:
    """(pod, "reason: image: the kubelet's message") of the containers whose image cannot be pulled."""
    out = []
    for p in pods:
        status = p.get("status") or {}
        for c in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            waiting = (c.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in IMAGE_PULL_REASONS:
                why = f"{waiting['reason']}: {c.get('image') or '?'}"
                out.append((p["metadata"]["name"], f"{why}: {waiting['message']}" if waiting.get("message") else why))
    return out


def _oom_killed(pods: list[dict]) -> list[tuple[str, str, int]]:
    """(pod, what happened, restart count) of the containers, not ready now, that the kernel last
    killed over their memory limit: the limit is the role's spec.resources.<role>.memory."""
    out = []
    for p in pods:
        role = (p["metadata"].get("labels") or {}).get(b.LABEL_ROLE, "?")
        spec = p.get("spec") or {}
        limits = {
            c["name"]: ((c.get("resources") or {}).get("limits") or {}).get("memory", "?")
            for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        }
        status = p.get("status") or {}
        for c in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            ended = (c.get("state") or {}).get("terminated") or (c.get("lastState") or {}).get("terminated") or {}
            if ended.get("reason") == "OOMKilled" and not c.get("ready"):
                why = (
                    f"container {c['name']} OOMKilled at its memory limit {limits.get(c['name'], '?')} "
                    f"(spec.resources.{role}.memory)"
                )
                out.append((p["metadata"]["name"], why, int(c.get("restartCount") or 0)))
    return out


def _unschedulable(pods: list[dict]) -> list[tuple[str, str]]:
    """(pod, scheduler message) of the pods the scheduler cannot place."""
    out = []
    for p in pods:
        for c in (p.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
                out.append((p["metadata"]["name"], c.get("message") or "unschedulable"))
    return out


async def _expire(op: Operator, body: Any, status: dict, now: float, logger: kopf.Logger) -> bool:
    """runPolicy.ttlSecondsAfterFinished: delete a job that ended long enough ago. True if deleted."""
    rp = run_policy_of(body, None)
    done = st.parse_iso(status.get("completionTime"))
    if rp is None or rp.ttl_seconds_after_finished is None or done is None or status.get("phase") not in st.TERMINAL:
        return False
    if now - done < rp.ttl_seconds_after_finished:
        return False
    ns, name = body["metadata"].get("namespace"), body["metadata"]["name"]
    logger.info(
        "%s ended %.0f s ago: ttlSecondsAfterFinished %d, deleting it", name, now - done, rp.ttl_seconds_after_finished
    )
    await op.kube.delete("TianJiJob", ns, name)
    return True


# ----------------------------------------------------------------- monitor
async def monitor(op: Operator, body: Any, patch: Any, logger: kopf.Logger, pods: list[dict]) -> None:
    """One tick for one job; `pods`: the job's pods as the watch last saw them (an index)."""
    name, ns = body["metadata"]["name"], body["metadata"].get("namespace")
    pods, check_pod = confirm_pods(pods)  # the confirming evaluation's pod is no worker: no reports
    # The live object, not the timer's copy: that may predate the end (or a suspension), and a
    # tick acting on it would heal or scale the children of a job that is over.
    body = await op.kube.get("TianJiJob", ns, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return
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
    mem = op.memory(ns, name)
    mem.accounting(status)
    mem.bounds = episodes.without_gym(resolved.spec.env)
    acc, live = await count_reports(
        op, mem, name, pods, resolved.spec.network.metrics_port, ended=status.get("phase") in st.TERMINAL
    )
    acc.sample(now)
    lost = await release_lost_pods(op, body, pods, now, logger)
    if lost:  # their objects are gone: the self-healing below (or the StatefulSet) makes them again
        gone = {ln.split()[1] for ln in lost}
        pods = [p for p in pods if p["metadata"]["name"] not in gone]
        mem.node_lost = "; ".join(lost)
    if status.get("phase") in st.TERMINAL:
        if check_pod is not None:  # the job ended another way meanwhile: its check is moot
            await op.kube.delete("Pod", ns, check_pod["metadata"]["name"])
        return await _after_end(op, body, resolved, pods, acc, now)
    rp = run_policy_of(body, resolved)
    if rp.suspend or status.get("phase") == st.SUSPENDED:
        return  # reconcile deletes the pods on suspend and re-creates them on resume
    topo = resolved.spec.topology
    sets = await actor_sets(op, ns, name, topo.groups)
    expected = expected_pods(name, topo, sets, resolved.spec.evaluation.enabled)
    ledger = Ledger(status)
    ledger.observe(pods, expected, mem.watched, _watch_since(body, mem))
    actors_back = [p for p in ledger.recreated if p.startswith(f"{name}-actor-")]
    if actors_back:  # learner/buffer pods: the operator's own re-creation posts the event
        kopf.warn(
            body,
            reason="Recreated",
            message=("Pod/" + ", Pod/".join(actors_back) + " (re-created by its StatefulSet)")[:900],
        )
    ended, waiting = await _decide_end(op, body, resolved, pods, check_pod, acc, live, ledger, rp, status, now)
    if ended:
        return
    await _restart_stopped(op, body, pods, logger)
    await _heal(op, body, resolved, pods, sets, status, logger)
    await reconcile_manual_scaling(op, body, resolved, sets, logger)
    await _write_running(op, body, resolved, pods, sets, acc, expected, now, waiting)


def _watch_since(body: Any, mem: Any) -> str:
    """Pods the watch saw that were created before this are not the job's to count: a deleted
    namesake job's, or those a suspend or resume replaced."""
    return max(str(body["metadata"].get("creationTimestamp") or ""), mem.watch_since)


def _role_pods(pods: list[dict], *roles: str) -> list[dict]:
    return [p for p in pods if p["metadata"].get("labels", {}).get(b.LABEL_ROLE) in roles]


def _deleting(pod: dict) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


async def _decide_end(
    op: Operator,
    body: Any,
    resolved: Any,
    pods: list[dict],
    check_pod: Optional[dict],
    acc: Any,
    live: list,
    ledger: Ledger,
    rp: Any,
    status: dict,
    now: float,
) -> tuple[bool, str]:
    """End the job if it must: (ended, why the stop rule holds but the job goes on).

    Success is the stop rule only (as `tianji run`), backed by the learners' own live reports
    (counting.learners_behind) and, for the target, by the saved policy's confirming evaluation
    (confirm.py: the actors' returns only trigger it). A learner or buffer pod that exited 0 or is being deleted is
    never "completed" (a worker stops with exit 0 on SIGTERM: a deletion, an eviction, a node
    shutdown) and a deleted pod that fails while it stops is no failure of the job."""
    topo = resolved.spec.topology
    waiting = ""
    if status.get("startTime"):  # started (a pod being replaced makes it Pending again, not unstarted)
        try:
            live_spec = parse_job(manifest_of(body)).spec
        except SpecError:
            live_spec = resolved.spec
        rule = StopRule(live_spec.stop)
        elapsed = elapsed_since_start(status, now)
        why = rule.check(acc, elapsed)
        if why:
            # stop.seconds is a budget: it ends the job whatever the learners hold
            behind = [] if why == "seconds" else learners_behind(acc, live, topo, trained=why == "target")
            reason = rule.message(why, acc, elapsed)
            confirmed: dict = {}
            if not behind and why == "target":
                check, behind_check = await confirm_target(op, body, resolved, pods, check_pod, acc, live, now)
                if check is None:
                    behind = [behind_check]
                else:
                    confirmed = passed_fields(body, check)
            if not behind:
                end, met, how = target_outcome(why, rule, acc, elapsed)
                if confirmed:
                    how += describe(confirmed["targetEvaluation"])
                await finish(
                    op,
                    body,
                    resolved,
                    pods,
                    acc,
                    st.SUCCEEDED,
                    "StopConditionReached",
                    reason,
                    now,
                    extra={**ledger.fields(), "endReason": end, **confirmed},
                    conditions=(
                        st.condition(
                            "TargetReached",
                            met,
                            end,
                            how[:1000],
                            now=now,
                            generation=body["metadata"].get("generation"),
                        ),
                    ),
                )
                return True, ""
            waiting = f"{reason}, but {'; '.join(behind)}"
    failed = [p for p in _role_pods(pods, "learner", "buffer") if st.pod_phase(p) == "Failed" and not _deleting(p)]
    if failed:
        p = failed[0]
        why = (p.get("status") or {}).get("reason") or (p.get("status") or {}).get("message") or "Failed"
        await finish(
            op,
            body,
            resolved,
            pods,
            acc,
            st.FAILED,
            "PodFailed",
            f"pod {p['metadata']['name']} failed: {why}",
            now,
            extra=ledger.fields(),
        )
        return True, waiting
    if ledger.total > rp.backoff_limit:
        await finish(
            op,
            body,
            resolved,
            pods,
            acc,
            st.FAILED,
            "BackoffLimitExceeded",
            f"{ledger.total} container restarts exceed runPolicy.backoffLimit ({rp.backoff_limit}); "
            f"last: {ledger.last or 'counted before'}",
            now,
            extra=ledger.fields(),
        )
        return True, waiting
    since = st.parse_iso(status.get("activeSince"))
    if rp.active_deadline_seconds is not None and since is not None and now - since >= rp.active_deadline_seconds:
        await finish(
            op,
            body,
            resolved,
            pods,
            acc,
            st.FAILED,
            "DeadlineExceeded",
            f"active for {now - since:.0f} s: runPolicy.activeDeadlineSeconds is {rp.active_deadline_seconds}",
            now,
            extra=ledger.fields(),
        )
        return True, waiting
    return False, waiting


async def _restart_stopped(op: Operator, body: Any, pods: list[dict], logger: kopf.Logger) -> None:
    """A learner, buffer or evaluator pod that exited 0 while the job runs (its worker was
    stopped by a signal: restartPolicy OnFailure leaves it stopped) is deleted; the next tick
    makes it again, and the learner resumes from its checkpoint."""
    ns = body["metadata"].get("namespace")
    for p in _role_pods(pods, *b.POD_ROLES):
        if st.pod_phase(p) == "Succeeded" and not _deleting(p):
            logger.info("pod %s stopped while the job runs: deleting it to start it again", p["metadata"]["name"])
            await op.kube.delete("Pod", ns, p["metadata"]["name"])


async def _heal(
    op: Operator, body: Any, resolved: Any, pods: list[dict], sets: dict, status: dict, logger: kopf.Logger
) -> None:
    """Self-healing: a learner/buffer pod, a StatefulSet or a kept child that is gone comes back."""
    ns = body["metadata"].get("namespace")
    topo = resolved.spec.topology
    by_name = {p["metadata"]["name"]: p for p in pods}
    expected = b.children(
        resolved,
        resolved.spec,
        {g: topo.actors for g in range(topo.groups)},
        scrapers=op.config.metrics_scrapers,
        command=op.config.worker_command,
        defaults=op.config.worker_defaults,
        plan=status.get("plan"),
    )
    recreated = []
    try:
        for obj in expected:
            kind, oname = obj["kind"], obj["metadata"]["name"]
            missing = (
                (kind == "Pod" and oname not in by_name)
                or (kind == "StatefulSet" and sets.get(int(obj["metadata"]["labels"][b.LABEL_GROUP])) is None)
                or (kind in KEPT_WHOLE and not await child_exists(op, kind, ns, oname))
            )
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


async def _write_running(
    op: Operator,
    body: Any,
    resolved: Any,
    pods: list[dict],
    sets: dict,
    acc: Any,
    expected: set[str],
    now: float,
    waiting: str,
) -> None:
    """Phase, readiness, groups, restarts and the counts of a job that goes on."""
    name, ns, gen = body["metadata"]["name"], body["metadata"].get("namespace"), body["metadata"].get("generation")
    topo = resolved.spec.topology
    mem = op.memory(ns, name)
    fixed_pods = _role_pods(pods, "learner", "buffer")
    groups, actors = st.summarize(topo, pods, sets, b.LABEL_ROLE, b.LABEL_GROUP)
    want_fixed = topo.groups * (topo.learners + topo.buffers)
    running = len(fixed_pods) == want_fixed and all(
        st.pod_phase(p) == "Running" and not _deleting(p) for p in fixed_pods
    )
    ready = st.all_ready(groups) and running
    stuck = _unschedulable(pods)
    no_image = _image_pull_failures(pods)
    for reason, found in (("Unschedulable", stuck), ("ImagePullFailed", no_image)):
        for pod_name, why in found:  # one Event per pod, not one per tick
            if f"{reason}/{pod_name}" not in mem.warned:
                mem.warned.add(f"{reason}/{pod_name}")
                kopf.warn(body, reason=reason, message=f"pod {pod_name}: {why}"[:900])
    oom = _oom_killed(pods)
    for pod_name, why, restarts in oom:  # one Event per kill
        if f"OOMKilled/{pod_name}/{restarts}" not in mem.warned:
            mem.warned.add(f"OOMKilled/{pod_name}/{restarts}")
            kopf.warn(body, reason="OOMKilled", message=f"pod {pod_name}: {why}"[:900])
    refused = [] if ready else await _failed_creates(op, body, groups)
    if ready:
        mem.node_lost = ""
        conds = [st.condition("Ready", True, "AllPodsReady", f"actors {actors} ready", now=now, generation=gen)]
    elif refused:
        conds = [st.condition("Ready", False, "FailedCreate", "; ".join(refused)[:1000], now=now, generation=gen)]
    elif mem.node_lost:
        conds = [st.condition("Ready", False, "NodeLost", mem.node_lost[:1000], now=now, generation=gen)]
    elif no_image or stuck:  # per pod: an image no node can pull, or no node to place it on
        reason, found = ("ImagePullFailed", no_image) if no_image else ("Unschedulable", stuck)
        said = "; ".join(f"pod {p}: {w}" for p, w in found)[:1000]
        conds = [st.condition("Ready", False, reason, said, now=now, generation=gen)]
    elif oom:
        said = "; ".join(f"pod {p}: {w}" for p, w, _ in oom)[:1000]
        conds = [st.condition("Ready", False, "OOMKilled", said, now=now, generation=gen)]
    else:
        conds = [st.condition("Ready", False, "PodsNotReady", _not_ready(groups), now=now, generation=gen)]
    if waiting:
        conds.append(st.condition("Progressing", True, "CatchingUp", waiting[:1000], now=now, generation=gen))
    elif running:
        conds.append(
            st.condition("Progressing", True, "Training", "learners and buffers are running", now=now, generation=gen)
        )
    else:
        conds.append(
            st.condition(
                "Progressing", True, "Starting", "waiting for learner and buffer pods", now=now, generation=gen
            )
        )

    def compute(fresh: dict) -> Optional[dict]:
        cur = fresh.get("status") or {}
        if cur.get("phase") in st.TERMINAL:
            return None  # ended meanwhile (another tick): the next tick counts the final reports
        if cur.get("phase") == st.SUSPENDED:
            return None  # suspended meanwhile
        ledger = Ledger(cur)  # from the status this write is computed from: nothing counted twice
        ledger.observe(pods, expected, mem.watched, _watch_since(body, mem))
        fields: dict[str, Any] = {
            "groups": groups,
            "actors": actors,
            "phase": st.RUNNING if running else st.PENDING,
            "conditions": st.set_conditions(cur.get("conditions"), *conds),
            **ledger.fields(),
            **_scale_status(name, groups),
        }
        if not cur.get("activeSince"):  # a job created by an older operator
            fields["activeSince"] = st.iso(now)
        if running and not cur.get("startTime"):
            fields["startTime"] = st.iso(now)
        if cur.get("startTime") or running:
            fields.update(counted_fields(acc, {**cur, **fields}, now))
        op.metrics.job_status(ns or "", name, {**cur, **fields})
        return fields

    await update_status(op, ns, name, compute)


async def _after_end(op: Operator, body: Any, resolved: Any, pods: list[dict], acc: Any, now: float) -> None:
    """An ended job: no phase or condition changes, nothing healed or scaled up; cleanPodPolicy
    holds (again: the operator may have stopped between the end and its clean-up); only the
    final counts of the pods still stopping, and groups/actors as they really are (0 actors
    once they are scaled away)."""
    name, ns = body["metadata"]["name"], body["metadata"].get("namespace")
    topo = resolved.spec.topology
    sets = await actor_sets(op, ns, name, topo.groups)
    _, scaled = await clean_up(op, ns, name, resolved, pods, run_policy_of(body, resolved).clean_pod_policy, sets)
    if scaled:
        sets = await actor_sets(op, ns, name, topo.groups)
    groups, actors = st.summarize(topo, pods, sets, b.LABEL_ROLE, b.LABEL_GROUP)
    for e in groups:  # desired after the end: the pods that are left
        for role in ("learners", "buffers"):
            e[role]["desired"] = sum(
                1
                for p in _role_pods(pods, role[:-1])
                if not _deleting(p) and p["metadata"]["labels"].get(b.LABEL_GROUP) == str(e["group"])
            )

    def compute(fresh: dict) -> Optional[dict]:
        cur = fresh.get("status") or {}
        if cur.get("phase") not in st.TERMINAL:
            return None
        fields = {
            **(final_counted_fields(acc, cur, now) or {}),
            "groups": groups,
            "actors": actors,
            **_scale_status(name, groups),
        }
        op.metrics.job_status(ns or "", name, {**cur, **fields})
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
