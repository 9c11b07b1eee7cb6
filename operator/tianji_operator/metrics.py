"""The operator's own Prometheus metrics (served on :8080 by `python -m tianji_operator`).

    tianji_operator_reconciles_total{handler, result}   create/resume/update/delete runs
    tianji_operator_errors_total{where}                  API, planner, Prometheus, scrape errors
    tianji_operator_rescale_decisions_total{decision}    up, down, unchanged, cooldown, bounds
    tianji_operator_api_requests_total{verb, kind, code} calls to the Kubernetes API
    tianji_operator_timer_runs_total{timer}              monitor/autoscale ticks, one per job per tick

Per job, the numbers the operator writes into its status (labels namespace and job: the
TianJiJob's, as the workers' series carry them; the chart's ServiceMonitor honours them), so the
dashboard needs no kube-state-metrics and shows what `kubectl get tjj` shows:

    tianji_job_actors_desired{namespace, job, group}     status.groups[].actors.desired
    tianji_job_actors_ready{namespace, job, group}       status.groups[].actors.ready
    tianji_job_container_restarts{namespace, job, role}  status.restartsByRole[role].containers
    tianji_job_pods_recreated{namespace, job, role}      status.restartsByRole[role].pods
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

JOB_LABELS = ("namespace", "job")


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.reconciles = Counter(
            "tianji_operator_reconciles", "Reconciliations of TianJiJobs", ["handler", "result"], registry=self.registry
        )
        self.errors = Counter(
            "tianji_operator_errors", "Errors, by where they happened", ["where"], registry=self.registry
        )
        self.rescales = Counter(
            "tianji_operator_rescale_decisions",
            "Autoscaler decisions, by outcome",
            ["decision"],
            registry=self.registry,
        )
        self.timer_runs = Counter(
            "tianji_operator_timer_runs", "Timer ticks, one per job per tick", ["timer"], registry=self.registry
        )
        self.api_requests = Counter(
            "tianji_operator_api_requests",
            "Kubernetes API calls made by the operator",
            ["verb", "kind", "code"],
            registry=self.registry,
        )

        self.actors_desired = Gauge(
            "tianji_job_actors_desired",
            "Actors the job's group should run (status.groups)",
            [*JOB_LABELS, "group"],
            registry=self.registry,
        )
        self.actors_ready = Gauge(
            "tianji_job_actors_ready",
            "Ready actors of the job's group (status.groups)",
            [*JOB_LABELS, "group"],
            registry=self.registry,
        )
        self.restarts = Gauge(
            "tianji_job_container_restarts",
            "Container restarts of the job's pods, by role (status.restartsByRole)",
            [*JOB_LABELS, "role"],
            registry=self.registry,
        )
        self.recreated = Gauge(
            "tianji_job_pods_recreated",
            "Pods of the job re-created, by role (status.restartsByRole)",
            [*JOB_LABELS, "role"],
            registry=self.registry,
        )
        self._job_series: dict[tuple[str, str], set[tuple[Gauge, tuple[str, ...]]]] = {}

    def job_status(self, namespace: str, job: str, status: dict[str, Any]) -> None:
        """Mirror a job's status (as written) into the per-job gauges."""
        series: set[tuple[Gauge, tuple[str, ...]]] = set()

        def put(gauge: Gauge, value: Any, n: Any) -> None:
            key = (namespace, job, str(value))
            gauge.labels(*key).set(float(n or 0))
            series.add((gauge, key))

        for entry in status.get("groups") or []:
            actors = entry.get("actors") or {}
            put(self.actors_desired, entry.get("group"), actors.get("desired"))
            put(self.actors_ready, entry.get("group"), actors.get("ready"))
        for role, counts in (status.get("restartsByRole") or {}).items():
            put(self.restarts, role, (counts or {}).get("containers"))
            put(self.recreated, role, (counts or {}).get("pods"))
        for gauge, key in self._job_series.get((namespace, job), set()) - series:
            gauge.remove(*key)  # a group or role gone since the last write
        self._job_series[(namespace, job)] = series

    def forget_job(self, namespace: str, job: str) -> None:
        """Drop a deleted job's series (a dashboard would show it forever otherwise)."""
        for gauge, key in self._job_series.pop((namespace, job), set()):
            gauge.remove(*key)

    def api_request(self, verb: str, kind: str, status: int) -> None:
        self.api_requests.labels(verb=verb, kind=kind, code=str(status)).inc()

    def value(self, name: str, **labels) -> float:
        """A sample's current value (0 when absent), for tests and diagnostics."""
        v = self.registry.get_sample_value(name, labels)
        return float(v or 0.0)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)
