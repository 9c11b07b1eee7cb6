"""Shared helpers of the cluster tier (the fixtures are in conftest.py): kubectl/helm calls and
waiting with diagnostics."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import yaml

from localcluster import network
from localcluster.cluster import BIN, LocalCluster

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "tianji-operator"
RELEASE, OPERATOR_NS = "tianji", "tianji-system"

def helm(c: LocalCluster, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "KUBECONFIG": str(c.kubeconfig), "HELM_CACHE_HOME": str(c.root / "helm" / "cache"),
           "HELM_CONFIG_HOME": str(c.root / "helm" / "config"), "HELM_DATA_HOME": str(c.root / "helm" / "data")}
    res = subprocess.run([str(BIN / "helm"), *args], capture_output=True, text=True, timeout=timeout, env=env)
    if check and res.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)}: {res.stderr.strip()}\n{c.logs(30)}")
    return res

def get(c: LocalCluster, *args: str) -> Any:
    """`kubectl get ... -o yaml` as a dict (None if not found)."""
    res = c.kubectl("get", *args, "-o", "yaml", check=False)
    if res.returncode != 0:
        if "NotFound" in res.stderr:
            return None
        raise RuntimeError(res.stderr)
    return yaml.safe_load(res.stdout)

def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 1.0,
             on_timeout: Optional[Callable[[], str]] = None) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    extra = on_timeout() if on_timeout else ""
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})\n{extra}")


# Shorter intervals than the chart's defaults; the test Prometheus allowed for autoscaling.
OPERATOR_VALUES = ("--set", "operator.monitorInterval=1", "--set", "operator.autoscaleTick=1",
                   "--set", "operator.handlerBackoff=1", "--set", "operator.promqlWindow=10s")


@contextmanager
def running(c: LocalCluster) -> Iterator[LocalCluster]:
    """`c` up for the block (its processes' logs printed if it fails to start), then down and removed."""
    try:
        c.up()
    except BaseException:
        print(c.logs(60))
        c.down()
        raise
    try:
        yield c
    finally:
        c.down()
        shutil.rmtree(c.root, ignore_errors=True)


def free_index() -> int:
    """A cluster number whose bridge is not in use (a person's `make cluster-up` takes 0), or
    TIANJI_CLUSTER_INDEX: two test sessions started at once could otherwise pick the same one."""
    if os.environ.get("TIANJI_CLUSTER_INDEX"):
        return int(os.environ["TIANJI_CLUSTER_INDEX"])
    for i in range(1, 16):
        if network.usable(i):
            return i
    raise RuntimeError("all 15 local-cluster address ranges are in use or clash with the host's network")


def install_operator(c: LocalCluster, prometheus_url: Optional[str], values: tuple[str, ...] = ()) -> None:
    """`helm upgrade --install` of charts/tianji-operator; waits for the operator pod to be Ready.
    `values`: more helm flags (--set image.tag=...)."""
    allow = ("--set-json", f'operator.prometheusAllowList=["{prometheus_url}"]') if prometheus_url else ()
    helm(c, "upgrade", "--install", RELEASE, str(CHART), "-n", OPERATOR_NS, "--create-namespace",
         *OPERATOR_VALUES, *allow, *values, "--wait", "--timeout=180s")


def rendered_service_monitor(c: LocalCluster) -> dict:
    """The chart's ServiceMonitor as `helm install` of this release would create it."""
    out = helm(c, "template", RELEASE, str(CHART), "-n", OPERATOR_NS, "--set", "monitoring.serviceMonitor.enabled=true")
    (sm,) = [d for d in yaml.safe_load_all(out.stdout) if d and d.get("kind") == "ServiceMonitor"]
    return sm
