"""Reconciliation (create, resume, update): level-based and idempotent, in three steps.

    plan      validate the spec (pydantic) → compare with the applied spec stored on the
              ConfigMap (immutable changes are refused as a whole) → plan once
              (tianji.control.planner.plan.resolve) → a host-network job's node ports
    children  create whatever child is missing (fixed names; 409 means "already there"), set
              the actor replicas, record the applied spec on the ConfigMap last
    status    the plan, phase, conditions and groups, computed from a fresh read

A step that cannot apply the spec raises `Refused`; `refuse` records it in status.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

import kopf

from tianji.control.contracts.ports import HOST_PORT_REASONS, HostPortError, PortBlock, block_of, is_pinned, with_block
from tianji.control.planner.plan import PlanError, resolve
from tianji.control.spec import SpecError, TianJiJob, deprecated_fields

from . import status as st
from .children import builders as b
from .children import hostports as hp
from .children import statevolume
from .children.lifecycle import creation_refused, delete_role_pods, refused_for_good
from .context import InvalidSpec, Operator, actor_sets, adopt, checked_job, is_mutable, read_applied, update_status
from .kube import ApiError


class Refused(Exception):
    """The spec cannot be applied: `reason` (the Planned condition's reason) and `message`."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason, self.message = reason, message


@dataclass
class Run:
    """One reconcile: the job as it is now and which handler asked."""

    op: Operator
    body: Any
    handler: str
    logger: kopf.Logger
    name: str
    ns: Optional[str]
    gen: Optional[int]
    status: dict  # the live status (a fresh read), not the handler's copy
    now: float
    cm: Optional[dict]  # the job's ConfigMap: None until its children were first created

    @property
    def ended(self) -> bool:
        """A job that ran and ended: it keeps its final phase and conditions, and gets no children."""
        return self.status.get("phase") in st.TERMINAL and self.cm is not None

    def condition(self, ctype: str, ok: bool, reason: str, message: str) -> dict:
        return st.condition(ctype, ok, reason, message, now=self.now, generation=self.gen)


@dataclass
class Planned:
    """What the children are built from."""

    job: TianJiJob  # the spec as written (validated)
    resolved: TianJiJob  # the job as planned: topology, per-role resources, host ports
    plan: Optional[dict]  # the plan in force (made now, or recorded on the ConfigMap)
    planned_now: bool = False
    actors_changed: bool = False  # an edit of spec.topology.actors, applied now
    host_block: Optional[PortBlock] = None  # hostNetwork: the job's node ports (tianji.control.contracts.ports)

    @property
    def suspended(self) -> bool:
        return self.resolved.spec.run_policy.suspend


async def reconcile(op: Operator, body: Any, patch: Any, logger: kopf.Logger, handler: str) -> None:
    run = await _read(op, body, handler, logger)
    if run is None:
        return
    try:
        planned = await plan_step(run)
    except Refused as e:
        return await refuse(run, e.reason, e.message)
    if planned is None:  # failed on its host ports: a restart does not rewrite that end
        op.metrics.reconciles.labels(handler=handler, result="KeptFailed").inc()
        return
    for note in deprecated_fields(body.get("spec")):
        kopf.warn(body, reason="DeprecatedField", message=note)
    done = await children_step(run, planned)
    if done is None:  # admission refused a child for good: the job failed (creation_refused)
        return
    desired, created = done
    await status_step(run, planned, desired)
    op.metrics.reconciles.labels(handler=handler, result="ok").inc()
    if planned.planned_now:
        kopf.info(body, reason="Planned", message=_plan_summary_from(planned.plan))
    if created and run.cm is not None:
        kopf.info(body, reason="Recreated", message=", ".join(created)[:900])
    elif run.cm is not None and handler == "update":
        kopf.info(body, reason="Updated", message="applied the changed mutable fields")


async def _read(op: Operator, body: Any, handler: str, logger: kopf.Logger) -> Optional[Run]:
    """The job read afresh (None: it is gone): a resume or update handler may carry a body from
    before the job ended, and acting on it would bring an ended job's actors back."""
    meta = body["metadata"]
    name, ns = meta["name"], meta.get("namespace")
    fresh = await op.kube.get("TianJiJob", ns, name)
    if fresh is None:
        return None
    op.memory(ns, name)  # from here the pod watch records the job's pods (timers/restarts.watch_pod)
    status, now = dict(fresh.get("status") or {}), op.now()
    cm = await op.kube.get("ConfigMap", ns, b.configmap_name(name))
    return Run(op, body, handler, logger, name, ns, meta.get("generation"), status, now, cm)


async def refuse(run: Run, reason: str, message: str) -> None:
    """Planned=False with `reason`, a Warning event. A job that never ran fails, with nothing
    created; a created job keeps running its applied spec."""
    conds = [run.condition("Planned", False, reason, message)]
    fields: dict[str, Any] = {"observedGeneration": run.gen}
    if run.cm is None:
        fields["phase"] = st.FAILED
        fields["completionTime"] = st.iso(run.now)
        conds += [
            run.condition("Failed", True, reason, message),
            run.condition("Succeeded", False, reason, message),
            run.condition("Ready", False, reason, "no pods were created"),
            run.condition("Progressing", False, reason, message),
        ]
    else:
        applied_gen = (run.cm["metadata"].get("annotations") or {}).get(b.ANNOTATION_GENERATION, "?")
        conds[0]["message"] = f"{message}; the job keeps running its applied spec (generation {applied_gen})"

    def compute(fresh: dict) -> Optional[dict]:
        cur = fresh.get("status") or {}
        if cur.get("phase") in st.TERMINAL and run.cm is not None:
            return None  # a job that ran and ended keeps its final conditions
        return {**fields, "conditions": st.set_conditions(cur.get("conditions"), *conds)}

    await update_status(run.op, run.ns, run.name, compute)
    kopf.warn(run.body, reason=reason, message=message[:900])
    run.op.metrics.reconciles.labels(handler=run.handler, result=reason).inc()
    run.logger.warning("%s: %s", reason, message)


# ----------------------------------------------------------------- plan
async def plan_step(run: Run) -> Optional[Planned]:
    """The job to build the children from; None for a job that failed on its host ports (a
    spec edit tries again). Raises Refused."""
    try:
        job = checked_job(run.body)
    except InvalidSpec as e:
        raise Refused("InvalidSpec", str(e)) from None
    if run.cm is not None:
        planned = _applied_with_edits(run.cm, job)
    elif _kept_failed(run):
        return None
    else:
        planned = await _first_plan(run, job)
    if planned.resolved.spec.network.host_network:
        await _host_ports(run, planned)
    return planned


def _applied_with_edits(cm: dict, job: TianJiJob) -> Planned:
    """A created job: the applied, planned job with the spec's mutable edits (autoscale,
    runPolicy, topology.actors). An immutable change refuses the whole edit."""
    applied, resolved = read_applied(cm)
    plan = json.loads(cm["metadata"].get("annotations", {}).get(b.ANNOTATION_PLAN) or "null")
    new_spec = json.loads(b.spec_json(job.spec))
    changes = st.diff_paths(applied, new_spec)
    fixed = [c for c in changes if not is_mutable(c[0])]
    if fixed:
        listing = "; ".join(f"{p}: {json.dumps(o)} -> {json.dumps(n)}" for p, o, n in fixed[:8])
        raise Refused(
            "ImmutableFieldChanged",
            f"{listing}{' ...' if len(fixed) > 8 else ''} cannot change on a "
            "created job (delete and re-create it); no change was applied",
        )
    planned = Planned(job, resolved, plan)
    if changes:
        doc = resolved.to_manifest()
        doc["spec"]["autoscale"] = new_spec["autoscale"]
        doc["spec"]["runPolicy"] = new_spec["runPolicy"]
        if any(p == "spec.topology.actors" for p, _, _ in changes) and not job.spec.topology.auto:
            doc["spec"]["topology"]["actors"] = job.spec.topology.actors
            planned.actors_changed = True
        planned.resolved = TianJiJob.model_validate(doc)
    return planned


def _kept_failed(run: Run) -> bool:
    """A job that failed on its host ports stays failed when the operator restarts."""
    return (
        run.status.get("phase") == st.FAILED
        and run.handler != "update"
        and any(
            c.get("type") == "Failed" and c.get("reason") in HOST_PORT_REASONS
            for c in run.status.get("conditions") or []
        )
    )


async def _first_plan(run: Run, job: TianJiJob) -> Planned:
    """A job not yet created: planned now, once, with where its learner state lives, for good."""
    try:
        resolved, plan = resolve(job, run.op.profile)
    except (PlanError, SpecError, ValueError) as e:
        raise Refused("PlanFailed", str(e)) from None
    record = st.camel_keys(plan.to_json())
    record["stateVolume"] = await statevolume.decide(run.op, resolved)
    return Planned(job, resolved, record, planned_now=True)


async def _host_ports(run: Run, planned: Planned) -> None:
    """A host-network job's block of node ports: fixed at creation (as recorded in status, else
    as the planned job has them), handed out first fit before anything is created."""
    recorded = hp.recorded_block(run.body)
    if run.cm is not None:
        planned.host_block = PortBlock.from_status(recorded or {}) or block_of(
            planned.resolved, is_pinned(planned.job.spec.network)
        )
        run.op.host_ports[hp.key(run.ns, run.name)] = planned.host_block
        return
    try:
        planned.host_block = await hp.job_block(run.op, run.ns, run.name, planned.resolved, planned.job, recorded)
        planned.resolved = TianJiJob.model_validate(with_block(planned.resolved.to_manifest(), planned.host_block))
    except HostPortError as e:
        raise Refused(e.reason, str(e)) from None
    except ValueError as e:  # pinned ports that do not fit the planned topology
        hp.release(run.op, run.ns, run.name)
        raise Refused("PlanFailed", str(e)) from None


# ----------------------------------------------------------------- children
async def children_step(run: Run, planned: Planned) -> Optional[tuple[dict[int, int], list[str]]]:
    """Create what is missing and record what is applied: (actors per group, the children
    created), or None when admission refused a child for good and the job failed."""
    op = run.op
    try:
        desired = await _desired_actors(run, planned)
        objs = b.children(
            planned.resolved,
            planned.job.spec,
            desired,
            scrapers=op.config.metrics_scrapers,
            command=op.config.worker_command,
            defaults=op.config.worker_defaults,
            generation=run.gen or 0,
            plan=planned.plan,
        )
        if planned.suspended:  # no learner/buffer pods; actors at 0 replicas
            objs = [o for o in objs if o["kind"] != "Pod"]
            if not run.ended:
                await delete_role_pods(op, run.ns, run.name)
        created: Optional[list[str]] = [] if run.ended else await _ensure(run, planned, objs, desired)
        if created is None:
            return None
        if run.cm is not None:  # the ConfigMap records what is applied: written last
            await _record_applied(run, run.cm, objs[0])
    except ApiError as e:
        op.metrics.errors.labels(where="api").inc()
        kopf.warn(run.body, reason="ApiError", message=str(e)[:500])
        raise kopf.TemporaryError(str(e), delay=op.config.handler_backoff) from e
    return desired, created


async def _desired_actors(run: Run, planned: Planned) -> dict[int, int]:
    """Actor replicas per group: spec.topology.actors, or, while autoscaling, what the
    autoscaler or an external scaler set (in planner mode within min/maxActors); 0 suspended."""
    a, topo = planned.resolved.spec.autoscale, planned.resolved.spec.topology
    resuming = not planned.suspended and run.status.get("phase") == st.SUSPENDED
    sets = await actor_sets(run.op, run.ns, run.name, topo.groups)
    desired: dict[int, int] = {}
    for g in range(topo.groups):
        n, actor_set = topo.actors, sets[g]
        if a.effective_mode != "off" and actor_set is not None and not planned.actors_changed and not resuming:
            n = int(actor_set["spec"].get("replicas") or 0)  # the autoscaler / external scaler owns replicas
        if a.effective_mode == "planner":
            n = min(max(n, a.min_actors), a.max_actors)
        desired[g] = 0 if planned.suspended else n
    return desired


async def _ensure(run: Run, planned: Planned, objs: list[dict], desired: dict[int, int]) -> Optional[list[str]]:
    """Each child created unless it exists (owned by the job), an existing actor StatefulSet set
    to its desired replicas: the children created, or None when one was refused for good."""
    created = []
    for obj in objs:
        adopt(obj, run.body)
        try:
            got, was_created = await run.op.kube.ensure(obj)
        except ApiError as e:
            if not refused_for_good(e):
                raise
            await creation_refused(run.op, run.body, planned.resolved, obj, e, run.now, run.logger, run.handler)
            return None
        if was_created:
            created.append(f"{obj['kind']}/{obj['metadata']['name']}")
        elif obj["kind"] == "StatefulSet":
            g = int(obj["metadata"]["labels"][b.LABEL_GROUP])
            if (got.get("spec") or {}).get("replicas") != desired[g]:
                await run.op.kube.patch(
                    "StatefulSet", run.ns, obj["metadata"]["name"], {"spec": {"replicas": desired[g]}}
                )
    return created


async def _record_applied(run: Run, cm: dict, want: dict) -> None:
    """The ConfigMap `want` (the planned job, the applied spec) written over the live `cm` where they differ."""
    if want["data"] != cm.get("data") or want["metadata"]["annotations"][b.ANNOTATION_SPEC] != cm["metadata"].get(
        "annotations", {}
    ).get(b.ANNOTATION_SPEC):
        await run.op.kube.patch(
            "ConfigMap",
            run.ns,
            want["metadata"]["name"],
            {"data": want["data"], "metadata": {"annotations": want["metadata"]["annotations"]}},
        )


# ----------------------------------------------------------------- status
async def status_step(run: Run, planned: Planned, desired: dict[int, int]) -> None:
    """status.plan, hostPorts, phase, conditions and groups, computed from a fresh read: a job
    that ran and ended keeps its final phase and conditions."""
    resolved, plan = planned.resolved, planned.plan
    always = [
        run.condition("Planned", True, "Planned", _plan_summary_from(plan, desired)),
        run.condition("Failed", False, "SpecValid", "the spec is valid and planned"),
        statevolume.condition(resolved, plan, run.now, run.gen),
    ]

    def compute(fresh: dict) -> Optional[dict]:
        cur = fresh.get("status") or {}
        fields: dict[str, Any] = {}
        if plan is not None and (planned.planned_now or not cur.get("plan")):
            fields["plan"] = plan  # also after a restart that interrupted the first status write
        if planned.host_block is not None:
            fields["hostPorts"] = planned.host_block.to_status()
        if cur.get("phase") in st.TERMINAL and run.cm is not None:
            return fields
        phase_fields, conds = _phase(run, planned, cur)
        fields.update(observedGeneration=run.gen, **phase_fields)
        if "groups" not in cur or planned.planned_now:
            replicas = {g: {"spec": {"replicas": n}} for g, n in desired.items()}
            fields["groups"], fields["actors"] = st.summarize(
                resolved.spec.topology, [], replicas, b.LABEL_ROLE, b.LABEL_GROUP
            )
        fields["conditions"] = st.set_conditions(cur.get("conditions"), *always, *conds)
        return fields

    await update_status(run.op, run.ns, run.name, compute)


def _phase(run: Run, planned: Planned, cur: dict) -> tuple[dict, list[dict]]:
    """Phase fields and their conditions: Suspended while runPolicy.suspend holds; otherwise
    Pending until the monitor sees the job Running."""
    phase = cur.get("phase")
    fields: dict[str, Any] = {}
    conds: list[dict] = []
    if planned.suspended != (phase == st.SUSPENDED):
        fields["podsSeen"] = {}  # pods the operator deletes or re-creates itself are no disruption
        run.op.memory(run.ns, run.name).forget_pods(st.iso(run.now))
    if planned.suspended:
        why = statevolume.suspend_message(planned.resolved, planned.plan)
        fields["phase"] = st.SUSPENDED
        conds += [
            run.condition("Suspended", True, "Suspended", why),
            run.condition("Ready", False, "Suspended", why),
            run.condition("Progressing", False, "Suspended", why),
        ]
    elif phase not in (st.PENDING, st.RUNNING):
        fields["phase"] = st.PENDING
        conds += [
            run.condition("Ready", False, "PodsStarting", "waiting for the pods"),
            run.condition("Progressing", True, "Starting", "creating pods"),
        ]
        if phase == st.SUSPENDED:
            conds.append(run.condition("Suspended", False, "Resumed", "runPolicy.suspend is false: pods re-created"))
    if not planned.suspended and (not cur.get("activeSince") or phase == st.SUSPENDED):
        fields["activeSince"] = st.iso(run.now)  # runPolicy.activeDeadlineSeconds counts from here
    return fields, conds


def _plan_summary_from(plan_json: Optional[dict], desired: Optional[dict[int, int]] = None) -> str:
    """The plan in words, with the actors the groups have now (a /scale or spec edit changes them)."""
    if not plan_json:
        return "planned"
    p = plan_json
    now = sorted(set((desired or {}).values()))
    actors = (
        f"{p['actors']} actors"
        if not now or now == [p["actors"]]
        else (f"{'/'.join(map(str, now))} actors (planned {p['actors']})")
    )
    return (
        f"{p['groups']} group(s) x ({actors}, {p['buffers']} buffers, {p['learners']} learners); "
        f"{p['cpusUsed']:g} cores, {p['gpusUsed']} GPUs; predicted {p['producedFps']:.0f} frames/s produced, "
        f"{p['consumedSps']:.0f} samples/s consumed; {p['bottleneck']}"
    )
