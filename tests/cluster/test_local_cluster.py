"""The local cluster itself is a Kubernetes cluster: nodes registered by the node agent and kept
alive by their Leases, the real scheduler placing pods by capacity, pods on both nodes reaching
each other by cluster DNS names, the Node authorizer confining a node to its own pods, and
`kubectl logs` through the node agents' kubelet port."""
from __future__ import annotations

import json
import ssl
import textwrap
import urllib.error
import urllib.request

import pytest

from clusterkit import get, wait_for

SERVER = textwrap.dedent("""
    import http.server, os, socket
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = (os.environ["HOSTNAME"] + " " + socket.gethostbyname(socket.gethostname())).encode()
            self.send_response(200); self.end_headers(); self.wfile.write(body)
    http.server.HTTPServer((os.environ["POD_IP"], 8080), H).serve_forever()
""")
CLIENT = textwrap.dedent("""
    import socket, sys, time, urllib.request
    name = sys.argv[1]
    for _ in range(120):
        try:
            print(socket.gethostbyname(name), urllib.request.urlopen(f"http://{name}:8080", timeout=2).read().decode())
            sys.exit(0)
        except OSError as e:
            err = e
            time.sleep(0.5)
    print("failed:", err); sys.exit(1)
""")


def pod(name: str, node: str, script: str, *args: str, hostname: str = "", restart: str = "Never") -> dict:
    spec = {"restartPolicy": restart,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "main", "image": "python", "command": ["python", "-c", script, *args],
                            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}
    if hostname:
        spec.update(hostname=hostname, subdomain="web")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}}, "spec": spec}


def apply(c, ns: str, *docs: dict) -> None:
    c.kubectl("apply", "-n", ns, "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))


def test_nodes_register_with_capacity_and_podcidrs(cluster):
    nodes = get(cluster, "nodes")["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == ["node-1", "node-2"]
    for n in nodes:
        assert n["status"]["allocatable"]["cpu"] == "4"
        assert n["spec"]["podCIDR"]  # from the controller manager's node IPAM
        ready = next(c for c in n["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"
    # Its Lease comes with its first heartbeat, after the registration made it Ready.
    lease = wait_for(lambda: get(cluster, "lease", "-n", "kube-node-lease", "node-1"), 30, "node-1's Lease")
    assert lease["spec"]["holderIdentity"] == "node-1"


def test_pods_on_two_nodes_find_each_other_by_dns(cluster, namespace):
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
           "spec": {"clusterIP": "None", "selector": {"app": "server"}, "ports": [{"port": 8080}]}}
    apply(cluster, namespace, svc, pod("server", "node-1", SERVER, hostname="server"))
    apply(cluster, namespace, pod("client", "node-2", CLIENT, f"server.web.{namespace}.svc.cluster.local"))
    done = wait_for(lambda: (p := get(cluster, "pod", "-n", namespace, "client")) and
                    p["status"].get("phase") in ("Succeeded", "Failed") and p, 120, "the client pod to finish")
    server = get(cluster, "pod", "-n", namespace, "server")
    assert server["spec"]["nodeName"] == "node-1" and done["spec"]["nodeName"] == "node-2"
    assert done["status"]["phase"] == "Succeeded", done["status"]
    # The client's log: the name resolved to the server pod's IP, and the server answered from it.
    text = cluster.kubectl("logs", "client", "-n", namespace).stdout
    ip = server["status"]["podIP"]
    assert text.split()[:3] == [ip, "server", ip], text


def test_a_pod_larger_than_any_node_stays_pending(cluster, namespace):
    big = pod("big", "node-1", "pass")
    del big["spec"]["nodeSelector"]
    big["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "64"
    apply(cluster, namespace, big)
    cond = wait_for(lambda: next((c for c in (get(cluster, "pod", "-n", namespace, "big")["status"].get("conditions")
                                              or []) if c["type"] == "PodScheduled"), None), 60, "PodScheduled")
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
    assert "Insufficient cpu" in cond["message"]


def test_a_node_may_only_read_its_own_pods_secrets(cluster, namespace):
    cluster.kubectl("create", "secret", "generic", "s", "-n", namespace, "--from-literal=k=v")
    res = cluster.kubectl("auth", "can-i", "get", "secret/s", "-n", namespace, "--as=system:node:node-1",
                          "--as-group=system:nodes", check=False)
    # the Node authorizer's own word: a node reads only what its own pods refer to
    assert res.stdout.startswith("no") and "no relationship found" in res.stdout, res
    res = cluster.kubectl("auth", "can-i", "update", "nodes/status", "--as=system:node:node-1",
                          "--as-group=system:nodes", check=False)
    assert res.stdout.strip() == "yes", res


TALKER = textwrap.dedent("""
    import sys, time
    for i in range(5):
        print("line", i, flush=True)
    time.sleep(4)
    print("done", flush=True)
""")


def test_kubectl_logs_reads_a_pod_on_its_node(cluster, namespace):
    apply(cluster, namespace, pod("talker", "node-2", TALKER))
    wait_for(lambda: (p := get(cluster, "pod", "-n", namespace, "talker")) and
             p["status"].get("phase") == "Running", 60, "the talker running")
    # -f streams while the container runs and ends when it exits, with every line
    followed = cluster.kubectl("logs", "-f", "talker", "-n", namespace, timeout=60).stdout
    assert followed.splitlines() == [f"line {i}" for i in range(5)] + ["done"], followed
    assert cluster.kubectl("logs", "--tail=2", "talker", "-n", namespace).stdout.splitlines() == ["line 4", "done"]
    res = cluster.kubectl("logs", "talker", "-c", "nope", "-n", namespace, check=False)
    assert res.returncode != 0 and "not valid for pod" in res.stderr, res


def test_the_kubelet_port_answers_only_the_api_server(cluster, namespace):
    node = next(n for n in cluster.nodes if n.name == "node-1")
    pki = cluster.cp.pki.root
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))  # even cluster-admin, directly
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"https://{node.ip}:10250/containerLogs/{namespace}/x/main", context=ctx, timeout=10)
    assert e.value.code == 403
    bare = ssl.create_default_context(cafile=str(pki / "ca.crt"))  # and no client certificate at all
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"https://{node.ip}:10250/healthz", context=bare, timeout=10)


