"""`python -m tianji_operator`: run the operator (Kopf, standalone: no peering).

Liveness on http://0.0.0.0:8081/healthz, the operator's Prometheus metrics on
:8080/metrics. Watches all namespaces unless --namespace is given.
"""

from __future__ import annotations

import argparse
import logging
import sys

import kopf

from .config import OperatorConfig
from .handlers import register
from .metrics import OperatorMetrics


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tianji-operator", description="Kubernetes operator for TianJiJob")
    p.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="watch only this namespace (repeatable; globs allowed); default: all namespaces",
    )
    p.add_argument("--liveness-port", type=int, default=8081, help="Kopf liveness endpoint port (0: off)")
    p.add_argument("--metrics-port", type=int, default=8080, help="operator metrics port (0: off)")
    p.add_argument("--verbose", "-v", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if a.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    metrics = OperatorMetrics()
    registry = kopf.get_default_registry()
    register(registry, OperatorConfig.from_env(), metrics)
    if a.metrics_port:
        metrics.serve(a.metrics_port)
    kopf.run(
        registry=registry,
        standalone=True,
        clusterwide=not a.namespace,
        namespaces=a.namespace,
        liveness_endpoint=f"http://0.0.0.0:{a.liveness_port}/healthz" if a.liveness_port else None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
