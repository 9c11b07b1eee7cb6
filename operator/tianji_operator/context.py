"""What every TianJiJob handler shares: the operator's context (`Operator`: API client,
metrics, per-job memory), reading a job's applied spec, and status writes that never use
a stale copy.

`update_status` reads the job, computes the fields from THAT read, and writes them with a
JSON patch that tests its resourceVersion; on a conflict it reads and computes again.
Handlers and timers run concurrently: nothing is ever written from an older copy.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional, overload

import aiohttp
import kopf
import yaml

from tianji.control.contracts.accounting import Accounting
from tianji.control.contracts.addressing import actor_set_name
from tianji.control.contracts.episodes import EpisodeBounds
from tianji.control.contracts.rolereport import Report, ReportError
from tianji.control.spec import API_VERSION, KIND, JobSpec, RunPolicy, SpecError, TianJiJob, parse_job
from tianji.control.spec.userenv import missing_spaces
from tianji.control.spec.yamlload import MAX_MANIFEST_BYTES

from .children import builders as b
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
    warned: set[str] = field(default_factory=set)  # Events already posted (e.g. unschedulable pods)
    ended: bool = False  # the job ended: only processes counted before the end may still add to it
    node_lost: str = ""  # pods force-deleted off a lost node, until the job is Ready again (timers/nodelost.py)
    # Every uid the pod watch delivered under each pod name, in order (timers/restarts.watch_pod):
    # a pod re-created between two ticks, or before the first, is counted all the same.
    watched: dict[str, dict[str, dict]] = field(default_factory=dict)
    watch_since: str = ""  # pods created before this are not counted from the watch (a suspend's, a resume's)
    bounds: EpisodeBounds = EpisodeBounds()  # episodes the env can produce (episodes.without_gym): others refused

    def forget_pods(self, now_iso: str) -> None:
        """The operator deletes or re-creates the pods itself (suspend, resume): no disruption."""
        self.watched.clear()
        self.watch_since = now_iso

    def accounting(self, status: dict) -> Accounting:
        if self.acc is None:
            try:
                self.acc = Accounting(status.get("accounting") or None)
            except ReportError:  # unreadable (hand-edited?): count anew rather than stop
                self.acc = Accounting()
        return self.acc

    def take(self, rep: Report | ReportError) -> None:
        acc = self.acc if self.acc is not None else Accounting()
        self.acc = acc
        if isinstance(rep, ReportError):
            self.refuse([str(rep)])
            return
        if self.ended and not self.known(rep.incarnation):
            return  # started after the end (a pod made again by someone): not part of this job's result
        if rep.role == "actor" and (why := self.bounds.refusal(rep.recent)) is not None:
            self.refuse([f"{rep.name}: return: {why}"])  # env code's claim, refused whole
            return
        try:
            acc.take(rep)
        except ReportError as e:
            self.refuse([str(e)])

    def known(self, incarnation: str) -> bool:
        acc = self.acc
        return acc is not None and (
            incarnation in acc.gone or any(p.incarnation == incarnation for p in acc.procs.values())
        )

    def refuse(self, why: list[str], counted: bool = True) -> None:
        """Reports that were not counted: rejected (when `counted`), the last few reasons kept."""
        if counted and self.acc is not None:
            self.acc.rejected += len(why)
        self.report_errors = (self.report_errors + why)[-5:]


class Operator:
    """What the handlers share. One per registered operator (tests run several in sequence)."""

    def __init__(self, config: OperatorConfig, metrics: Optional[OperatorMetrics] = None):
        self.config = config
        self.metrics = metrics or OperatorMetrics()
        self.connection: Any = config.connection
        self.kube = KubeClient(self._connection, on_request=self.metrics.api_request)
        self.jobs: dict[tuple[str, str], JobMemory] = {}
        # children/hostports.py: blocks handed out (status written or not) and the turn-taking lock
        self.host_ports: dict[str, Any] = {}
        self.host_ports_lock = asyncio.Lock()
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
def manifest_of(body: Any) -> dict:
    meta = body["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": meta["name"], "namespace": meta.get("namespace")},
        "spec": dict(body.get("spec") or {}),
    }


class StatusConflict(Exception):
    """The job changed between reading it and writing its status."""


async def update_status(
    op: Operator, ns: Optional[str], name: str, compute: Callable[[dict], Optional[dict]], attempts: int = 5
) -> Optional[dict]:
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
        if await op.kube.patch_status(
            "TianJiJob", ns, name, body["metadata"]["resourceVersion"], changed, has_status=bool(current)
        ):
            return body
    raise StatusConflict(f"{name}: status still conflicting after {attempts} fresh reads")


def read_applied(cm: dict) -> tuple[dict, TianJiJob]:
    """(applied spec as a plain dict, resolved job) stored on the job's ConfigMap."""
    ann = (cm.get("metadata") or {}).get("annotations") or {}
    applied = json.loads(ann.get(b.ANNOTATION_SPEC) or "{}")
    try:  # written by an older operator: moved fields (cleanPodPolicy) in today's places
        applied = json.loads(b.spec_json(JobSpec.model_validate(applied)))
    except ValueError:
        pass
    resolved = parse_job(yaml.safe_load(cm["data"][b.JOB_FILE]), f"ConfigMap {cm['metadata']['name']}")
    return applied, resolved


