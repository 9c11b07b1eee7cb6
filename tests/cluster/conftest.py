"""The real-control-plane tier: local clusters (cluster/localcluster: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and CoreDNS built from their Go modules by `make
cluster`), each test in a namespace of its own.

`cluster`: two process-mode nodes (the node agent), for test_local_cluster.py's checks of that
mode itself (`make cluster-up`'s default); it lives for that module.
`real`: two real nodes (the kubelet and containerd, images pulled from its registry,
NetworkPolicy enforced) beside a process-mode node for the operator, installed by `helm install`
of charts/tianji-operator and running in a pod with the chart's ServiceAccount; TianJi's jobs
run there. Its tests are test_real_*.py, which run one after the other, so it lives from the
first of them to the end of the session.
On these machines the tier never skips: missing programs fail it (`make cluster` builds them).
`TIANJI_SKIP_CLUSTER=1` skips it, for machines without root or Go."""
from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster_jobs import install_real_operator
from clusterkit import OPERATOR_NS, RELEASE, free_index, helm, running
from localcluster import network, realnode
from localcluster.cluster import BIN, LocalCluster, missing_programs
from localcluster.pods import unavailable_reason

# Faster than a kubelet's defaults: restarts back off from 1 s.
AGENT_ARGS = ("--backoff-base=1", "--backoff-max=10", "--probe-period-cap=1")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="module")
def cluster() -> LocalCluster:
    if os.environ.get("TIANJI_SKIP_CLUSTER") == "1":
        pytest.skip("TIANJI_SKIP_CLUSTER=1")
    missing = missing_programs()
    if missing:
        pytest.fail(f"missing {', '.join(missing)} in {BIN}: run `make cluster` (make test does)")
    reason = unavailable_reason()
    if reason:
        pytest.fail(reason)
    # Not under pytest's basetemp: another pytest session started meanwhile prunes old basetemps,
    # and this cluster's etcd, certificates and pods live here for the whole session.
    root = Path(tempfile.mkdtemp(prefix="tianji-cluster-"))
    with running(LocalCluster(2, index=free_index(), root=root, agent_args=AGENT_ARGS)) as c:
        yield c


def _scratch_namespace(c: LocalCluster, prefix: str) -> Iterator[str]:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    c.kubectl("create", "namespace", name)
    yield name
    c.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def namespace(cluster: LocalCluster) -> Iterator[str]:
    """A namespace of the process-mode cluster, for one test."""
    yield from _scratch_namespace(cluster, "t")


def _free_real_index() -> int:
    taken = os.environ.get("TIANJI_CLUSTER_INDEX", "")  # the session's cluster may take it later
    for i in range(15, 0, -1):
        if str(i) != taken and network.usable(i):
            return i
    raise RuntimeError("no free local-cluster address range that clashes with nothing of the host's")


@pytest.fixture(scope="session")
def real() -> LocalCluster:
    """node-1 a process-mode node (the operator's pod, by the chart); node-2 and node-3 real,
    tainted so that only pods that ask for them land there (the operator's worker pods do:
    realnode.WORKER_DEFAULTS), as `make cluster-up NODES=real` makes it."""
    if os.environ.get("TIANJI_SKIP_CLUSTER") == "1":
        pytest.skip("TIANJI_SKIP_CLUSTER=1")
    missing = missing_programs(real=True)
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: run `make cluster` (make test does)")
    root = Path(tempfile.mkdtemp(prefix="tianji-real-"))
    with running(LocalCluster(1, index=_free_real_index(), root=root, agent_args=AGENT_ARGS, real_nodes=2,
                              real_taints=(realnode.TAINT,))) as c:
        yield c


@pytest.fixture(scope="session")
def real_operator(real: LocalCluster) -> str:
    """The chart's operator on the real cluster (cluster_jobs.install_real_operator)."""
    install_real_operator(real)
    yield RELEASE
    helm(real, "uninstall", RELEASE, "-n", OPERATOR_NS, "--wait", "--timeout=120s", check=False)


@pytest.fixture(scope="session")
def prometheus(real: LocalCluster, real_operator: str):
    """A real Prometheus for the real cluster's jobs (cluster_prometheus.py), on this machine."""
    from cluster_prometheus import ClusterPrometheus
    from clusterkit import rendered_service_monitor

    p = ClusterPrometheus(real, real.root / "prometheus", service_monitor=rendered_service_monitor(real)).start()
    yield p
    p.stop()


@pytest.fixture
def ns(real: LocalCluster) -> Iterator[str]:
    """A namespace of the real cluster's, for one test."""
    yield from _scratch_namespace(real, "r")
