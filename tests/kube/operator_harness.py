"""The real Kopf operator against the emulator: `start_cluster`, `RunningOperator`, and the
small helpers operator tests share (`FakeClock`, `eventually`, `job_manifest`, `run_pods`).

A test with a `RunningOperator` fails when it ends if any of the operator's writes (Kopf's
and its own client's, told apart by User-Agent) lost a field to pruning or was refused by
admission: on a real cluster that field would be gone, or the write would not happen."""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Optional

import kmock

from .emulator import KubeEmulator

NAMESPACE = "tianji-test"
JOBS = "tianji.dev/v1alpha1/tianjijobs"
# User-Agent prefixes of the operator's writes: Kopf's client and tianji_operator.kube.KubeClient.
OPERATOR_AGENTS = ("kopf/", "tianji-operator")


class FakeClock:
    """The operator's clock in tests: advanced by hand (cooldowns, intervals, stop.seconds)."""

    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


async def eventually(predicate, timeout: float = 10.0, interval: float = 0.02, what: str = "condition"):
    """Poll `predicate` (sync or async) until it returns something truthy; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    last = None
    error: Optional[BaseException] = None
    while True:
        try:
            last = predicate()
            if asyncio.iscoroutine(last):
                last = await last
        except (KeyError, TypeError, IndexError) as e:  # not there yet (e.g. a condition missing)
            last, error = None, e
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}"
                                 + (f" (last error: {error!r})" if error else ""))
        await asyncio.sleep(interval)


def operator_write_problems(kube: KubeEmulator, agents: tuple[str, ...] = OPERATOR_AGENTS) -> list[str]:
    """One line per field the operator's writes lost to pruning and per write admission refused."""
    mine = lambda agent: agent.startswith(agents)
    lost = sorted({f"{p.resource} {p.name}{'/' + p.subresource if p.subresource else ''}: {p.path} was pruned "
                   f"(not in the CRD schema; written by {p.user_agent})" for p in kube.pruned if mine(p.user_agent)})
    refused = sorted({f"{r.resource} {r.name}{'/' + r.subresource if r.subresource else ''}: {r.verb} refused "
                      f"{r.code} {r.reason}: {r.message[:300]} (written by {r.user_agent})"
                      for r in kube.refused if mine(r.user_agent)})
    return lost + refused


async def start_cluster(stack, validate_crd: bool = True) -> KubeEmulator:
    """An emulator with the core kinds, the TianJiJob CRD and the test namespace, on a local port.

    `validate_crd=False` serves the resource without its schema, as under an older, looser CRD
    (Helm installs CRDs but never upgrades them): then only the operator's own checks stand."""
    from tianji.control.spec.crd import crd_dict

    kube = await stack.enter_async_context(KubeEmulator())
    await stack.enter_async_context(kmock.Server(kube))
    kube.declare_core()
    kube.declare_crd(crd_dict(), validate=validate_crd)
    await kube.put_object("v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                            "metadata": {"name": NAMESPACE}})
    return kube


class RunningOperator:
    """The real operator (tianji_operator.handlers under kopf.operator) talking to `kube`.

    It runs in its own thread and event loop, as it would in its own process: Kopf, when it
    stops, cancels every task of its loop that it did not start (the test's included)."""

    def __init__(self, kube: KubeEmulator, expected_refusals: tuple[str, ...] = (), **config: Any):
        self.kube = kube
        # Refusals the test provokes on purpose (e.g. "violates PodSecurity"): not write problems.
        self.expected_refusals = expected_refusals
        self.config_kwargs = config
        self.thread: Optional[threading.Thread] = None
        self.op = None
        self.error: Optional[BaseException] = None

    def _run(self, registry, settings, ready: threading.Event) -> None:
        import kopf

        async def main() -> None:
            stop_flag = asyncio.Event()
            task = asyncio.create_task(kopf.operator(
                registry=registry, settings=settings, standalone=True, namespaces=[NAMESPACE],
                stop_flag=stop_flag, ready_flag=ready))
            while not self.stop_requested.is_set() and not task.done():
                await asyncio.sleep(0.02)
            stop_flag.set()
            done, _ = await asyncio.wait({task}, timeout=2.0)
            if not done:
                # Kopf waits 5 s for tasks it did not start; a timer respawned by an event that
                # raced the shutdown is one. asyncio.run() cancels whatever is left.
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            elif task.exception() is not None:
                raise task.exception()

        try:
            asyncio.run(main())
        except BaseException as e:  # surfaced by __aexit__
            self.error = e

    async def __aenter__(self) -> RunningOperator:
        import kopf

        from tianji_operator.config import OperatorConfig
        from tianji_operator.handlers import register

        cfg = dict(monitor_interval=0.1, autoscale_tick=0.05, handler_backoff=0.2, http_timeout=2.0,
                   connection=kopf.ConnectionInfo(server=str(self.kube.url).rstrip("/"), insecure=True))
        cfg.update(self.config_kwargs)
        registry = kopf.OperatorRegistry()
        self.op = register(registry, OperatorConfig(**cfg))
        settings = kopf.OperatorSettings()
        settings.watching.reconnect_backoff = 0.05
        settings.queueing.idle_timeout = 0.5
        settings.queueing.exit_timeout = 0.5
        settings.background.cancellation_polling = 0.1
        settings.background.instant_exit_timeout = 0.5
        settings.execution.default_backoff = 0.2
        settings.persistence.consistency_timeout = 1.0
        self.stop_requested = threading.Event()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(registry, settings, ready), daemon=True,
                                       name="kopf-operator")
        self.thread.start()
        if not await asyncio.to_thread(ready.wait, 15):
            raise AssertionError(f"the operator did not start: {self.error!r}")
        return self

    async def __aexit__(self, exc_type: Any, *exc: Any) -> None:
        self.stop_requested.set()
        await asyncio.to_thread(self.thread.join, 20)
        if self.thread.is_alive():
            raise AssertionError("the operator did not stop within 20 s")
        if self.error is not None and not isinstance(self.error, asyncio.CancelledError):
            raise self.error
        problems = [p for p in operator_write_problems(self.kube)
                    if not any(x in p for x in self.expected_refusals)]
        if problems and exc_type is None:  # a failing test keeps its own error
            raise AssertionError("a real API server would not store what the operator wrote:\n  "
                                 + "\n  ".join(problems))

    @property
    def metrics(self):
        return self.op.metrics


