"""Kopf handlers for TianJiJob: reconcile, monitor, autoscale, delete.

`register(registry, config)` installs them into a Kopf registry (the default
one for `python -m tianji_operator`, a fresh one per test) and returns the
`Operator` context they share (API client, metrics, in-memory scrape state).

Reconciliation (create, resume, update) is level-based and idempotent:
validate the spec (pydantic) → compare with the applied spec stored on the
ConfigMap (immutable changes are refused as a whole) → plan once → create
whatever child is missing (fixed names; 409 means "already there") → status.
The monitor timer reads the pods' reports into the job's accounting
(tianji.control.accounting: the same counting and stop rule as `tianji run`),
derives phase/readiness from the children, re-creates lost learner/buffer pods,
ends the job on its stop rule and applies `cleanPodPolicy`; after the end it
keeps counting the final reports that stopped pods leave in their termination
messages (a pod event handler catches those of pods being deleted). The
autoscale timer rescales actors (see autoscaler.py).

Status writes never use a stale copy: `update_status` reads the job, computes
the fields from that read, and writes them with a JSON patch that tests its
resourceVersion; on a conflict it reads and computes again.
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import aiohttp
import kopf
import yaml

from tianji.control.accounting import Accounting, StopRule, status_numbers

from tianji.control.report import Report, ReportError
from tianji.control.addressing import actor_set_name
from tianji.control.crd import GROUP, PLURAL, VERSION
from tianji.control.plan import PlanError, resolve
from tianji.control.spec import API_VERSION, KIND, JobSpec, RunPolicy, SpecError, TianJiJob, deprecated_fields, parse_job

from . import autoscaler as asc
from . import builders as b
from . import status as st
from .reports import scrape_reports, terminated_reports
from .config import OperatorConfig
from .kube import ApiError, KubeClient
from .metrics import OperatorMetrics

FINALIZER = "tianji.dev/finalizer"
RELEASED = "tianji.dev/released"  # set on a job: the operator lets go of it (no finalizer, no handling)
# Spec fields that may change on a running job. Everything else is fixed at creation:
# pods, their requests and the workers' view of the job would be half old, half new.
MUTABLE = ("spec.topology.actors", "spec.autoscale.", "spec.runPolicy.")


def is_mutable(path: str) -> bool:
    return any(path == m or (m.endswith(".") and path.startswith(m)) for m in MUTABLE)


@dataclass
class JobMemory:
    """What the operator keeps of one job between ticks (rebuilt from status after a restart)."""

    acc: Optional[Accounting] = None  # loaded from status.accounting on first use
    last_sample: Optional[float] = None  # autoscaler: last evaluation
    report_errors: list[str] = field(default_factory=list)
    restarts: dict[str, int] = field(default_factory=dict)  # pod uid -> container restarts seen
    warned: set[str] = field(default_factory=set)  # Events already posted (e.g. unschedulable pods)

    def accounting(self, status: dict) -> Accounting:
        if self.acc is None:
            try:
                self.acc = Accounting(status.get("accounting") or None)
            except ReportError:  # unreadable (hand-edited?): count anew rather than stop
                self.acc = Accounting()
        return self.acc

    def take(self, rep: "Report | ReportError") -> None:
        acc = self.acc if self.acc is not None else Accounting()
        self.acc = acc
        if isinstance(rep, ReportError):
            acc.rejected += 1
            self.report_errors = (self.report_errors + [str(rep)])[-5:]
            return
        try:
            acc.take(rep)
        except ReportError as e:
            acc.rejected += 1
            self.report_errors = (self.report_errors + [str(e)])[-5:]


class Operator:
    """What the handlers share. One per registered operator (tests run several in sequence)."""

    def __init__(self, config: OperatorConfig, metrics: Optional[OperatorMetrics] = None):
        self.config = config
        self.metrics = metrics or OperatorMetrics()
        self.connection: Any = config.connection
        self.kube = KubeClient(self._connection, on_request=self.metrics.api_request)
        self.jobs: dict[tuple[str, str], JobMemory] = {}
        self._http: Optional[aiohttp.ClientSession] = None
        self.closed = False
        self.profile = config.load_profile()

    def _connection(self) -> Any:
        return self.connection

    def http(self) -> aiohttp.ClientSession:
        if self.closed:
            raise ApiError(0, "Closed", "the operator is stopping")
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.config.http_timeout))
        return self._http

    def memory(self, namespace: Optional[str], name: str) -> JobMemory:
        return self.jobs.setdefault((namespace or "", name), JobMemory())

    async def close(self) -> None:
        self.closed = True
        await self.kube.close()
        if self._http is not None:
            await self._http.close()

    def now(self) -> float:
        return self.config.clock()


# ----------------------------------------------------------------- helpers
def _manifest(body: Any) -> dict:
    meta = body["metadata"]
    return {"apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": meta["name"], "namespace": meta.get("namespace")},
            "spec": dict(body.get("spec") or {})}


class StatusConflict(Exception):
    """The job changed between reading it and writing its status."""


async def update_status(op: "Operator", ns: Optional[str], name: str,
                        compute: Callable[[dict], Optional[dict]], attempts: int = 5) -> Optional[dict]:
    """Read the job, compute status fields from THAT read, and write those that changed,
    only if the job is still at the resourceVersion read (a JSON-patch test); on a
    conflict, read and compute again. `compute(body)` returns the fields, or None to
    write nothing. Returns the body the write was computed from (None: the job is gone)."""
    for _ in range(attempts):
        body = await op.kube.get("TianJiJob", ns, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        fields = compute(body)
        current = body.get("status") or {}
        changed = {k: v for k, v in (fields or {}).items() if current.get(k) != v}
        if not changed:
            return body
        if await op.kube.patch_status("TianJiJob", ns, name, body["metadata"]["resourceVersion"], changed,
                                      has_status=bool(current)):
            return body
    raise StatusConflict(f"{name}: status still conflicting after {attempts} fresh reads")


def _applied(cm: dict) -> tuple[dict, TianJiJob]:
    """(applied spec as a plain dict, resolved job) stored on the job's ConfigMap."""
    ann = (cm.get("metadata") or {}).get("annotations") or {}
    applied = json.loads(ann.get(b.ANNOTATION_SPEC) or "{}")
    try:  # written by an older operator: moved fields (cleanPodPolicy) in today's places
        applied = json.loads(b.spec_json(JobSpec.model_validate(applied)))
    except ValueError:
        pass
    resolved = parse_job(yaml.safe_load(cm["data"][b.JOB_FILE]), f"ConfigMap {cm['metadata']['name']}")
    return applied, resolved


