"""A hostNetwork pod that fits no node stays Pending and the job's status says why (the real
scheduler's message, quoted). Host-network jobs that train run on real nodes, each with its own
network namespace and ports: test_real_nodes.py."""
from __future__ import annotations

import pytest

from cluster_jobs import condition, diagnostics, example, status
from clusterkit import wait_for


@pytest.mark.timeout(300)
def test_a_pod_that_fits_no_node_keeps_the_job_pending_and_says_why(cluster, operator, namespace):
    spec = {"network": {"hostNetwork": True, "rdma": "rdma/hca"}}  # no node offers an RDMA device
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=example(spec))
    ready = wait_for(lambda: (c := condition(status(cluster, namespace), "Ready")) and
                     c["reason"] == "Unschedulable" and "rdma/hca" in c["message"] and c, 180,
                     "Ready False/Unschedulable naming rdma/hca", interval=2.0,
                     on_timeout=lambda: diagnostics(cluster, namespace))
    assert ready["status"] == "False", ready
    assert status(cluster, namespace)["phase"] == "Pending"
