"""Operator-wide settings: from the environment in production, from arguments in tests."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from tianji.control.contracts.launch import sibling_command
from tianji.control.contracts.ports import DEFAULT_PORT_RANGE, parse_port_range

DEFAULT_SCRAPERS: list[dict] = [
    # Prometheus (the kube-prometheus / prometheus-operator default label) and the
    # operator itself, which scrapes /metrics when spec.autoscale.prometheusUrl is unset.
    {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}},
    {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "tianji-operator"}}},
]


@dataclass
class OperatorConfig:
    """Knobs that are not part of a job's spec.

    Environment (production): TIANJI_MONITOR_INTERVAL, TIANJI_AUTOSCALE_TICK,
    TIANJI_HANDLER_BACKOFF (seconds), TIANJI_PROMQL_WINDOW (e.g. 1m),
    TIANJI_PROMQL_JOB_LABEL (default `job`; the PodMonitor/ServiceMonitor must
    `honorLabels: true` or the workers' `job` label becomes `exported_job`),
    TIANJI_PROMQL_NAMESPACE_LABEL (default `namespace`; empty: not filtered),
    TIANJI_METRICS_SCRAPERS (JSON list of NetworkPolicyPeer admitted to the
    metrics port), TIANJI_PROFILE (a `tianji profile` JSON used by the planner),
    TIANJI_WORKER_COMMAND (JSON list, default ["tianji", "worker"]),
    TIANJI_PROMETHEUS_ALLOWED (JSON list of base URLs a job's spec.autoscale.prometheusUrl
    may lie under; empty: none, jobs count from their pods' reports),
    TIANJI_WORKER_DEFAULTS (JSON: a pod overlay, spec.pods.all's fields, applied to every
    worker pod beneath the job's own `spec.pods`; chart values `workerDefaults`),
    TIANJI_HOST_PORT_RANGE (FIRST-LAST: the node ports host-network jobs get blocks from;
    chart values `hostNetwork.portRange`).
    """

    monitor_interval: float = 10.0  # seconds between child/phase checks per job
    autoscale_tick: float = 5.0  # seconds between metric/rescale checks (each job also obeys its intervalSeconds)
    handler_backoff: float = 10.0  # seconds before retrying a handler after an API error
    http_timeout: float = 5.0  # Prometheus queries and /metrics scrapes
    promql_window: str = "1m"
    promql_job_label: str = "job"
    promql_namespace_label: str = "namespace"
    metrics_scrapers: list[dict] = field(default_factory=lambda: [dict(p) for p in DEFAULT_SCRAPERS])
    profile_path: Optional[str] = None
    worker_command: list[str] = field(default_factory=lambda: ["tianji", "worker"])
    host_port_range: str = DEFAULT_PORT_RANGE  # hostNetwork jobs' port blocks (tianji.control.contracts.ports)
    worker_defaults: Any = None  # tianji.control.spec.PodOverlay, or None
    prometheus_allowed: list[str] = field(default_factory=list)
    clock: Callable[[], float] = time.time
    # Tests: a fixed kopf.ConnectionInfo instead of the in-cluster / kubeconfig login.
    connection: Any = None

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> OperatorConfig:
        env = os.environ if env is None else env
        c = cls()
        for name, key, conv in (
            ("monitor_interval", "TIANJI_MONITOR_INTERVAL", float),
            ("autoscale_tick", "TIANJI_AUTOSCALE_TICK", float),
            ("handler_backoff", "TIANJI_HANDLER_BACKOFF", float),
            ("http_timeout", "TIANJI_HTTP_TIMEOUT", float),
            ("promql_window", "TIANJI_PROMQL_WINDOW", str),
            ("promql_job_label", "TIANJI_PROMQL_JOB_LABEL", str),
            ("promql_namespace_label", "TIANJI_PROMQL_NAMESPACE_LABEL", str),
            ("profile_path", "TIANJI_PROFILE", str),
            ("metrics_scrapers", "TIANJI_METRICS_SCRAPERS", json.loads),
            ("worker_command", "TIANJI_WORKER_COMMAND", json.loads),
            ("worker_defaults", "TIANJI_WORKER_DEFAULTS", _pod_overlay),
            ("prometheus_allowed", "TIANJI_PROMETHEUS_ALLOWED", json.loads),
            ("host_port_range", "TIANJI_HOST_PORT_RANGE", str),
        ):
            if key in env:
                setattr(c, name, conv(env[key]))
        parse_port_range(c.host_port_range)
        return c

    def __post_init__(self) -> None:
        if isinstance(self.worker_defaults, dict):
            self.worker_defaults = _pod_overlay(self.worker_defaults)
        parse_port_range(self.host_port_range)  # a bad chart value stops the operator at start

    @property
    def confirm_command(self) -> list[str]:
        """`tianji confirm` from the same installation as the workers' `tianji worker`."""
        return sibling_command(list(self.worker_command), "confirm")

    def load_profile(self):
        """The planner profile, or None for the planner's built-in estimates."""
        if not self.profile_path:
            return None
        from tianji.control.planner.plan import load_profile

        return load_profile(self.profile_path)


def _pod_overlay(value: Any) -> Any:
    """TIANJI_WORKER_DEFAULTS (JSON text or a dict) as a PodOverlay; empty -> None."""
    from tianji.control.spec import PodOverlay

    data = json.loads(value) if isinstance(value, str) else value
    return PodOverlay.model_validate(data) if data else None
