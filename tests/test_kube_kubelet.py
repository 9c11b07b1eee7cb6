"""The local kubelet and StatefulSet controller (tests/kube/) on small shell containers:
what the pod-harness tests (tests/test_operator_pod_disruptions.py) rely on, each behaviour checked on its own in seconds."""
from __future__ import annotations

import contextlib
import json
import os
import sys

import pytest

from kube.kubelet import Kubelet, unavailable_reason
from kube.operator_harness import NAMESPACE, eventually, start_cluster
from kube.statefulset import StatefulSetController

NO_KUBELET = unavailable_reason()
pytestmark = pytest.mark.skipif(NO_KUBELET is not None, reason=str(NO_KUBELET))

PODS, STS = "v1/pods", "apps/v1/statefulsets"


@pytest.fixture
async def node(tmp_path):
    async with contextlib.AsyncExitStack() as stack:
        kube = await start_cluster(stack)
        kubelet = await stack.enter_async_context(
            Kubelet(kube, tmp_path / "node", backoff_base=0.2, backoff_max=1.0, probe_period_cap=0.2))
        sts = await stack.enter_async_context(StatefulSetController(kube))
        yield kube, kubelet, sts
    assert not kubelet.leftover_processes(), kubelet.leftover_processes()
    assert not kubelet.shm_root.exists()  # memory-backed emptyDirs are gone
    assert not kubelet.errors and not sts.errors, (kubelet.errors, sts.errors)


def pod(name: str, script: str, restart: str = "Never", **spec) -> dict:
    container = {"name": "main", "image": "busybox", "command": ["sh", "-c", script],
                 "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}
    container.update(spec.pop("container", {}))
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "demo", "name": name}},
            "spec": {"restartPolicy": restart, "terminationGracePeriodSeconds": 30, "containers": [container], **spec}}


def phase(kube, name):
    return ((kube.obj(PODS, NAMESPACE, name) or {}).get("status") or {}).get("phase")


def cstatus(kube, name):
    return kube.obj(PODS, NAMESPACE, name)["status"]["containerStatuses"][0]


