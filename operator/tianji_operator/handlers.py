"""Kopf registration for TianJiJob: which function handles which event.

`register(registry, config)` installs the handlers into a Kopf registry (the default one
for `python -m tianji_operator`, a fresh one per test) and returns the `Operator` context
they share. The work itself: reconcile.py (create, resume, update), timers/monitor.py
(the monitor timer), timers/counting.py (reports and final reports), children/lifecycle.py
(children kept whole, refused creations, the end), timers/scaling.py (the autoscale timer),
context.py (shared state, fresh-read status writes).
"""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any, Optional

import aiohttp
import kopf

from tianji.control.spec.crd import GROUP, PLURAL, VERSION

from .children import builders as b
from .children.hostports import release as release_host_ports
from .config import OperatorConfig
from .context import FINALIZER, RELEASED, Operator, StatusConflict
from .kube import ApiError, in_cluster_login
from .metrics import OperatorMetrics
from .reconcile import reconcile
from .timers.counting import on_pod_event
from .timers.monitor import monitor
from .timers.scaling import autoscale


# ----------------------------------------------------------------- registration
def configure_settings(settings: kopf.OperatorSettings) -> None:
    settings.persistence.finalizer = FINALIZER
    # Annotations only: the CRD's status schema declares what the operator writes, and a
    # real apiserver prunes anything else (Kopf's default also writes status.kopf).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="tianji.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="tianji.dev", key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 600


def login(op: Operator, settings: kopf.OperatorSettings) -> Any:
    """In a pod: the service account; outside: the kubernetes client's or Kopf's kubeconfig reader."""
    if op.config.connection is not None:
        op.connection = op.config.connection
        return op.connection
    info = in_cluster_login(settings)
    if info is None:
        try:
            info = kopf.login_via_client(settings=settings, logger=logging.getLogger("tianji.operator"))
        except Exception:  # the kubernetes client is optional and may not parse every kubeconfig
            info = None
    if info is None:
        info = kopf.login_with_kubeconfig(settings=settings)
    op.connection = info
    return info


def register(
    registry: kopf.OperatorRegistry, config: Optional[OperatorConfig] = None, metrics: Optional[OperatorMetrics] = None
) -> Operator:
    op = Operator(config or OperatorConfig.from_env(), metrics)
    # A job annotated RELEASED (helm uninstall's hook, docs/kubernetes.md) matches no handler:
    # Kopf then removes its finalizer itself, and the job no longer blocks CRD/namespace deletion.
    res: dict[str, Any] = dict(
        group=GROUP, version=VERSION, plural=PLURAL, registry=registry, annotations={RELEASED: kopf.ABSENT}
    )
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
    async def on_create(body: Any, patch: Any, logger: kopf.Logger, **_: Any) -> None:
        await _guarded(op, "create", reconcile(op, body, patch, logger, "create"))

    @kopf.on.resume(**res, backoff=backoff, id="reconcile-resume")
    async def on_resume(body: Any, patch: Any, logger: kopf.Logger, **_: Any) -> None:
        await _guarded(op, "resume", reconcile(op, body, patch, logger, "resume"))

    @kopf.on.update(**res, backoff=backoff, id="reconcile-update")
    async def on_update(body: Any, patch: Any, logger: kopf.Logger, **_: Any) -> None:
        await _guarded(op, "update", reconcile(op, body, patch, logger, "update"))

    @kopf.on.delete(**res, backoff=backoff, id="release")
    async def on_delete(body: Any, logger: kopf.Logger, **_: Any) -> None:
        # Children go with the owner (ownerReferences); only in-memory state is ours to drop.
        op.jobs.pop((body["metadata"].get("namespace") or "", body["metadata"]["name"]), None)
        release_host_ports(op, body["metadata"].get("namespace"), body["metadata"]["name"])
        op.metrics.forget_job(body["metadata"].get("namespace") or "", body["metadata"]["name"])
        op.metrics.reconciles.labels(handler="delete", result="ok").inc()
        logger.info("released %s", body["metadata"]["name"])

    @kopf.on.event("", "v1", "pods", labels={b.LABEL_JOB: kopf.PRESENT}, registry=registry, id="final-reports")
    def on_pod(event: kopf.RawEvent, logger: kopf.Logger, **_: Any) -> None:
        on_pod_event(op, event, logger)

    # Every job's pods, kept current by the watch (Kopf fills it before any handler runs):
    # the monitor reads it instead of listing the pods on every tick.
    @kopf.index("", "v1", "pods", labels={b.LABEL_JOB: kopf.PRESENT}, registry=registry, id="job_pods")
    def job_pods(body: Any, namespace: Optional[str], labels: Any, **_: Any) -> dict:
        return {(namespace or "", labels[b.LABEL_JOB]): copy.deepcopy(dict(body))}

    @kopf.timer(**res, interval=op.config.monitor_interval, id="monitor")
    async def on_monitor(body: Any, patch: Any, logger: kopf.Logger, **kwargs: Any) -> None:
        job_pods: kopf.Index = kwargs["job_pods"]  # Kopf passes every index by its id
        meta = body["metadata"]
        pods = list(job_pods.get((meta.get("namespace") or "", meta["name"]), []))
        await _guarded(op, "monitor", monitor(op, body, patch, logger, pods), temporary=False)
        op.metrics.timer_runs.labels(timer="monitor").inc()

    @kopf.timer(**res, interval=op.config.autoscale_tick, id="autoscale")
    async def on_autoscale(body: Any, patch: Any, logger: kopf.Logger, **_: Any) -> None:
        await _guarded(op, "autoscale", autoscale(op, body, patch, logger), temporary=False)
        op.metrics.timer_runs.labels(timer="autoscale").inc()

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