async def _statefulsets(op: Operator, ns: str, name: str, groups: int) -> dict[int, Optional[dict]]:
    return {g: await op.kube.get("StatefulSet", ns, actor_set_name(name, g)) for g in range(groups)}


def _adopt(obj: dict, body: Any) -> dict:
    kopf.adopt(obj, owner=body, nested=("spec.template",) if obj["kind"] == "StatefulSet" else None)
    return obj


def spec_error_message(err: SpecError, source: str = "TianJiJob") -> str:
    """One line naming each offending field path, e.g. `spec.topology: buffers (2) > actors (1) ...`."""
    lines = [ln[len(source) + 2:] if ln.startswith(source + ": ") else ln for ln in str(err).splitlines()]
    return "; ".join(lines)


# ----------------------------------------------------------------- reconcile
async def reconcile(op: Operator, body: Any, patch: Any, logger: logging.Logger, handler: str) -> None:
    meta = body["metadata"]
    name, ns, gen = meta["name"], meta.get("namespace"), meta.get("generation")
    status = dict(body.get("status") or {})
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
        job = parse_job(_manifest(body), "TianJiJob")
    except SpecError as e:
        return await refuse("InvalidSpec", spec_error_message(e))

    new_spec = json.loads(b.spec_json(job.spec))
    plan_json: Optional[dict] = None  # a new plan, made now
    plan_record: Optional[dict] = None  # the plan in force (new, or from the ConfigMap)
    actors_changed = False
    if cm is not None:
        applied, resolved = _applied(cm)
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
        try:
            resolved, plan = resolve(job, op.profile)
        except (PlanError, SpecError, ValueError) as e:
            return await refuse("PlanFailed", str(e))
        plan_json = plan_record = st.camel_keys(plan.to_json())

    for note in deprecated_fields(body.get("spec")):
        kopf.warn(body, reason="DeprecatedField", message=note)
    terminal = status.get("phase") in st.TERMINAL and cm is not None
    a = resolved.spec.autoscale
    topo = resolved.spec.topology
    suspended = resolved.spec.run_policy.suspend
    resuming = not suspended and status.get("phase") == st.SUSPENDED
    try:
        sets = await _statefulsets(op, ns, name, topo.groups)
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
                await _delete_role_pods(op, ns, name)
        created = []
        if not terminal:
            for obj in objs:
                _adopt(obj, body)
                try:
                    got, was_created = await op.kube.ensure(obj)
                except ApiError as e:
                    if not _refused_for_good(e):
                        raise
                    return await _creation_refused(op, body, resolved, obj, e, now, logger, handler)
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

    planned = [st.condition("Planned", True, "Planned", _plan_summary_from(plan_record), now=now, generation=gen),
               st.condition("Failed", False, "SpecValid", "the spec is valid and planned", now=now,
                            generation=gen)]
    starting = [st.condition("Ready", False, "PodsStarting", "waiting for the pods", now=now, generation=gen),
                st.condition("Progressing", True, "Starting", "creating pods", now=now, generation=gen)]
    why = "runPolicy.suspend is true: pods deleted, checkpoints and counts kept"
    suspended_conds = [st.condition("Suspended", True, "Suspended", why, now=now, generation=gen),
                       st.condition("Ready", False, "Suspended", why, now=now, generation=gen),
                       st.condition("Progressing", False, "Suspended", why, now=now, generation=gen)]

    def compute(fresh: dict) -> Optional[dict]:
        cur = fresh.get("status") or {}
        fields: dict[str, Any] = {}
        if plan_record is not None and (plan_json is not None or not cur.get("plan")):
            fields["plan"] = plan_record  # also after a restart that interrupted the first status write
        if cur.get("phase") in st.TERMINAL and cm is not None:
            return fields  # a job that ran and ended keeps its final phase and conditions
        fields["observedGeneration"] = gen
        conds = list(planned)
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