async def test_a_pod_spec_becomes_a_process(node):
    """command/args/env (downward API, $(VAR)), volumes at their mountPath, hostname, cluster DNS,
    the termination message, and phase Succeeded."""
    kube, kubelet, _ = node
    await kube.put_object("v1/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "sub", "namespace": NAMESPACE},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {"app": "demo"}}})
    await kube.put_object("v1/configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                            "metadata": {"name": "cfg", "namespace": NAMESPACE},
                                            "data": {"job.yaml": "hello: world\n", "other": "x"}})
    script = r'''
set -eu
for i in $(seq 100); do getent hosts b.sub.$NS.svc >/dev/null && break; sleep 0.05; done
echo "peer $(getent hosts b.sub.$NS.svc.cluster.local | cut -d' ' -f1)"
echo "me $(getent hosts a.sub | cut -d' ' -f1) $POD_IP"
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
    a = pod("a", script, hostname="a", subdomain="sub",
            container={"args": ["$(GREETING)", "$$(LITERAL)"], "env": env, "volumeMounts": mounts}, **vols)
    b = pod("b", "sleep 30", hostname="b", subdomain="sub")
    await kube.put_object(PODS, b)
    await kube.put_object(PODS, a)
    await eventually(lambda: phase(kube, "a") in ("Succeeded", "Failed"), timeout=20, what="pod a to finish")
    (inc,) = kubelet.pod_incarnations("a")
    out = inc.log_path.read_text()
    st = kube.obj(PODS, NAMESPACE, "a")["status"]
    b_ip = kube.obj(PODS, NAMESPACE, "b")["status"]["podIP"]
    assert st["phase"] == "Succeeded", out
    assert f"peer {b_ip}\n" in out and f"me {st['podIP']} {st['podIP']}\n" in out, out
    assert "host a a\n" in out and "args hi-a $(LITERAL)\n" in out, out
    assert "cfg hello: world job.yaml\n" in out and "cfg read-only\n" in out, out
    assert (inc.pod_dir / "volumes" / "empty-dir" / "data" / "file").read_text() == "kept\n"
    (shm,) = kubelet.shm_root.glob("*-shm")
    assert (shm / "file").read_text() == "in-memory\n" and not os.path.exists("/dev/shm/file")
    term = st["containerStatuses"][0]["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (0, "Completed")
    assert json.loads(term["message"]) == inc.final_report() == {"counts": {"env_frames_total": 7}}
    assert st["podIP"] != b_ip and st["podIP"].startswith("127.")
    await kube.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/b")
    await eventually(lambda: kube.obj(PODS, NAMESPACE, "b") is None and b_ip not in kubelet.dns.content,
                     timeout=10, what="pod b gone, with its DNS records")


async def test_restart_policies_back_off_and_last_state(node):
    kube, kubelet, _ = node
    script = ('n=$(cat /data/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /data/n; '
              'echo "run $n" > /dev/termination-log; [ $n -ge 3 ]')
    await kube.put_object(PODS, pod("flaky", script, "OnFailure", volumes=[{"name": "data", "emptyDir": {}}],
                                    container={"volumeMounts": [{"name": "data", "mountPath": "/data"}]}))
    await kube.put_object(PODS, pod("broken", "exit 3", "Never"))
    await kube.put_object(PODS, pod("always", "exit 0", "Always"))
    await eventually(lambda: phase(kube, "flaky") == "Succeeded", timeout=20, what="flaky to succeed")
    cs = cstatus(kube, "flaky")
    assert cs["restartCount"] == 2  # the emptyDir outlived the container restarts
    assert cs["state"]["terminated"]["message"] == "run 3\n"
    assert (cs["lastState"]["terminated"]["exitCode"], cs["lastState"]["terminated"]["message"]) == (1, "run 2\n")
    assert [i.termination_message() for i in kubelet.pod_incarnations("flaky")] == ["run 1\n", "run 2\n", "run 3\n"]
    await eventually(lambda: phase(kube, "broken") == "Failed", timeout=10, what="broken to fail")
    assert cstatus(kube, "broken")["state"]["terminated"]["exitCode"] == 3
    assert len(kubelet.pod_incarnations("broken")) == 1
    await eventually(lambda: cstatus(kube, "always")["restartCount"] >= 2, timeout=10, what="restarts")
    assert phase(kube, "always") == "Running"
    assert any(e[2] == "BackOff" for e in kubelet.events if e[1].endswith("/always"))


async def test_readiness_probe_and_graceful_deletion(node):
    kube, kubelet, _ = node
    server = [sys.executable, "-c", "import http.server, os, time; time.sleep(0.5); http.server.HTTPServer("
              "(os.environ['POD_IP'], 8080), http.server.SimpleHTTPRequestHandler).serve_forever()"]
    probe = {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 10, "failureThreshold": 3}
    await kube.put_object(PODS, pod("web", "", "Always", container={
        "command": server, "ports": [{"name": "http", "containerPort": 8080}], "readinessProbe": probe,
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}))
    stubborn = pod("stubborn", "trap '' TERM; sleep 300 & wait; wait", "Always")
    stubborn["spec"]["terminationGracePeriodSeconds"] = 1
    await kube.put_object(PODS, stubborn)
    ready = lambda name: any(c["type"] == "Ready" and c["status"] == "True"  # noqa: E731
                             for c in kube.obj(PODS, NAMESPACE, name)["status"].get("conditions", []))
    await eventually(lambda: phase(kube, "web") == "Running", timeout=10)
    assert not ready("web")  # the server sleeps before it listens
    await eventually(lambda: ready("web"), timeout=10, what="web ready")
    assert cstatus(kube, "web")["ready"] is True
    await eventually(lambda: ready("stubborn"), timeout=10, what="stubborn ready (no probe)")

    code, body = await kube.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/web")
    assert code == 200 and body["metadata"]["deletionGracePeriodSeconds"] == 30
    code, body = await kube.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/stubborn")
    assert body["metadata"]["deletionGracePeriodSeconds"] == 1
    await eventually(lambda: not kube.live(PODS), timeout=15, what="both pods removed")
    (web,), (stub,) = kubelet.pod_incarnations("web"), kubelet.pod_incarnations("stubborn")
    assert web.signals == ["SIGTERM"] and web.exit_code == 128 + 15
    assert stub.signals == ["SIGTERM", "SIGKILL"] and stub.exit_code == 128 + 9
    assert not kubelet.leftover_processes()  # the background `sleep` went with the container's group


async def test_statefulset_pods_scale_recreate_and_garbage_collection(node):
    kube, kubelet, ctl = node
    tmpl = pod("x", "trap 'exit 0' TERM; while :; do sleep 0.1; done", "Always")
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "web", "namespace": NAMESPACE},
           "spec": {"replicas": 3, "serviceName": "websvc", "podManagementPolicy": "Parallel",
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}}, "spec": tmpl["spec"]}}}
    owner = await kube.put_object(STS, sts)
    status = lambda: kube.obj(STS, NAMESPACE, "web").get("status") or {}  # noqa: E731
    await eventually(lambda: status().get("readyReplicas") == 3, timeout=15, what="3 ready replicas")
    pods = {p["metadata"]["name"]: p for p in kube.live(PODS)}
    assert sorted(pods) == ["web-0", "web-1", "web-2"]
    for name, p in pods.items():
        assert (p["spec"]["hostname"], p["spec"]["subdomain"]) == (name, "websvc")
        assert p["metadata"]["labels"]["app"] == "web"
        assert p["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] == name
        (ref,) = p["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["uid"], ref["controller"]) == ("StatefulSet", owner["metadata"]["uid"], True)

    await kube.api("PATCH", f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets/web", {"spec": {"replicas": 1}})
    await eventually(lambda: [p["metadata"]["name"] for p in kube.live(PODS)] == ["web-0"]
                     and status().get("replicas") == 1, timeout=15, what="scaled down to web-0")
    assert ctl.deleted == ["web-2", "web-1"]
    assert all(i.signals == ["SIGTERM"] and i.exit_code == 0 for i in kubelet.pod_incarnations("web-2"))

    old_uid = pods["web-0"]["metadata"]["uid"]
    await kube.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/web-0")
    await eventually(lambda: (p := kube.obj(PODS, NAMESPACE, "web-0")) and p["metadata"]["uid"] != old_uid
                     and (p.get("status") or {}).get("phase") == "Running", timeout=15, what="web-0 again")
    assert ctl.created.count("web-0") == 2

    await kube.api("DELETE", f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets/web")
    await eventually(lambda: not kube.live(PODS) and not kubelet.running(), timeout=15,
                     what="garbage collection of the pods")
    assert all(i.signals == ["SIGTERM"] for i in kubelet.pod_incarnations("web-0"))
