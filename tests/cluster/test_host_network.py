"""hostNetwork jobs across two nodes on the real scheduler: pods placed by capacity on both
nodes, data sockets on the nodes' `eth0`, host ports that never collide on a node (the
scheduler's NodePorts filter and the operator's port blocks); a pod that fits no node stays
Pending and the job's status says why."""
from __future__ import annotations

import pytest

from cluster_jobs import condition, diagnostics, example, pods, status, wait_phase
from clusterkit import wait_for


def host_ports(p: dict) -> set[int]:
    return {port["hostPort"] for c in p["spec"]["containers"] for port in c.get("ports") or [] if port.get("hostPort")}


@pytest.mark.timeout(900)
def test_host_network_actors_take_one_node_each_and_the_third_waits_named(cluster, operator, namespace):
    # A group's actors share one pod template, so they ask for the same host ports: the real
    # scheduler puts at most one of them on a node (NodePorts). With 3 actors on 2 nodes, one
    # stays Pending, the job's Ready condition quotes why, and the job trains with the two.
    spec = {"network": {"hostNetwork": True, "interface": "eth0"}, "topology": {"actors": 3}}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=example(spec))
    running = wait_for(lambda: (ps := [p for p in pods(cluster, namespace) if p["status"].get("phase") == "Running"])
                       and len(ps) == 4 and ps, 300, "learner, buffer and 2 actors running", interval=2.0,
                       on_timeout=lambda: diagnostics(cluster, namespace))
    by_node: dict[str, list[dict]] = {}
    for p in running:
        assert p["spec"]["hostNetwork"] and p["status"]["podIP"] == p["status"]["hostIP"], p["status"]
        by_node.setdefault(p["spec"]["nodeName"], []).append(p)
    actors = {n: [p for p in ps if p["metadata"]["labels"]["tianji.dev/role"] == "actor"] for n, ps in by_node.items()}
    assert sorted(len(a) for a in actors.values()) == [1, 1], {n: [p["metadata"]["name"] for p in a]
                                                               for n, a in actors.items()}
    for node, ps in by_node.items():  # no two pods of a node share a host port
        ports = [port for p in ps for port in host_ports(p)]
        assert ports and len(ports) == len(set(ports)), (node, ports)
    # The status is written once a monitor tick, so it may still quote a pod that waited for its
    # volume a moment ago: wait for the tick that quotes the actor left waiting.
    waiting = {p["metadata"]["name"] for p in pods(cluster, namespace)} - {p["metadata"]["name"] for p in running}
    assert len(waiting) == 1 and "actor" in next(iter(waiting)), waiting
    ready = wait_for(lambda: (c := condition(status(cluster, namespace), "Ready")) and
                     c["reason"] == "Unschedulable" and next(iter(waiting)) in c["message"] and c, 60,
                     f"Ready False/Unschedulable naming {waiting}", interval=2.0,
                     on_timeout=lambda: condition(status(cluster, namespace), "Ready"))
    assert "free ports" in ready["message"], ready
    st = wait_phase(cluster, namespace, ("Succeeded", "Failed"), 600)
    assert st["phase"] == "Succeeded" and st["meanReturn"] >= 475, diagnostics(cluster, namespace)


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