# ----------------------------------------------------------------- reading a job's state
CHILD_KINDS = {
    "v1/configmaps": "ConfigMap", "v1/services": "Service", "v1/pods": "Pod",
    "v1/persistentvolumeclaims": "PersistentVolumeClaim",
    "apps/v1/statefulsets": "StatefulSet", "networking.k8s.io/v1/networkpolicies": "NetworkPolicy",
}


def job(kube: KubeEmulator, name: str = "cartpole") -> Optional[dict]:
    return kube.obj(JOBS, NAMESPACE, name)


def status(kube: KubeEmulator, name: str = "cartpole") -> dict:
    return (job(kube, name) or {}).get("status") or {}


def cond(kube: KubeEmulator, ctype: str, name: str = "cartpole") -> Optional[dict]:
    return next((c for c in status(kube, name).get("conditions", []) if c["type"] == ctype), None)


def children(kube: KubeEmulator, name: str = "cartpole") -> dict:
    """The job's child objects by (kind, name), found by the tianji.dev/job label."""
    from tianji_operator.children.builders import LABEL_JOB

    out = {}
    for key, kind in CHILD_KINDS.items():
        for o in kube.live(key, NAMESPACE):
            if o["metadata"].get("labels", {}).get(LABEL_JOB) == name:
                out[kind, o["metadata"]["name"]] = o
    return out


def job_manifest(name: str = "cartpole", spec: Optional[dict] = None, **meta: Any) -> dict:
    return {"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob",
            "metadata": {"name": name, **meta}, "spec": spec or {}}


async def job_with_report_pods(kube: KubeEmulator, pods, ips: dict[str, str], spec: dict) -> None:
    """A cartpole job whose pods (two actors played for the StatefulSet controller) run with
    `ips`, where `pods` (kube.fakes.FakePodMetrics) serves their reports; waits for Running."""
    await kube.create_job(job_manifest("cartpole", {"network": {"metricsPort": pods.port}, **spec}))
    await eventually(lambda: kube.obj("apps/v1/statefulsets", NAMESPACE, "cartpole-actor-0"))
    for i in range(2):
        await kube.put_object("v1/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"cartpole-actor-0-{i}", "namespace": NAMESPACE,
            "labels": {"tianji.dev/job": "cartpole", "tianji.dev/role": "actor", "tianji.dev/group": "0"}}})
    await run_pods(kube, "cartpole", ips=ips)
    await eventually(lambda: status(kube).get("phase") == "Running", what="phase Running")


async def run_pods(kube: KubeEmulator, job: str, namespace: str = NAMESPACE, phase: str = "Running",
                   ready: bool = True, ips: Optional[dict[str, str]] = None) -> None:
    """Play kubelet and the StatefulSet controller: learner/buffer pods get `phase`; each actor
    StatefulSet reports all replicas ready (and, with `ips`, its pods exist with those IPs)."""
    for pod in kube.live("v1/pods", namespace):
        if pod["metadata"].get("labels", {}).get("tianji.dev/job") != job:
            continue
        st = {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
        if ips and pod["metadata"]["name"] in ips:
            st["podIP"] = ips[pod["metadata"]["name"]]
        await kube.set_status("v1/pods", namespace, pod["metadata"]["name"], st)
    for sts in kube.live("apps/v1/statefulsets", namespace):
        if sts["metadata"].get("labels", {}).get("tianji.dev/job") != job:
            continue
        n = sts["spec"]["replicas"]
        await kube.set_status("apps/v1/statefulsets", namespace, sts["metadata"]["name"],
                              {"replicas": n, "readyReplicas": n if ready else 0})