async def actor_sets(op: Operator, ns: Optional[str], name: str, groups: int) -> dict[int, Optional[dict]]:
    return {g: await op.kube.get("StatefulSet", ns, actor_set_name(name, g)) for g in range(groups)}


def adopt(obj: dict, body: Any) -> dict:
    kopf.adopt(obj, owner=body, nested=("spec.template",) if obj["kind"] == "StatefulSet" else None)
    return obj


def spec_error_message(err: SpecError, source: str = "TianJiJob") -> str:
    """One line naming each offending field path, e.g. `spec.topology: buffers (2) > actors (1) ...`."""
    lines = [ln[len(source) + 2 :] if ln.startswith(source + ": ") else ln for ln in str(err).splitlines()]
    return "; ".join(lines)


def bulkiest_field(spec: dict, path: str = "spec") -> str:
    """The path down to the field that holds most of an oversized spec (for the refusal's message)."""
    while isinstance(spec, dict) and spec:
        key, value = max(spec.items(), key=lambda kv: len(json.dumps(kv[1], default=str)))
        spec, path = value, f"{path}.{key}"
    return path


class InvalidSpec(ValueError):
    """The job object cannot run; the message is one line naming each offending field path."""


def checked_job(body: Any) -> TianJiJob:
    """The operator's validation of a job object as the apiserver hands it over (JSON): the same
    model `tianji run` validates a file with, so whatever the CRD schema lets through (free-form
    maps, an older and looser CRD) is refused naming the field. Raises InvalidSpec."""
    manifest = manifest_of(body)
    size = len(json.dumps(manifest["spec"], default=str))
    if size > MAX_MANIFEST_BYTES:  # as `tianji run` refuses such a file; the ConfigMap could not hold it
        raise InvalidSpec(
            f"{bulkiest_field(manifest['spec'])}: the spec is {size / 2**20:.1f} MiB as JSON, "
            f"more than the {MAX_MANIFEST_BYTES // 1024} KiB a job manifest may be"
        )
    try:
        job = parse_job(manifest, "TianJiJob")
    except SpecError as e:
        raise InvalidSpec(spec_error_message(e)) from None
    if (problem := missing_spaces(job.spec.env)) is not None:  # pods cannot learn a user env's spaces
        raise InvalidSpec(problem)
    return job


def current_spec(body: Any) -> Optional[JobSpec]:
    """The job object's spec (ahead of the ConfigMap for mutable fields), None if invalid."""
    try:
        return parse_job(manifest_of(body)).spec
    except SpecError:
        return None


@overload
def run_policy_of(body: Any, resolved: TianJiJob) -> RunPolicy: ...
@overload
def run_policy_of(body: Any, resolved: None) -> Optional[RunPolicy]: ...
def run_policy_of(body: Any, resolved: Optional[TianJiJob]) -> Optional[RunPolicy]:
    """The live spec's run policy, else the applied one's (None: neither is readable)."""
    live = current_spec(body)
    if live is not None:
        return live.run_policy
    return resolved.spec.run_policy if resolved is not None else None
