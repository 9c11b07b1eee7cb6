"""The local cluster's pod runtime (cluster/localcluster/pods.py, what the node agent runs every
pod with) on small shell containers, each behaviour on its own in seconds: a pod spec becomes a
process (command, args, env, volumes, hostname, termination message), restart policies with
back-off and lastState, readiness probes, graceful deletion (SIGTERM, SIGKILL after the grace
period, the container's whole process group).

`MemoryNode` gives the runtime what the node agent gets from the API server (ConfigMaps, the
pod's status, its removal) from a dict, so a case needs no cluster. What needs one (cluster DNS,
the scheduler, StatefulSets, claims on another node) runs in tests/cluster/test_local_cluster.py."""
from __future__ import annotations

import copy
import json
import os
import sys
import uuid
from pathlib import Path

import aiohttp
import pytest

from kube.operator_harness import eventually
from kube.podnet import LoopbackIPAM
from localcluster.pods import Node, PodWorker, unavailable_reason

NO_PODS = unavailable_reason()
pytestmark = pytest.mark.skipif(NO_PODS is not None, reason=str(NO_PODS))
NS = "default"


class MemoryNode(Node):
    """A node whose API server is a dict: `pods` (by name, as stored), `objects` (ConfigMaps and
    Secrets by (resource, name)); `apply` starts a pod, `delete` deletes it as the API server
    would (deletionTimestamp and its grace period), the runtime removes it when it has stopped."""

    def __init__(self, root: Path):
        super().__init__(root, node_name="node-1", host_ip="127.0.0.1", backoff_base=0.2, backoff_max=1.0,
                         probe_period_cap=0.2)
        self.pods: dict[str, dict] = {}
        self.objects: dict[tuple[str, str], dict] = {}
        self.ipam = LoopbackIPAM()

    async def __aenter__(self) -> MemoryNode:
        self.http = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop_pods()
        await self.http.close()

    def apply(self, pod: dict) -> None:
        pod = copy.deepcopy(pod)
        pod["metadata"]["uid"] = str(uuid.uuid4())
        self.pods[pod["metadata"]["name"]] = pod
        self.start_worker(pod)

    def delete(self, name: str) -> dict:
        pod = self.pods[name]
        meta = pod["metadata"]
        meta["deletionGracePeriodSeconds"] = pod["spec"].get("terminationGracePeriodSeconds", 30)
        meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"  # the runtime reads the grace period, not this
        self.workers[meta["uid"]].observe(copy.deepcopy(pod))
        return pod

    def status(self, name: str) -> dict:
        return (self.pods.get(name) or {}).get("status") or {}

    # ------------------------------------------------------------ the node's hooks
    async def sandbox(self, worker: PodWorker) -> str:
        return self.ipam.allocate()

    async def read(self, resource: str, namespace: str, name: str) -> dict | None:
        return self.objects.get((resource, name))

    async def write_status(self, worker: PodWorker) -> None:
        pod = self.pods.get(worker.name)
        if pod is not None and pod["metadata"]["uid"] == worker.uid:
            pod["status"] = json.loads(json.dumps(worker.status))

    async def remove(self, worker: PodWorker) -> None:
        if (self.pods.get(worker.name) or {}).get("metadata", {}).get("uid") == worker.uid:
            del self.pods[worker.name]


@pytest.fixture
async def node(tmp_path):
    async with MemoryNode(tmp_path / "node") as n:
        yield n
    assert not n.leftover_processes(), n.leftover_processes()
    assert not n.shm_root.exists()  # memory-backed emptyDirs are gone
    assert not n.errors, n.errors


def pod(name: str, script: str, restart: str = "Never", **spec) -> dict:
    container = {"name": "main", "image": "busybox", "command": ["sh", "-c", script],
                 "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}
    container.update(spec.pop("container", {}))
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": {"app": "demo", "name": name}},
            "spec": {"restartPolicy": restart, "terminationGracePeriodSeconds": 30, "containers": [container], **spec}}


def cstatus(node: MemoryNode, name: str) -> dict:
    return node.status(name)["containerStatuses"][0]


