"""The real-control-plane tier: a local cluster (cluster/localcluster: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and CoreDNS built from their Go modules by `make
cluster`, two nodes run by the node agent) and the operator installed by `helm install` of
charts/tianji-operator, running in a pod with the chart's ServiceAccount.

One cluster and one release serve the whole session; each test works in its own namespace.
On these machines the tier never skips: missing programs fail it (`make cluster` builds them).
`TIANJI_SKIP_CLUSTER=1` skips it, for machines without root or Go."""
from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import yaml

from localcluster import network
from localcluster.cluster import BIN, LocalCluster, missing_programs
from localcluster.pods import unavailable_reason

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "tianji-operator"
RELEASE, OPERATOR_NS = "tianji", "tianji-system"
# Faster than a kubelet's defaults, as the emulator tier runs them: restarts back off from 1 s.
AGENT_ARGS = ("--backoff-base=1", "--backoff-max=10", "--probe-period-cap=1")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)


def _free_index() -> int:
    """A cluster number whose bridge is not in use (a person's `make cluster-up` takes 0)."""
    for i in range(1, 16):
        if not Path(f"/sys/class/net/{network.Addressing(i).bridge}").exists():
            return i
    raise RuntimeError("all 15 local-cluster address ranges are in use")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory) -> LocalCluster:
    if os.environ.get("TIANJI_SKIP_CLUSTER") == "1":
        pytest.skip("TIANJI_SKIP_CLUSTER=1")
    missing = missing_programs()
    if missing:
        pytest.fail(f"missing {', '.join(missing)} in {BIN}: run `make cluster` (make test does)")
    reason = unavailable_reason()
    if reason:
        pytest.fail(reason)
    c = LocalCluster(2, index=_free_index(), root=tmp_path_factory.mktemp("cluster"), agent_args=AGENT_ARGS)
    try:
        c.up()
    except BaseException:
        print(c.logs(60))
        c.down()
        raise
    yield c
    c.down()


def helm(c: LocalCluster, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "KUBECONFIG": str(c.kubeconfig), "HELM_CACHE_HOME": str(c.root / "helm" / "cache"),
           "HELM_CONFIG_HOME": str(c.root / "helm" / "config"), "HELM_DATA_HOME": str(c.root / "helm" / "data")}
    res = subprocess.run([str(BIN / "helm"), *args], capture_output=True, text=True, timeout=timeout, env=env)
    if check and res.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)}: {res.stderr.strip()}\n{c.logs(30)}")
    return res


OPERATOR_VALUES = ["--set", "operator.monitorInterval=1", "--set", "operator.autoscaleTick=1",
                   "--set", "operator.handlerBackoff=1"]


@pytest.fixture(scope="session")
def operator(cluster: LocalCluster) -> str:
    """`helm install` of the chart, as the README says; waits for the operator pod to be Ready."""
    helm(cluster, "install", RELEASE, str(CHART), "-n", OPERATOR_NS, "--create-namespace", *OPERATOR_VALUES,
         "--wait", "--timeout=180s")
    yield RELEASE
    helm(cluster, "uninstall", RELEASE, "-n", OPERATOR_NS, "--wait", "--timeout=120s", check=False)


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


@pytest.fixture
def namespace(cluster: LocalCluster) -> str:
    ns = f"t-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    yield ns
    cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