def _plan_summary_from(plan_json: Optional[dict]) -> str:
    if not plan_json:
        return "planned"
    p = plan_json
    return (f"{p['groups']} group(s) x ({p['actors']} actors, {p['buffers']} buffers, {p['learners']} learners); "
            f"{p['cpusUsed']:g} cores, {p['gpusUsed']} GPUs; predicted {p['producedFps']:.0f} frames/s produced, "
            f"{p['consumedSps']:.0f} samples/s consumed; {p['bottleneck']}")


# ----------------------------------------------------------------- children kept whole
# Children the monitor re-creates when deleted, besides pods and StatefulSets (which it sees
# in its listing) and the ConfigMap (re-created from the job and status.plan).
KEPT_WHOLE = ("Service", "NetworkPolicy", "PersistentVolumeClaim")


async def _child_exists(op: Operator, kind: str, ns: Optional[str], name: str) -> bool:
    # Literal kinds: tests/test_chart_rbac.py derives the RBAC rules from these calls.
    if kind == "Service":
        return await op.kube.get("Service", ns, name) is not None
    if kind == "NetworkPolicy":
        return await op.kube.get("NetworkPolicy", ns, name) is not None
    if kind == "PersistentVolumeClaim":
        return await op.kube.get("PersistentVolumeClaim", ns, name) is not None
    raise ValueError(f"not a kept child: {kind}")


def _resolved_from_plan(body: Any, plan: dict) -> Optional[TianJiJob]:
    """The planned job rebuilt from the live spec and status.plan (as tianji.control.plan.resolve
    builds it), for a ConfigMap that was deleted."""
    try:
        doc = parse_job(_manifest(body)).to_manifest()
        doc["spec"]["topology"] = {"auto": False, **{k: int(v) for k, v in plan["topology"].items()}}
        for role in ("actor", "buffer", "learner"):
            rp = plan[role]
            doc["spec"]["resources"][role] = {"cpu": rp["cpu"], "memory": rp["memory"], "gpu": rp["gpu"],
                                              "threads": rp["threads"]}
        return TianJiJob.model_validate(doc)
    except (SpecError, KeyError, TypeError, ValueError):
        return None


