"""Real nodes: the kubelet and containerd (cluster/localcluster/realnode.py), images pulled from the
cluster's registry (TianJi's workers from the checkout's image, checkoutimage.py), beside a
process-mode node that runs the operator.

The cluster of real nodes (conftest.py's `real`, one per session, shared with
test_real_disruption.py): node-1 is a process-mode node (the operator's pod, by the chart), node-2
and node-3 are real, tainted so that only pods that ask for them land there: the operator's
worker pods do (its chart's `workerDefaults`), so the README's quick start runs here as written."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from cluster_jobs import (
    EXAMPLE,
    JOB,
    ON_REAL,
    TARGET,
    TARGET_ONLY,
    TerminationMessages,
    assert_never_succeeded_untrained,
    condition,
    diagnostics,
    example,
    on_real_nodes,
    pods,
    status,
    training,
    trains_again,
    wait_phase,
    workers_view,
)
from clusterkit import OPERATOR_NS, RELEASE, get, wait_for
from localcluster.cluster import BIN, K8S_VERSION, LocalCluster
from localcluster.realnode import KIND_LABEL, PROBE_IMAGE


def _pod(real: LocalCluster, ns: str, name: str, args: list[str], node: str, *, image: str = "",
         memory: str = "", labels: dict | None = None) -> None:
    container = {"name": "main", "image": image or f"{real.registry_host}/{PROBE_IMAGE}", "args": args}
    if memory:
        container["resources"] = {"limits": {"memory": memory, "cpu": "100m"}}
    doc = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
           "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, **ON_REAL, "containers": [container],
                    "terminationGracePeriodSeconds": 1}}
    real.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))


def _running(real: LocalCluster, ns: str, name: str, timeout: float = 90) -> dict:
    return wait_for(lambda: (p := get(real, "pod", "-n", ns, name)) and p["status"].get("phase") == "Running"
                    and all(c.get("ready") for c in p["status"].get("containerStatuses") or [{}]) and p,
                    timeout, f"pod {name} running", on_timeout=lambda: real.kubectl(
                        "describe", "pod", "-n", ns, name, check=False).stdout[-3000:])


def _serve(real: LocalCluster, ns: str, node: str = "node-2") -> dict:
    _pod(real, ns, "srv", ["serve", ":8080"], node, labels={"app": "srv"})
    real.kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "srv", "namespace": ns},
        "spec": {"clusterIP": "None", "selector": {"app": "srv"}, "ports": [{"port": 8080}]}}))
    return _running(real, ns, "srv")


def test_real_nodes_register_as_kubelets_with_containerd(real):
    nodes = {n["metadata"]["name"]: n for n in get(real, "nodes")["items"]}
    for name in ("node-2", "node-3"):
        info = nodes[name]["status"]["nodeInfo"]
        assert info["containerRuntimeVersion"].startswith("containerd://2.")
        assert info["kubeletVersion"] == K8S_VERSION
        assert nodes[name]["metadata"]["labels"][KIND_LABEL] == "real"
        taint = {"key": "tianji.local/real-node", "value": "true", "effect": "NoSchedule"}
        assert taint in nodes[name]["spec"]["taints"]
    assert KIND_LABEL not in nodes["node-1"]["metadata"]["labels"]  # the process-mode node


def test_pods_pull_from_the_registry_and_reach_each_other_across_real_nodes(real, ns):
    srv = _serve(real, ns, "node-2")
    _pod(real, ns, "cli", ["pause"], "node-3")
    cli = _running(real, ns, "cli")
    assert srv["spec"]["nodeName"] == "node-2" and cli["spec"]["nodeName"] == "node-3"
    assert srv["status"]["containerStatuses"][0]["imageID"].startswith(f"{real.registry_host}/tianji/probe@sha256:")
    out = real.kubectl("exec", "-n", ns, "cli", "--", "/probe", "dial", f"srv.{ns}.svc.cluster.local:8080")
    assert out.stdout.strip() == "probe srv"  # cluster DNS, then a pod on the other node


@contextlib.contextmanager
def _forwarded(real: LocalCluster, ns: str, pod: str, remote: int) -> Iterator[int]:
    """`kubectl port-forward` to `pod`:`remote` while the block runs; yields the local port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "KUBECONFIG": str(real.kubeconfig)}
    fwd = subprocess.Popen([str(BIN / "kubectl"), "port-forward", "-n", ns, f"pod/{pod}", f"{port}:{remote}"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        assert "Forwarding from" in fwd.stdout.readline()
        yield port
    except BaseException:
        fwd.terminate()
        print("kubectl port-forward said:", fwd.stdout.read()[-2000:])
        raise
    finally:
        fwd.terminate()
        fwd.wait(10)


def test_logs_exec_and_port_forward_reach_a_real_nodes_pod(real, ns):
    _serve(real, ns)
    assert "probe serving on" in real.kubectl("logs", "-n", ns, "srv").stdout
    assert real.kubectl("exec", "-n", ns, "srv", "--", "/probe", "dial", "127.0.0.1:8080").stdout == "probe srv\n"
    with _forwarded(real, ns, "srv", 8080) as port:
        def answer() -> str:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                    return s.makefile().readline()
            except OSError:
                return ""
        assert wait_for(answer, 20, "an answer through port-forward") == "probe srv\n"


def test_a_container_over_its_memory_limit_is_oom_killed_and_restarted(real, ns):
    _pod(real, ns, "hog", ["hog", "100"], "node-2", memory="32Mi")

    def killed() -> dict:
        p = get(real, "pod", "-n", ns, "hog")
        st = ((p or {}).get("status") or {}).get("containerStatuses") or [{}]
        return st[0] if st[0].get("restartCount", 0) >= 1 and st[0].get("lastState", {}).get("terminated") else {}
    last = wait_for(killed, 90, "an OOM kill and a restart")["lastState"]["terminated"]
    assert last["reason"] == "OOMKilled" and last["exitCode"] == 137


def test_an_image_missing_from_the_registry_is_said(real, ns):
    image = f"{real.registry_host}/tianji/absent:1"
    _pod(real, ns, "absent", ["pause"], "node-3", image=image)

    def waiting() -> dict:
        p = get(real, "pod", "-n", ns, "absent")
        st = ((p or {}).get("status") or {}).get("containerStatuses") or [{}]
        w = st[0].get("state", {}).get("waiting") or {}
        return w if w.get("reason") in ("ErrImagePull", "ImagePullBackOff") and w.get("message") else {}
    said = wait_for(waiting, 60, "an image pull failure")
    assert image in said["message"] and "not found" in said["message"]


def test_a_tianji_job_whose_image_is_not_in_the_registry_says_so(real, real_operator, ns):
    """The operator reports the kubelet's pull failure."""
    image = f"{real.registry_host}/tianji/worker-absent:1"
    real.kubectl("apply", "-n", ns, "-f", "-", input=example({"image": image}))
    ready = wait_for(lambda: (c := condition(status(real, ns), "Ready")) and c["reason"] == "ImagePullFailed"
                     and c, 120, "Ready=False ImagePullFailed", on_timeout=lambda: str(status(real, ns)))
    assert ready["status"] == "False" and image in ready["message"]
    events = get(real, "events", "-n", ns, "--field-selector", "reason=ImagePullFailed")["items"]
    assert events and image in events[0]["message"]


SA = f"system:serviceaccount:{OPERATOR_NS}:{RELEASE}-tianji-operator"


def _can_i(c: LocalCluster, *args: str) -> bool:
    res = c.kubectl("auth", "can-i", *args, f"--as={SA}", check=False)
    assert res.stdout.strip() in ("yes", "no"), res
    return res.stdout.strip() == "yes"


def test_the_operator_can_do_what_it_needs_and_nothing_else(real, real_operator, ns):
    sa = real.kubectl("get", "serviceaccounts", "-n", OPERATOR_NS, "-o", "name").stdout.split()
    assert f"serviceaccount/{RELEASE}-tianji-operator" in sa, sa
    for verb, what in (("create", "pods"), ("delete", "pods"), ("create", "statefulsets.apps"),
                       ("patch", "statefulsets.apps"), ("patch", "tianjijobs.tianji.dev/status"),
                       ("create", "configmaps"), ("create", "services"), ("list", "pods")):
        assert _can_i(real, verb, what, "-n", ns), (verb, what)
    for verb, what in (("delete", "nodes"), ("create", "clusterroles.rbac.authorization.k8s.io"),
                       ("list", "secrets"), ("update", "pods"), ("delete", "statefulsets.apps"),
                       ("create", "deployments.apps"), ("delete", "namespaces")):
        assert not _can_i(real, verb, what, "-n", ns), (verb, what)
    for sub in ("exec", "attach", "portforward"):  # (`pods/exec` would name a pod "exec")
        assert not _can_i(real, "create", "pods", f"--subresource={sub}", "-n", ns), sub


@pytest.mark.timeout(900)
def test_the_quick_start_trains_on_real_nodes_from_the_registry(real, real_operator, ns):
    """The README's Kubernetes quick start: the example with `spec.image` set as the README's
    `sed` sets it, to the checkout's worker image (checkoutimage.py) in the cluster's registry,
    pulled by both real nodes' containerd. CartPole trains to its target in pods under the kubelet
    in a namespace that enforces Pod Security `restricted`, the operator acting with nothing but
    its chart's RBAC; `kubectl exec` and `kubectl port-forward` reach the learner while it trains.
    Where the cluster enforces NetworkPolicy, the job trains behind the operator's policy while a
    pod of another namespace dials its learner in vain. Once the pods are gone, `kubectl get tjj`
    shows what the worker processes counted themselves (their termination messages)."""
    real.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    enforced = real.network_policy.enforced
    outsider = _outsider(real, ns) if enforced else contextlib.nullcontext()
    with outsider as dial, TerminationMessages(real, ns) as messages:
        _trains_on_real_nodes(real, ns, dial)
        wait_for(lambda: not pods(real, ns), 120, "the job's pods to go (cleanPodPolicy Running)")
    _get_tjj_shows_the_final_reports(real, ns, messages)


def _quick_start_manifest(real: LocalCluster) -> str:
    """examples/cartpole-ppo.yaml through the README's `sed "s|^spec:|spec:\n  image: ...|"`."""
    text = EXAMPLE.read_text()
    assert text.count("\nspec:\n") == 1, "the README's sed sets spec.image after the line `spec:`"
    return text.replace("\nspec:\n", f"\nspec:\n  image: {real.checkout_image()}\n")


def _trains_on_real_nodes(real: LocalCluster, ns: str, dial) -> None:
    real.kubectl("apply", "-n", ns, "-f", "-", input=_quick_start_manifest(real))
    learner = wait_for(lambda: next((p for p in pods(real, ns) if p["metadata"]["labels"].get(
        "tianji.dev/role") == "learner" and all(c.get("ready") for c in p["status"].get(
            "containerStatuses") or [{}])), None), 300,  # ready: its /metrics answers
        "the learner ready on a real node", on_timeout=lambda: real.kubectl(
            "describe", "pods", "-n", ns, check=False).stdout[-4000:])
    name = learner["metadata"]["name"]
    assert learner["spec"]["nodeName"] in ("node-2", "node-3")
    assert {p["spec"]["nodeName"] for p in pods(real, ns)} <= {"node-2", "node-3"}
    said = real.kubectl("exec", "-n", ns, name, "--", "tianji", "--version").stdout
    assert said.startswith("tianji "), said
    port = next(p["containerPort"] for p in learner["spec"]["containers"][0]["ports"] if p["name"] == "metrics")
    with _forwarded(real, ns, name, port) as local:
        def scrape() -> str:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{local}/metrics", timeout=5) as r:
                    return r.read().decode()
            except OSError:
                return ""
        inside = f"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{port}/metrics').read()[:80])"
        assert "tianji_policy_version" in wait_for(
            scrape, 30, "the learner's /metrics through port-forward", on_timeout=lambda: real.kubectl(
                "exec", "-n", ns, name, "--", "python", "-c", inside, check=False).stdout + real.kubectl(
                "logs", "-n", ns, name, check=False).stdout[-3000:])
    if dial is not None:  # NetworkPolicy enforced: the job trains behind its own policy
        _kept_out_of(real, ns, learner, dial)
    st = wait_phase(real, ns, ("Succeeded", "Failed"), 600)
    assert st["phase"] == "Succeeded" and condition(st, "Succeeded")["reason"] == "StopConditionReached", st
    assert st["meanReturn"] >= 475, st


def _get_tjj_shows_the_final_reports(real: LocalCluster, ns: str, messages: TerminationMessages) -> None:
    reports, missing = messages.reports()
    assert reports and not missing, missing
    assert {r.get("role") for r in reports} >= {"learner", "buffer", "actor"}, reports
    want = workers_view(reports)

    def agrees() -> bool:
        s = status(real, ns)
        return (s.get("envFrames"), s.get("episodes"), s.get("meanReturn")) == (
            want["env_frames"], want["episodes"], want["mean_return"])

    wait_for(agrees, 60, f"status to count the final reports {want['env_frames']} / {want['episodes']}")
    table = real.kubectl("get", "tjj", JOB, "-n", ns, "--no-headers",
                         "-o", "custom-columns=F:.status.envFrames,E:.status.episodes,M:.status.meanReturn"
                         ).stdout.split()
    assert [int(table[0]), int(table[1]), float(table[2])] == [want["env_frames"], want["episodes"],
                                                                want["mean_return"]]
    default_view = real.kubectl("get", "tjj", "-n", ns).stdout
    assert "Succeeded" in default_view and str(want["env_frames"]) in default_view, default_view


def _kept_out(dialed: subprocess.CompletedProcess) -> bool:
    """The probe's connect failed: refused or dropped (not connected and then silent)."""
    said = dialed.stdout
    return dialed.returncode != 0 and "no answer" not in said and ("refused" in said or "timeout" in said)


@contextlib.contextmanager
def _outsider(real: LocalCluster, ns: str) -> Iterator[Callable[[str], subprocess.CompletedProcess]]:
    """A pod in another namespace than `ns`, whose network works (it reaches a server of its own
    namespace); yields its dial(ADDR)."""
    other = f"{ns}-x"
    real.kubectl("create", "namespace", other)
    try:
        _serve(real, other, "node-3")
        _pod(real, other, "cli", ["pause"], "node-3")
        _running(real, other, "cli")
        dial = lambda to: real.kubectl("exec", "-n", other, "cli", "--", "/probe", "dial", to, "1", check=False)
        assert wait_for(lambda: dial(f"srv.{other}.svc.cluster.local:8080").returncode == 0, 30,
                        "the outsider reaching its own namespace")
        yield dial
    finally:
        real.kubectl("delete", "namespace", other, "--wait=false", check=False)


def _kept_out_of(real: LocalCluster, ns: str, learner: dict, dial) -> None:
    """Each of the learner's ports refuses or drops the outsider, while the learner still runs."""
    assert get(real, "networkpolicy", "-n", ns)["items"], "the operator wrote no NetworkPolicy"
    ip = learner["status"]["podIP"]
    for port in learner["spec"]["containers"][0]["ports"]:
        res = dial(f"{ip}:{port['containerPort']}")
        assert _kept_out(res), (port, res.stdout)
    now = get(real, "pod", "-n", ns, learner["metadata"]["name"])
    assert now and now["status"].get("podIP") == ip and now["status"].get("phase") == "Running", \
        "the learner ended while it was dialled: nothing was shown"


@pytest.mark.timeout(300)
def test_a_pod_that_fits_no_node_keeps_the_job_pending_and_says_why(real, real_operator, ns):
    """No node offers an RDMA device: the real scheduler's message, quoted in the job's status."""
    spec = {"network": {"hostNetwork": True, "rdma": "rdma/hca"}}
    real.kubectl("apply", "-n", ns, "-f", "-", input=on_real_nodes(real, spec))
    ready = wait_for(lambda: (c := condition(status(real, ns), "Ready")) and
                     c["reason"] == "Unschedulable" and "rdma/hca" in c["message"] and c, 180,
                     "Ready False/Unschedulable naming rdma/hca", interval=2.0,
                     on_timeout=lambda: diagnostics(real, ns))
    assert ready["status"] == "False", ready
    assert status(real, ns)["phase"] == "Pending"


def test_a_worker_over_its_memory_limit_is_oom_killed_and_counted(real, real_operator, ns):
    """Actors limited to 128Mi (importing torch takes ~500 MB): the kernel kills them, the kubelet
    restarts them, and the operator counts the restarts and says which limit killed them."""
    real.kubectl("apply", "-n", ns, "-f", "-", input=on_real_nodes(
        real, {"resources": {"actor": {"memory": "128Mi"}}}))
    st = wait_for(lambda: (s := status(real, ns)) and ((s.get("restartsByRole") or {}).get("actor") or {}).get(
        "containers", 0) >= 1 and s, 300, "an actor's restart counted", on_timeout=lambda: str(status(real, ns)))
    assert st["restarts"] >= 1, st
    events = wait_for(lambda: get(real, "events", "-n", ns, "--field-selector", "reason=OOMKilled")["items"], 60,
                      "an OOMKilled event")
    assert "spec.resources.actor.memory" in events[0]["message"] and "128Mi" in events[0]["message"], events[0]
    killed = [c for p in pods(real, ns) for c in p["status"].get("containerStatuses") or []
              if ((c.get("lastState") or {}).get("terminated") or {}).get("reason") == "OOMKilled"]
    assert killed and killed[0]["lastState"]["terminated"]["exitCode"] == 137, killed


@pytest.mark.timeout(1200)
def test_a_real_node_lost_under_the_learner_moves_it_and_the_job_reaches_its_target(real, real_operator, ns):
    """test_disruption's stopped node, on kubelets: the learner's node loses power (every container
    of it with it), the operator names the node, the learner is made again on the other real node
    from its checkpoint claim, and the job reaches its target. Each real node has this machine's 2
    cores: the job asks 1.5 in all, so the surviving node can hold all of it."""
    small = {"learner": {"cpu": 0.5}, "buffer": {"cpu": 0.25}, "actor": {"cpu": 0.25}}
    real.kubectl("apply", "-n", ns, "-f", "-", input=on_real_nodes(
        real, {**TARGET_ONLY, "resources": small}))
    training(real, ns)
    learner = get(real, "pod", "-n", ns, f"{JOB}-learner-0-0")
    node = next(n for n in real.nodes if n.name == learner["spec"]["nodeName"])
    node.stop()
    try:
        events = wait_for(lambda: [e for e in get(real, "events", "-n", ns)["items"] if e.get("reason") == "NodeLost"],
                          240, "a NodeLost event", interval=2.0, on_timeout=lambda: diagnostics(real, ns))
        assert any(node.name in e["message"] for e in events), [e["message"] for e in events]
        moved = wait_for(lambda: (p := get(real, "pod", "-n", ns, f"{JOB}-learner-0-0")) and p["spec"].get(
            "nodeName") not in (None, node.name) and p, 180, "the learner on the other real node", interval=2.0,
            on_timeout=lambda: diagnostics(real, ns))
        assert moved["spec"]["nodeName"] in ("node-2", "node-3") and moved["metadata"]["uid"] != learner[
            "metadata"]["uid"]
        trains_again(real, ns, learner["metadata"]["uid"])
        assert_never_succeeded_untrained(real, ns)
        st = wait_phase(real, ns, ("Succeeded", "Failed"), 480)
        assert st["phase"] == "Succeeded" and st["meanReturn"] >= TARGET, diagnostics(real, ns)
        assert st["restartsByRole"]["learner"]["pods"] >= 1, st["restartsByRole"]
    finally:
        node.start()
        real.wait_nodes_ready(120)
        real.route_pods()


def _host_ports(p: dict) -> set[int]:
    return {port["hostPort"] for c in p["spec"]["containers"] for port in c.get("ports") or [] if port.get("hostPort")}


@pytest.mark.timeout(900)
def test_host_network_actors_take_one_real_node_each_and_the_third_waits_named(real, real_operator, ns):
    """A hostNetwork job on the two real nodes, each with its own network namespace (its `eth0`
    is the node IP) and the kubelet's own host ports; NetworkPolicy enforced where the cluster
    does. A group's actors share one pod template, so they ask for the same host ports: the
    scheduler puts at most one of them on a node (NodePorts). With 3 actors on 2 nodes, one stays
    Pending, the job's Ready condition quotes why, and the job trains with the two, across nodes."""
    small = {"learner": {"cpu": 0.5}, "buffer": {"cpu": 0.25}, "actor": {"cpu": 0.25}}  # ports bind, not CPU
    real.kubectl("apply", "-n", ns, "-f", "-", input=on_real_nodes(real, {"resources": small, "topology": {"actors": 3},
        "network": {"hostNetwork": True, "interface": "eth0"}}))
    running = wait_for(lambda: (ps := [p for p in pods(real, ns) if p["status"].get("phase") == "Running"])
                       and len(ps) == 4 and ps, 300, "learner, buffer and 2 actors running", interval=2.0,
                       on_timeout=lambda: diagnostics(real, ns))
    by_node: dict[str, list[dict]] = {}
    for p in running:
        assert p["spec"]["hostNetwork"] and p["status"]["podIP"] == p["status"]["hostIP"], p["status"]
        by_node.setdefault(p["spec"]["nodeName"], []).append(p)
    assert set(by_node) == {"node-2", "node-3"}, sorted(by_node)
    actors = {n: [p for p in ps if p["metadata"]["labels"]["tianji.dev/role"] == "actor"] for n, ps in by_node.items()}
    assert sorted(len(a) for a in actors.values()) == [1, 1], {n: [p["metadata"]["name"] for p in a]
                                                               for n, a in actors.items()}
    for node, ps in by_node.items():  # no two pods of a node share a host port
        ports = [port for p in ps for port in _host_ports(p)]
        assert ports and len(ports) == len(set(ports)), (node, ports)
    # The status is written once a monitor tick, so it may still quote a pod that waited for its
    # image a moment ago: wait for the tick that quotes the actor left waiting.
    waiting = {p["metadata"]["name"] for p in pods(real, ns)} - {p["metadata"]["name"] for p in running}
    assert len(waiting) == 1 and "actor" in next(iter(waiting)), waiting
    ready = wait_for(lambda: (c := condition(status(real, ns), "Ready")) and c["reason"] == "Unschedulable"
                     and next(iter(waiting)) in c["message"] and c, 60, f"Ready False/Unschedulable naming {waiting}",
                     interval=2.0, on_timeout=lambda: condition(status(real, ns), "Ready"))
    assert "free ports" in ready["message"], ready
    st = wait_phase(real, ns, ("Succeeded", "Failed"), 600)
    assert st["phase"] == "Succeeded" and st["meanReturn"] >= 475, diagnostics(real, ns)


def test_network_policy_is_enforced_or_the_cluster_says_why_not(real, ns):
    """kube-network-policies decides each new connection; nftables' queue rule or, where the kernel
    has no such expression, iptables' NFQUEUE target hands it over. A kernel with neither is named."""
    enforcer = real.network_policy
    said = (real.root / "network-policy").read_text()
    assert said.strip() == enforcer.status()
    if not enforcer.enforced:
        assert "nftables cannot queue packets here" in said and "NFQUEUE target is refused" in said
        pytest.skip(f"NetworkPolicy {said.strip()}")
    _serve(real, ns)
    real.kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "own", "namespace": ns},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": {}}]}]}}))
    other = f"{ns}-x"
    real.kubectl("create", "namespace", other)
    try:
        for where in (ns, other):
            _pod(real, where, "cli", ["pause"], "node-3")
            _running(real, where, "cli")
        target = f"srv.{ns}.svc.cluster.local:8080"
        dial = lambda where: real.kubectl("exec", "-n", where, "cli", "--", "/probe", "dial", target, "3", check=False)
        assert wait_for(lambda: dial(ns).returncode == 0, 30, "the job's own namespace reaching it")
        time.sleep(2)  # the policy's rules are in place once the first allowed dial went through
        res = dial(other)
        assert _kept_out(res), res.stdout
    finally:
        real.kubectl("delete", "namespace", other, "--wait=false", check=False)


def test_a_real_node_switched_off_goes_not_ready_and_comes_back(real):
    node = next(n for n in real.nodes if n.name == "node-3")
    node.stop()
    assert not node.alive() and not Path(f"/proc/{node.agent.popen.pid}").exists()

    def ready() -> str:
        n = get(real, "node", "node-3")
        return next((c["status"] for c in n["status"]["conditions"] if c["type"] == "Ready"), "")
    wait_for(lambda: ready() == "Unknown", 60, "node-3 NotReady after its power loss")
    node.start()
    wait_for(lambda: ready() == "True", 90, "node-3 Ready again", on_timeout=lambda: real.logs(20))
    real.route_pods()
