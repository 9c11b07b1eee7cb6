"""The operator's own Prometheus metrics (served on :8080 by `python -m tianji_operator`).

    tianji_operator_reconciles_total{handler, result}   create/resume/update/delete runs
    tianji_operator_errors_total{where}                  API, planner, Prometheus, scrape errors
    tianji_operator_rescale_decisions_total{decision}    up, down, unchanged, cooldown, bounds
    tianji_operator_api_requests_total{verb, kind, code} calls to the Kubernetes API
    tianji_operator_timer_runs_total{timer}              monitor/autoscale ticks, one per job per tick
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, start_http_server


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.reconciles = Counter("tianji_operator_reconciles", "Reconciliations of TianJiJobs",
                                  ["handler", "result"], registry=self.registry)
        self.errors = Counter("tianji_operator_errors", "Errors, by where they happened",
                              ["where"], registry=self.registry)
        self.rescales = Counter("tianji_operator_rescale_decisions", "Autoscaler decisions, by outcome",
                                ["decision"], registry=self.registry)
        self.timer_runs = Counter("tianji_operator_timer_runs", "Timer ticks, one per job per tick",
                                  ["timer"], registry=self.registry)
        self.api_requests = Counter("tianji_operator_api_requests", "Kubernetes API calls made by the operator",
                                    ["verb", "kind", "code"], registry=self.registry)

    def api_request(self, verb: str, kind: str, status: int) -> None:
        self.api_requests.labels(verb=verb, kind=kind, code=str(status)).inc()

    def value(self, name: str, **labels) -> float:
        """A sample's current value (0 when absent), for tests and diagnostics."""
        v = self.registry.get_sample_value(name, labels)
        return float(v or 0.0)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)