async def _recreate_configmap(op: Operator, body: Any, plan: dict, logger: logging.Logger) -> Optional[dict]:
    resolved = _resolved_from_plan(body, plan)
    if resolved is None:
        logger.warning("the job's ConfigMap is gone and cannot be rebuilt from its spec and status.plan")
        return None
    obj = b.configmap(resolved, parse_job(_manifest(body)).spec, body["metadata"].get("generation") or 0, plan)
    got, created = await op.kube.ensure(_adopt(obj, body))
    if created:
        kopf.warn(body, reason="Recreated", message=f"ConfigMap/{obj['metadata']['name']} (from the spec and "
                                                    "status.plan)")
    return got


async def _reconcile_manual_scaling(op: Operator, body: Any, resolved: TianJiJob, sets: dict,
                                    logger: logging.Logger) -> None:
    """autoscale.mode off: actor StatefulSets have spec.topology.actors replicas; a manual
    `kubectl scale sts` is set back (Warning event ScaleReconciled). external: adopted
    (never touched); planner: the autoscaler's next decision applies."""
    if resolved.spec.autoscale.effective_mode != "off":
        return
    want = resolved.spec.topology.actors
    try:
        live = parse_job(_manifest(body)).spec
    except SpecError:
        return
    if live.autoscale.effective_mode != "off" or (not live.topology.auto and live.topology.actors != want):
        return  # an edit the update handler is applying right now
    back = []
    for g, s in sets.items():
        have = int(((s or {}).get("spec") or {}).get("replicas") or 0) if s is not None else None
        if have is not None and have != want:
            await op.kube.patch("StatefulSet", body["metadata"].get("namespace"), actor_set_name(
                body["metadata"]["name"], g), {"spec": {"replicas": want}})
            back.append(f"group {g}: {have} -> {want}")
    if back:
        kopf.warn(body, reason="ScaleReconciled", message=("actor replicas set back to spec.topology.actors "
                                                           "(autoscale.mode off; use mode external to let "
                                                           "another scaler own them): " + ", ".join(back))[:900])


# ----------------------------------------------------------------- refused creations, suspension
def _refused_for_good(e: ApiError) -> bool:
    """A create that retrying cannot fix: admission (Pod Security, policy webhooks) refused it
    (403, but a quota may free up) or the object is invalid (422)."""
    return e.status == 422 or (e.status == 403 and "exceeded quota" not in e.message)


PRIVILEGED_HINT = ("host networking and RDMA (spec.network.hostNetwork, spec.network.rdma) need a namespace "
                   "whose Pod Security level is privileged (label pod-security.kubernetes.io/enforce=privileged); "
                   "see docs/kubernetes.md")


async def _creation_refused(op: Operator, body: Any, resolved: TianJiJob, obj: dict, e: ApiError, now: float,
                            logger: logging.Logger, handler: str) -> None:
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
    await _finish(op, body, resolved, pods, acc, st.FAILED, reason, message, now)


async def _delete_role_pods(op: Operator, ns: Optional[str], name: str) -> list[str]:
    """Delete the job's learner and buffer pods (suspension); the names deleted."""
    gone = []
    for p in await op.kube.list("Pod", ns, b.label_selector(name)):
        if p["metadata"].get("labels", {}).get(b.LABEL_ROLE) in ("learner", "buffer"):
            if await op.kube.delete("Pod", ns, p["metadata"]["name"]):
                gone.append(p["metadata"]["name"])
    return gone


def _live_spec(body: Any) -> Optional[JobSpec]:
    """The job object's spec (ahead of the ConfigMap for mutable fields), None if invalid."""
    try:
        return parse_job(_manifest(body)).spec
    except SpecError:
        return None


def _run_policy(body: Any, resolved: Optional[TianJiJob]) -> Optional[RunPolicy]:
    """The live spec's run policy, else the applied one's (None: neither is readable)."""
    live = _live_spec(body)
    if live is not None:
        return live.run_policy
    return resolved.spec.run_policy if resolved is not None else None


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
        live = _live_spec(body)
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
    rp = _run_policy(body, None)
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