WRITER = textwrap.dedent("""
    import os, sys
    path = "/data/note"
    if sys.argv[1] == "write":
        open(path, "w").write(os.environ["HOSTNAME"])
    else:
        print(open(path).read())
""")


def test_a_claim_of_the_default_class_follows_its_pod_to_another_node(cluster, namespace):
    """The default StorageClass (provisioner.py): a claim is bound to a new volume; what a pod on one
    node wrote there, a pod on the other node reads (as network storage lets a re-created learner
    find its checkpoints); the volume goes with its claim."""
    classes = get(cluster, "storageclass")["items"]
    assert [c["metadata"]["name"] for c in classes
            if c["metadata"].get("annotations", {}).get("storageclass.kubernetes.io/is-default-class") == "true"] \
        == ["local-shared"]
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"},
             "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}
    apply(cluster, namespace, claim)
    bound = wait_for(lambda: (c := get(cluster, "pvc", "data", "-n", namespace)) and
                     c["status"].get("phase") == "Bound" and c, 60, "the claim bound")
    pods = []
    for name, node, verb in (("writer", "node-1", "write"), ("reader", "node-2", "read")):
        p = pod(name, node, WRITER, verb)
        p["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
        p["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
        apply(cluster, namespace, p)
        done = wait_for(lambda name=name: (q := get(cluster, "pod", name, "-n", namespace)) and
                        q["status"].get("phase") in ("Succeeded", "Failed") and q, 120, f"the {name} pod to finish")
        assert done["status"]["phase"] == "Succeeded", done["status"]
        pods.append(done)
    assert cluster.kubectl("logs", "reader", "-n", namespace).stdout.strip() == "writer"
    volume = bound["spec"]["volumeName"]
    cluster.kubectl("delete", "pod", "writer", "reader", "-n", namespace)
    cluster.kubectl("delete", "pvc", "data", "-n", namespace)
    wait_for(lambda: get(cluster, "pv", volume) is None, 60, "the volume deleted with its claim")
