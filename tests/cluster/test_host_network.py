"""hostNetwork jobs across two nodes on the real scheduler: pods placed by capacity on both
nodes, data sockets on the nodes' `eth0`, host ports that never collide on a node (the
scheduler's NodePorts filter and the operator's port blocks); a pod that fits no node stays
Pending and the job's status says why."""
from __future__ import annotations

import pytest

from clusterkit import wait_for
from cluster_jobs import condition, diagnostics, example, pods, status, wait_phase


def host_ports(p: dict) -> set[int]:
    return {port["hostPort"] for c in p["spec"]["containers"] for port in c.get("ports") or [] if port.get("hostPort")}


@pytest.mark.timeout(900)
def test_a_host_network_job_spans_both_nodes_without_port_collisions(cluster, operator, namespace):
    # 3 actors of 1.5 cores and a 1-core learner do not fit one 4-core node: the scheduler spreads them.
    spec = {"network": {"hostNetwork": True, "interface": "eth0"}, "topology": {"actors": 3},
            "resources": {"actor": {"cpu": 1.5, "memory": "1Gi"}}}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=example(spec))
    running = wait_for(lambda: (ps := [p for p in pods(cluster, namespace) if p["status"].get("phase") == "Running"])
                       and len(ps) == 5 and ps, 300, "5 pods running", interval=2.0,
                       on_timeout=lambda: diagnostics(cluster, namespace))
    by_node: dict[str, list[dict]] = {}
    for p in running:
        assert p["spec"]["hostNetwork"] and p["status"]["podIP"] == p["status"]["hostIP"], p["status"]
        by_node.setdefault(p["spec"]["nodeName"], []).append(p)
    assert set(by_node) == {"node-1", "node-2"}, {k: [p["metadata"]["name"] for p in v] for k, v in by_node.items()}
    for node, ps in by_node.items():
        ports = [port for p in ps for port in host_ports(p)]
        assert ports and len(ports) == len(set(ports)), (node, ports)
        cpu = sum(float(c["resources"]["requests"]["cpu"].rstrip("m")) / (1000 if c["resources"]["requests"]["cpu"]
                  .endswith("m") else 1) for p in ps for c in p["spec"]["containers"])
        assert cpu <= 4, (node, cpu)  # the scheduler kept each node within its capacity
    st = wait_phase(cluster, namespace, ("Succeeded", "Failed"), 600)
    assert st["phase"] == "Succeeded" and st["meanReturn"] >= 475, diagnostics(cluster, namespace)


@pytest.mark.timeout(300)
def test_a_pod_that_fits_no_node_keeps_the_job_pending_and_says_why(cluster, operator, namespace):
    spec = {"network": {"hostNetwork": True, "rdma": "rdma/hca"}}  # no node offers an RDMA device
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=example(spec))
    ready = wait_for(lambda: (c := condition(status(cluster, namespace), "Ready")) and
                     c["reason"] == "Unschedulable" and c, 180, "Ready False/Unschedulable", interval=2.0,
                     on_timeout=lambda: diagnostics(cluster, namespace))
    assert ready["status"] == "False" and "rdma/hca" in ready["message"], ready
    assert status(cluster, namespace)["phase"] == "Pending"