# ----------------------------------------------------------------- accounting
async def count_reports(op: Operator, mem: JobMemory, name: str, pods: list[dict], port: int) -> Accounting:
    """Feed the job's accounting: every running pod's /report, and the final reports that
    ended containers left in their termination messages."""
    acc = mem.acc
    for pod in pods:
        for rep in terminated_reports(pod, name):
            mem.take(rep)
    reports, errors = await scrape_reports(op.http(), pods, port, name)
    for rep in reports:
        mem.take(rep)
    if errors:
        op.metrics.errors.labels(where="reports").inc(len(errors))
        mem.report_errors = (mem.report_errors + errors)[-5:]
    return acc if acc is not None else mem.acc


def _elapsed(status: dict, now: float) -> float:
    """Seconds the job has run: since startTime, until completionTime once it ended."""
    start = st.parse_iso(status.get("startTime"))
    end = st.parse_iso(status.get("completionTime")) or now
    return max(0.0, end - start) if start is not None else 0.0


def _numbers(acc: Accounting, status: dict, now: float) -> dict:
    """The accounting's status fields (summary.json's numbers) and its state."""
    return {**status_numbers(acc.view(_elapsed(status, now))), "reportTime": st.iso(now),
            "accounting": acc.state()}


def _final_numbers(acc: Accounting, status: dict, now: float) -> Optional[dict]:
    """An ended job's numbers, only when a final report changed a count (no write every tick)."""
    fields = _numbers(acc, status, now)
    fields.pop("rates")  # nothing runs any more: the last live rates stay as they were
    if all(status.get(k) == v for k, v in fields.items() if k != "reportTime"):
        return None
    return fields


# ----------------------------------------------------------------- monitor
async def monitor(op: Operator, body: Any, patch: Any, logger: logging.Logger) -> None:
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
        cm = await _recreate_configmap(op, body, status["plan"], logger)
    if cm is None:
        return
    _, resolved = _applied(cm)
    topo = resolved.spec.topology
    pods = await op.kube.list("Pod", ns, b.label_selector(name))
    mem = op.memory(ns, name)
    mem.accounting(status)
    acc = await count_reports(op, mem, name, pods, resolved.spec.network.metrics_port)
    acc.sample(now)
    if status.get("phase") in st.TERMINAL:
        # Ended: no more phase changes, only the final counts of the pods still stopping.
        await update_status(op, ns, name, lambda fresh: _final_numbers(acc, fresh.get("status") or {}, now))
        return
    rp = _run_policy(body, resolved)
    if rp.suspend or status.get("phase") == st.SUSPENDED:
        return  # reconcile deletes the pods on suspend and re-creates them on resume
    gen = meta.get("generation")

    sets = await _statefulsets(op, ns, name, topo.groups)
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
            live_spec = parse_job(_manifest(body)).spec
        except SpecError:
            live_spec = resolved.spec
        rule = StopRule(live_spec.stop)
        elapsed = _elapsed(status, now)
        why = rule.check(acc, elapsed)
        reason = rule.message(why, acc, elapsed) if why else None
    if reason is not None:
        return await _finish(op, body, resolved, pods, acc, st.SUCCEEDED, "StopConditionReached", reason, now)
    if failed:
        p = failed[0]
        why = (p.get("status") or {}).get("reason") or (p.get("status") or {}).get("message") or "Failed"
        return await _finish(op, body, resolved, pods, acc, st.FAILED, "PodFailed",
                             f"pod {p['metadata']['name']} failed: {why}", now)
    restarts, last_restart = _count_restarts(mem, pods)
    if restarts > rp.backoff_limit:
        return await _finish(op, body, resolved, pods, acc, st.FAILED, "BackoffLimitExceeded",
                             f"{restarts} container restarts exceed runPolicy.backoffLimit ({rp.backoff_limit}); "
                             f"last: {last_restart}", now)
    since = st.parse_iso(status.get("activeSince"))
    if rp.active_deadline_seconds is not None and since is not None and now - since >= rp.active_deadline_seconds:
        return await _finish(op, body, resolved, pods, acc, st.FAILED, "DeadlineExceeded",
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
                kind in KEPT_WHOLE and not await _child_exists(op, kind, ns, oname))
            if missing:
                if kind == "StatefulSet" and resolved.spec.autoscale.effective_mode == "planner":
                    a = resolved.spec.autoscale
                    obj["spec"]["replicas"] = min(max(obj["spec"]["replicas"], a.min_actors), a.max_actors)
                got, created = await op.kube.ensure(_adopt(obj, body))
                if created:
                    recreated.append(f"{kind}/{oname}")
                if kind == "StatefulSet":
                    sets[int(obj["metadata"]["labels"][b.LABEL_GROUP])] = got
    except ApiError as e:
        op.metrics.errors.labels(where="api").inc()
        logger.warning("monitor: %s", e)
    if recreated:
        kopf.warn(body, reason="Recreated", message=", ".join(recreated)[:900])
    await _reconcile_manual_scaling(op, body, resolved, sets, logger)

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
        conds = [st.condition("Ready", True, "AllPodsReady", f"actors {actors} ready", now=now, generation=gen)]
    elif refused:
        conds = [st.condition("Ready", False, "FailedCreate", "; ".join(refused)[:1000], now=now, generation=gen)]
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
            fields.update(_numbers(acc, {**cur, **fields}, now))
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