async def test_a_pod_spec_becomes_a_process(node):
    """command/args/env (downward API, $(VAR)), volumes at their mountPath, the hostname, the
    termination message, and phase Succeeded."""
    node.objects[("configmaps", "cfg")] = {"data": {"job.yaml": "hello: world\n", "other": "x"}}
    script = r'''
set -eu
echo "ip $POD_IP in $NS"
echo "host $(cat /proc/sys/kernel/hostname) $HOSTNAME"
echo "args $0 $*"
echo "cfg $(cat /etc/cfg/job.yaml) $(ls /etc/cfg)"
touch /etc/cfg/nope 2>/dev/null && echo "cfg writable" || echo "cfg read-only"
echo kept > /data/file
echo in-memory > /dev/shm/file
printf '{"counts": {"env_frames_total": 7}}' > /dev/termination-log
'''
    vols = {"volumes": [{"name": "cfg", "configMap": {"name": "cfg", "items": [{"key": "job.yaml",
                                                                                   "path": "job.yaml"}]}},
                        {"name": "data", "emptyDir": {}}, {"name": "shm", "emptyDir": {"medium": "Memory"}}]}
    env = [{"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
           {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
           {"name": "WHO", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['name']"}}},
           {"name": "GREETING", "value": "hi-$(WHO)"}]
    mounts = [{"name": "cfg", "mountPath": "/etc/cfg", "readOnly": True}, {"name": "data", "mountPath": "/data"},
              {"name": "shm", "mountPath": "/dev/shm"}]
    node.apply(pod("a", script, hostname="a-host",
                   container={"args": ["$(GREETING)", "$$(LITERAL)"], "env": env, "volumeMounts": mounts}, **vols))
    await eventually(lambda: node.status("a").get("phase") in ("Succeeded", "Failed"), timeout=20,
                     what="pod a to finish")
    (inc,) = node.pod_incarnations("a")
    out = inc.log_path.read_text()
    st = node.status("a")
    assert st["phase"] == "Succeeded", out
    assert st["podIP"].startswith("127.") and f"ip {st['podIP']} in {NS}\n" in out, out
    assert "host a-host a-host\n" in out and "args hi-a $(LITERAL)\n" in out, out
    assert "cfg hello: world job.yaml\n" in out and "cfg read-only\n" in out, out
    assert (inc.pod_dir / "volumes" / "empty-dir" / "data" / "file").read_text() == "kept\n"
    (shm,) = node.shm_root.glob("*-shm")
    assert (shm / "file").read_text() == "in-memory\n" and not os.path.exists("/dev/shm/file")
    term = st["containerStatuses"][0]["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (0, "Completed")
    assert json.loads(term["message"]) == inc.final_report() == {"counts": {"env_frames_total": 7}}
    node.delete("a")
    await eventually(lambda: "a" not in node.pods and not list(node.shm_root.glob("*-shm")), timeout=10,
                     what="pod a removed, with its memory-backed emptyDir")


async def test_restart_policies_back_off_and_last_state(node):
    script = ('n=$(cat /data/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /data/n; '
              'echo "run $n" > /dev/termination-log; [ $n -ge 3 ]')
    node.apply(pod("flaky", script, "OnFailure", volumes=[{"name": "data", "emptyDir": {}}],
                   container={"volumeMounts": [{"name": "data", "mountPath": "/data"}]}))
    node.apply(pod("broken", "exit 3", "Never"))
    node.apply(pod("always", "exit 0", "Always"))
    await eventually(lambda: node.status("flaky").get("phase") == "Succeeded", timeout=20, what="flaky to succeed")
    cs = cstatus(node, "flaky")
    assert cs["restartCount"] == 2  # the emptyDir outlived the container restarts
    assert cs["state"]["terminated"]["message"] == "run 3\n"
    assert (cs["lastState"]["terminated"]["exitCode"], cs["lastState"]["terminated"]["message"]) == (1, "run 2\n")
    assert [i.termination_message() for i in node.pod_incarnations("flaky")] == ["run 1\n", "run 2\n", "run 3\n"]
    await eventually(lambda: node.status("broken").get("phase") == "Failed", timeout=10, what="broken to fail")
    assert cstatus(node, "broken")["state"]["terminated"]["exitCode"] == 3
    assert len(node.pod_incarnations("broken")) == 1
    await eventually(lambda: cstatus(node, "always")["restartCount"] >= 3, timeout=10, what="restarts")
    assert node.status("always")["phase"] == "Running"
    # the back-off doubles from backoff_base (0.2 s here) up to backoff_max
    backoffs = [e[3] for e in node.events if e[1] == f"{NS}/always" and e[2] == "BackOff"]
    assert backoffs[:3] == [f"back-off {s:g}s restarting failed container" for s in (0.2, 0.4, 0.8)], backoffs


async def test_init_containers_run_first_with_their_own_mounts(node):
    """Init containers run in order, each to completion, before the pod's container; one that fails
    runs again after a back-off; a Secret mounted only into an init container is not in the pod
    container's mount namespace, while what the init container wrote to a shared emptyDir is."""
    node.objects[("secrets", "seed")] = {"data": {"seed": "c2VjcmV0LXNlZWQ="}}  # "secret-seed"
    first = ('n=$(cat /keys/tries 2>/dev/null || echo 0); echo $((n+1)) > /keys/tries; '
             '[ $n -ge 1 ] && cp /seed/seed /keys/own && chmod 0400 /keys/own')
    inits = [{"name": "derive", "image": "busybox", "command": ["sh", "-c", first],
              "volumeMounts": [{"name": "seed", "mountPath": "/seed", "readOnly": True},
                               {"name": "keys", "mountPath": "/keys"}]},
             {"name": "second", "image": "busybox", "command": ["sh", "-c", "date +%s%N > /keys/second"],
              "volumeMounts": [{"name": "keys", "mountPath": "/keys"}]}]
    script = ('cat /keys/own; echo; test -e /seed/seed || echo no-seed; test -e /keys/second && echo second-ran; '
              'touch /keys/x 2>/dev/null || echo keys-read-only')
    node.apply(pod("init", script, "OnFailure", initContainers=inits,
                   volumes=[{"name": "seed", "secret": {"secretName": "seed"}},
                            {"name": "keys", "emptyDir": {"medium": "Memory"}}],
                   container={"volumeMounts": [{"name": "keys", "mountPath": "/keys", "readOnly": True}]}))
    await eventually(lambda: node.status("init").get("phase") in ("Succeeded", "Failed"), timeout=20,
                     what="pod init to finish")
    incs = node.pod_incarnations("init")
    assert [(i.container, i.exit_code) for i in incs] == [("derive", 1), ("derive", 0), ("second", 0), ("main", 0)]
    out = incs[-1].log_path.read_text()
    st = node.status("init")
    assert st["phase"] == "Succeeded", out
    assert out.startswith("secret-seed\nno-seed\n"), out  # the Secret is not mounted here
    assert "second-ran\n" in out and "keys-read-only\n" in out, out
    derive, second = st["initContainerStatuses"]
    assert derive["restartCount"] == 1 and derive["lastState"]["terminated"]["exitCode"] == 1
    assert derive["ready"] and second["ready"] and second["state"]["terminated"]["exitCode"] == 0
    assert {c["type"]: c["status"] for c in st["conditions"]}["Initialized"] == "True"
    fail = {"name": "fail", "command": ["sh", "-c", "exit 4"]}
    node.apply(pod("stuck", "echo never", "Never", initContainers=[fail]))
    await eventually(lambda: node.status("stuck").get("phase") == "Failed", timeout=10, what="stuck to fail")
    assert [i.container for i in node.pod_incarnations("stuck")] == ["fail"]  # the pod's container never ran
    assert {c["type"]: c["status"] for c in node.status("stuck")["conditions"]}["Initialized"] == "False"


async def test_readiness_probe_and_graceful_deletion(node):
    server = [sys.executable, "-c", ("import http.server, os, time; time.sleep(0.5); http.server.HTTPServer("
                                     "(os.environ['POD_IP'], 8080), http.server.SimpleHTTPRequestHandler)"
                                     ".serve_forever()")]
    probe = {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 10, "failureThreshold": 3}
    node.apply(pod("web", "", "Always", container={
        "command": server, "ports": [{"name": "http", "containerPort": 8080}], "readinessProbe": probe,
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}))
    stubborn = pod("stubborn", "trap '' TERM; sleep 300 & wait; wait", "Always")
    stubborn["spec"]["terminationGracePeriodSeconds"] = 1
    node.apply(stubborn)

    def ready(name: str) -> bool:
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node.status(name).get("conditions", []))

    await eventually(lambda: node.status("web").get("phase") == "Running", timeout=10)
    assert not ready("web")  # the server sleeps before it listens
    await eventually(lambda: ready("web"), timeout=10, what="web ready")
    assert cstatus(node, "web")["ready"] is True
    await eventually(lambda: ready("stubborn"), timeout=10, what="stubborn ready (no probe)")

    assert node.delete("web")["metadata"]["deletionGracePeriodSeconds"] == 30
    assert node.delete("stubborn")["metadata"]["deletionGracePeriodSeconds"] == 1
    await eventually(lambda: not node.pods, timeout=15, what="both pods removed")
    (web,), (stub,) = node.pod_incarnations("web"), node.pod_incarnations("stubborn")
    assert web.signals == ["SIGTERM"] and web.exit_code == 128 + 15
    assert stub.signals == ["SIGTERM", "SIGKILL"] and stub.exit_code == 128 + 9
    assert not node.leftover_processes()  # the background `sleep` went with the container's group