async def _finish(op: Operator, body: Any, resolved: TianJiJob, pods: list[dict], acc: Accounting,
                  phase: str, reason: str, message: str, now: float) -> None:
    """Record the end (status first, from a fresh read: if another tick ended the job
    already, nothing changes), then clean up. The pods' final reports arrive afterwards
    (termination messages) and are counted by the monitor and the pod event handler."""
    ns, name = body["metadata"].get("namespace"), body["metadata"]["name"]
    policy = _run_policy(body, resolved).clean_pod_policy
    ended = phase == st.SUCCEEDED
    gen = body["metadata"].get("generation")
    conds = [st.condition("Progressing", False, "JobSucceeded" if ended else "JobFailed", message, now=now,
                          generation=gen),
             st.condition("Ready", False, reason, message, now=now, generation=gen),
             st.condition("Succeeded", ended, reason if ended else "JobFailed", message, now=now, generation=gen),
             st.condition("Failed", not ended, "JobSucceeded" if ended else reason, message, now=now,
                          generation=gen)]
    won = False

    def compute(fresh: dict) -> Optional[dict]:
        nonlocal won
        cur = fresh.get("status") or {}
        if cur.get("phase") in st.TERMINAL:
            won = False
            return None
        won = True
        return {"phase": phase, "completionTime": st.iso(now),
                "conditions": st.set_conditions(cur.get("conditions"), *conds), **_numbers(acc, cur, now)}

    await update_status(op, ns, name, compute)
    if not won:
        return
    cleaned = []
    if policy in ("Running", "All"):
        for p in pods:
            role = p["metadata"].get("labels", {}).get(b.LABEL_ROLE)
            if role not in ("learner", "buffer"):
                continue
            if policy == "All" or st.pod_phase(p) in ("Pending", "Running", "Unknown"):
                if await op.kube.delete("Pod", ns, p["metadata"]["name"]):
                    cleaned.append(p["metadata"]["name"])
        for g in range(resolved.spec.topology.groups):
            try:
                await op.kube.patch("StatefulSet", ns, actor_set_name(name, g), {"spec": {"replicas": 0}})
            except ApiError as e:
                if e.status != 404:
                    raise
    msg = f"{reason}: {message}; cleanPodPolicy {policy}" + (f": deleted {len(cleaned)} pod(s), actors scaled to 0"
                                                   if policy != "None" else "")
    if ended:
        kopf.info(body, reason="Succeeded", message=msg)
    else:
        kopf.warn(body, reason="Failed", message=msg)


def on_pod_event(op: Operator, event: dict, logger: logging.Logger) -> None:
    """A job's pod changed or went away: count the final report its container left, before
    the pod object (and with it the termination message) is gone."""
    pod = event.get("object") or {}
    meta = pod.get("metadata") or {}
    job = (meta.get("labels") or {}).get(b.LABEL_JOB)
    if not job:
        return
    mem = op.jobs.get((meta.get("namespace") or "", job))
    if mem is None or mem.acc is None:
        return  # not counting this job yet: the monitor reads termination messages itself
    for rep in terminated_reports(pod, job):
        mem.take(rep)


# ----------------------------------------------------------------- autoscale
async def autoscale(op: Operator, body: Any, patch: Any, logger: logging.Logger) -> None:
    meta = body["metadata"]
    name, ns = meta["name"], meta.get("namespace")
    status = dict(body.get("status") or {})
    if status.get("phase") != st.RUNNING:
        return
    try:
        spec = parse_job(_manifest(body)).spec
    except SpecError:
        return
    mem = op.memory(ns, name)
    now = op.now()
    if mem.last_sample is not None and now - mem.last_sample < spec.autoscale.interval_seconds:
        return
    cm = await op.kube.get("ConfigMap", ns, b.configmap_name(name))
    if cm is None:
        return
    _, resolved = _applied(cm)
    url = spec.autoscale.prometheus_url
    if url and not asc.prometheus_allowed(url, op.config.prometheus_allowed):
        if f"prometheus/{url}" not in mem.warned:
            mem.warned.add(f"prometheus/{url}")
            kopf.warn(body, reason="PrometheusNotAllowed",
                      message=f"spec.autoscale.prometheusUrl {url} is not in the operator's allow-list "
                              "(chart operator.prometheusAllowList): counting from the pods' reports instead"[:900])
        url = None
    try:
        if url:
            obs = await asc.query_prometheus(op.http(), url, asc.promql_queries(
                name, ns, op.config.promql_window, op.config.promql_job_label, op.config.promql_namespace_label))
        else:
            obs = asc.from_accounting(mem.acc) if mem.acc is not None else None
    except asc.MetricsError as e:
        mem.last_sample = now  # try again after the interval, not on every tick
        op.metrics.errors.labels(where="metrics").inc()
        logger.warning("metrics: %s", e)
        return
    if obs is None:
        return  # the monitor has not counted two samples yet
    mem.last_sample = now
    try:
        await _observe_and_rescale(op, body, spec, resolved, obs, now, logger)
    except StatusConflict:
        mem.last_sample = None  # the job changed meanwhile: measure again on the next tick
        raise


async def _observe_and_rescale(op: Operator, body: Any, spec: Any, resolved: TianJiJob, obs: asc.Observation,
                               now: float, logger: logging.Logger) -> None:
    name, ns = body["metadata"]["name"], body["metadata"].get("namespace")
    sets = await _statefulsets(op, ns, name, resolved.spec.topology.groups)
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
            auto["lastEvaluation"] = {"time": st.iso(now), "decision": "disabled" if mode == "off" else "external",
                                      **obs.record()}
            return {"autoscale": auto}
        decision = asc.decide(spec, obs.throughput(current), current, st.parse_iso(auto.get("lastRescaleTime")), now,
                              ready=ready)
        record = {"time": st.iso(now), "decision": decision.kind, "message": decision.message,
                  "actors": {str(g): n for g, n in sorted(decision.desired.items())}, **obs.record()}
        decided["decision"] = decision
        auto["lastEvaluation"] = record
        if decision.desired == decision.current:
            return {"autoscale": auto}
        # Record the decision first (its time starts the cooldown), then act on it.
        auto.update({"lastRescaleTime": st.iso(now), "lastDecision": record})
        if decision.kind in ("up", "down"):
            auto[f"lastScale{decision.kind.capitalize()}Time"] = st.iso(now)
        reason = {"up": "ScaledUp", "down": "ScaledDown", "bounds": "Clamped"}[decision.kind]
        return {"autoscale": auto, "conditions": st.set_conditions(
            cur.get("conditions"), st.condition("Rescaled", True, reason, decision.message, now=now))}

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


# ----------------------------------------------------------------- registration
def configure_settings(settings: kopf.OperatorSettings) -> None:
    settings.persistence.finalizer = FINALIZER
    # Annotations only: the CRD's status schema declares what the operator writes, and a
    # real apiserver prunes anything else (Kopf's default also writes status.kopf).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="tianji.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="tianji.dev", key="last-handled-configuration")
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 600


def login(op: Operator, settings: kopf.OperatorSettings) -> Any:
    """In a pod: the service account; outside: the kubernetes client's or Kopf's kubeconfig reader."""
    if op.config.connection is not None:
        op.connection = op.config.connection
        return op.connection
    info = kopf.login_with_service_account(settings=settings)
    if info is None:
        try:
            info = kopf.login_via_client(settings=settings, logger=logging.getLogger("tianji.operator"))
        except Exception:  # the kubernetes client is optional and may not parse every kubeconfig
            info = None
    if info is None:
        info = kopf.login_with_kubeconfig(settings=settings)
    op.connection = info
    return info


def register(registry: kopf.OperatorRegistry, config: Optional[OperatorConfig] = None,
             metrics: Optional[OperatorMetrics] = None) -> Operator:
    op = Operator(config or OperatorConfig.from_env(), metrics)
    # A job annotated RELEASED (helm uninstall's hook, docs/kubernetes.md) matches no handler:
    # Kopf then removes its finalizer itself, and the job no longer blocks CRD/namespace deletion.
    res = dict(group=GROUP, version=VERSION, plural=PLURAL, registry=registry, annotations={RELEASED: kopf.ABSENT})
    backoff = op.config.handler_backoff

    @kopf.on.startup(registry=registry)
    def tianji_settings(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_settings(settings)

    @kopf.on.login(registry=registry)
    def tianji_login(settings: kopf.OperatorSettings, **_: Any) -> Any:
        return login(op, settings)

    @kopf.on.cleanup(registry=registry)
    async def tianji_cleanup(**_: Any) -> None:
        await op.close()

    @kopf.on.create(**res, backoff=backoff, id="reconcile-create")
    async def on_create(body: Any, patch: Any, logger: logging.Logger, **_: Any) -> None:
        await _guarded(op, "create", reconcile(op, body, patch, logger, "create"))

    @kopf.on.resume(**res, backoff=backoff, id="reconcile-resume")
    async def on_resume(body: Any, patch: Any, logger: logging.Logger, **_: Any) -> None:
        await _guarded(op, "resume", reconcile(op, body, patch, logger, "resume"))

    @kopf.on.update(**res, backoff=backoff, id="reconcile-update")
    async def on_update(body: Any, patch: Any, logger: logging.Logger, **_: Any) -> None:
        await _guarded(op, "update", reconcile(op, body, patch, logger, "update"))

    @kopf.on.delete(**res, backoff=backoff, id="release")
    async def on_delete(body: Any, logger: logging.Logger, **_: Any) -> None:
        # Children go with the owner (ownerReferences); only in-memory state is ours to drop.
        op.jobs.pop((body["metadata"].get("namespace") or "", body["metadata"]["name"]), None)
        op.metrics.reconciles.labels(handler="delete", result="ok").inc()
        logger.info("released %s", body["metadata"]["name"])

    @kopf.on.event("", "v1", "pods", labels={b.LABEL_JOB: kopf.PRESENT}, registry=registry, id="final-reports")
    def on_pod(event: dict, logger: logging.Logger, **_: Any) -> None:
        on_pod_event(op, event, logger)

    @kopf.timer(**res, interval=op.config.monitor_interval, id="monitor")
    async def on_monitor(body: Any, patch: Any, logger: logging.Logger, **_: Any) -> None:
        await _guarded(op, "monitor", monitor(op, body, patch, logger), temporary=False)

    @kopf.timer(**res, interval=op.config.autoscale_tick, id="autoscale")
    async def on_autoscale(body: Any, patch: Any, logger: logging.Logger, **_: Any) -> None:
        await _guarded(op, "autoscale", autoscale(op, body, patch, logger), temporary=False)

    return op


async def _guarded(op: Operator, where: str, coro: Any, temporary: bool = True) -> None:
    """Count failures; API errors become Kopf temporary errors (retried after the backoff)."""
    try:
        await coro
    except kopf.TemporaryError:
        raise
    except StatusConflict as e:  # computed from a stale body: again, with the fresh one
        if temporary:
            raise kopf.TemporaryError(str(e), delay=min(1.0, op.config.handler_backoff)) from None
        logging.getLogger("tianji.operator").debug("%s: %s", where, e)
    except (ApiError, aiohttp.ClientError, asyncio.TimeoutError) as e:
        op.metrics.errors.labels(where=where).inc()
        if temporary:
            raise kopf.TemporaryError(f"{type(e).__name__}: {e}", delay=op.config.handler_backoff) from None
        logging.getLogger("tianji.operator").warning("%s: %s: %s", where, type(e).__name__, e)
    except Exception:
        op.metrics.errors.labels(where=where).inc()
        raise
