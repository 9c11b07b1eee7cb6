"""Child manifests of a TianJiJob (pure functions, no API server)."""
from __future__ import annotations

import copy

import kopf
import kubernetes_validate
import pytest
import yaml

from tianji.cli import build_parser
from tianji.control.launch import torch_threads
from tianji.control.plan import resolve
from tianji.control.spec import parse_job
from tianji_operator import builders as b
from tianji_operator.config import DEFAULT_SCRAPERS

OWNER = {"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob",
         "metadata": {"name": "cp", "namespace": "ns", "uid": "0b7c5e5c-1111-2222-3333-444455556666"}}
CMD = ["tianji", "worker"]


def _job(spec: dict | None = None, name: str = "cp"):
    return parse_job({"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob",
                      "metadata": {"name": name, "namespace": "ns"}, "spec": spec or {}})


def _children(spec: dict | None = None, actors: dict | None = None, adopt: bool = True):
    job = _job(spec)
    resolved, plan = resolve(job)
    objs = b.children(resolved, job.spec, actors or {}, scrapers=DEFAULT_SCRAPERS, command=CMD)
    if adopt:
        for o in objs:
            kopf.adopt(o, owner=copy.deepcopy(OWNER), nested=("spec.template",) if o["kind"] == "StatefulSet" else None)
    return job, plan, resolved, {(o["kind"], o["metadata"]["name"]): o for o in objs}


VARIANTS = {
    "default": {},
    "auto": {"topology": "auto", "resources": {"cpus": 12}},
    "groups": {"topology": {"groups": 2, "actors": 4, "buffers": 2, "learners": 1}},
    "gpu-rdma-hostnet": {"network": {"hostNetwork": True, "rdma": "rdma/hca_shared_devices_a"},
                         "resources": {"gpus": 2, "learner": {"gpu": 1, "cpu": 2, "memory": "8Gi"}}},
    "dqn": {"algorithm": {"name": "dqn"}, "network": {"basePort": 7000, "metricsPort": 9100}},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_child_validates_strictly(variant):
    _, _, _, objs = _children(VARIANTS[variant])
    for obj in objs.values():
        kubernetes_validate.validate(obj, "1.33.0", strict=True)


def test_names_kinds_and_owner_references():
    _, _, _, objs = _children(VARIANTS["groups"])
    assert set(objs) == {
        ("ConfigMap", "cp-job"), ("Service", "cp"), ("NetworkPolicy", "cp"), ("Secret", "cp-curve"),
        ("Pod", "cp-learner-0-0"), ("Pod", "cp-buffer-0-0"), ("Pod", "cp-buffer-0-1"), ("StatefulSet", "cp-actor-0"),
        ("Pod", "cp-learner-1-0"), ("Pod", "cp-buffer-1-0"), ("Pod", "cp-buffer-1-1"), ("StatefulSet", "cp-actor-1"),
    }
    for obj in objs.values():
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["uid"] == OWNER["metadata"]["uid"] and ref["controller"] and ref["kind"] == "TianJiJob"
        assert obj["metadata"]["namespace"] == "ns"
        assert obj["metadata"]["labels"][b.LABEL_JOB] == "cp"


def test_labels_identify_role_and_group():
    _, _, _, objs = _children(VARIANTS["groups"])
    pod = objs["Pod", "cp-buffer-1-1"]
    assert {b.LABEL_JOB: "cp", b.LABEL_ROLE: "buffer", b.LABEL_GROUP: "1",
            b.LABEL_INDEX: "1"}.items() <= pod["metadata"]["labels"].items()
    sts = objs["StatefulSet", "cp-actor-1"]
    sel = sts["spec"]["selector"]["matchLabels"]
    assert sel == {b.LABEL_JOB: "cp", b.LABEL_ROLE: "actor", b.LABEL_GROUP: "1"}
    assert sel.items() <= sts["spec"]["template"]["metadata"]["labels"].items()


def test_learner_and_buffer_pods_have_stable_dns_names():
    _, _, _, objs = _children()
    svc = objs["Service", "cp"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    assert svc["spec"]["selector"] == {b.LABEL_JOB: "cp"}
    for name in ("cp-learner-0-0", "cp-buffer-0-0"):
        spec = objs["Pod", name]["spec"]
        assert spec["hostname"] == name and spec["subdomain"] == "cp"
        assert spec["restartPolicy"] == "OnFailure"


def test_actor_statefulset_is_parallel_and_indexes_by_ordinal():
    _, _, _, objs = _children(actors={0: 5})
    sts = objs["StatefulSet", "cp-actor-0"]["spec"]
    assert sts["podManagementPolicy"] == "Parallel" and sts["serviceName"] == "cp" and sts["replicas"] == 5
    args = sts["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--index") + 1] == "auto"
    assert sts["template"]["spec"]["restartPolicy"] == "Always"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_commands_follow_the_worker_cli(variant):
    _, _, resolved, objs = _children(VARIANTS[variant])
    for obj in objs.values():
        spec = obj["spec"]["template"]["spec"] if obj["kind"] == "StatefulSet" else obj.get("spec", {})
        for c in spec.get("containers", []):
            assert c["command"] == CMD
            a = build_parser().parse_args([*c["command"][1:], *c["args"]])
            assert a.cmd == "worker" and a.job == "/etc/tianji/job.yaml" and a.run_dir is None
            assert a.metrics_port == resolved.spec.network.metrics_port
            assert a.role == obj["metadata"]["labels"][b.LABEL_ROLE]
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            assert ports["metrics"] == a.metrics_port
            env = {e["name"]: e for e in c["env"]}
            assert env["TIANJI_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
            assert env["TIANJI_POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
            assert env["OMP_NUM_THREADS"]["value"] == str(torch_threads(resolved, a.role))


def test_data_ports_follow_addressing():
    _, _, _, objs = _children(VARIANTS["dqn"])
    ports = lambda name: {p["name"]: p["containerPort"] for p in objs["Pod", name]["spec"]["containers"][0]["ports"]}
    assert ports("cp-buffer-0-0") == {"fragments": 7000, "credits": 7001, "metrics": 9100}
    assert ports("cp-learner-0-0") == {"batches": 7002, "params": 7003, "metrics": 9100}


def test_requests_and_limits_come_from_the_plan():
    job, plan, resolved, objs = _children(VARIANTS["auto"])
    assert resolved.spec.topology.auto is False
    assert resolved.spec.topology.actors == plan.actors and resolved.spec.topology.groups == plan.groups
    for (kind, name), obj in objs.items():
        if kind == "ConfigMap" or kind not in ("Pod", "StatefulSet"):
            continue
        spec = obj["spec"]["template"]["spec"] if kind == "StatefulSet" else obj["spec"]
        role = obj["metadata"]["labels"][b.LABEL_ROLE]
        rp = getattr(plan, role)
        res = spec["containers"][0]["resources"]
        assert res["requests"] == res["limits"]
        assert res["requests"]["cpu"] == b.cpu_quantity(rp.cpu) and res["requests"]["memory"] == rp.memory
        assert ("nvidia.com/gpu" in res["requests"]) == bool(rp.gpu)
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        assert env["OMP_NUM_THREADS"] == str(rp.threads)


def test_gpu_rdma_and_host_network():
    _, _, _, objs = _children(VARIANTS["gpu-rdma-hostnet"])
    learner = objs["Pod", "cp-learner-0-0"]["spec"]
    c = learner["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["resources"]["limits"]["rdma/hca_shared_devices_a"] == "1"
    assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert learner["hostNetwork"] is True and learner["dnsPolicy"] == "ClusterFirstWithHostNet"
    actor = objs["StatefulSet", "cp-actor-0"]["spec"]["template"]["spec"]
    assert actor["hostNetwork"] is True and actor["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert "nvidia.com/gpu" not in actor["containers"][0]["resources"]["limits"]
    assert actor["containers"][0]["resources"]["limits"]["rdma/hca_shared_devices_a"] == "1"


def test_defaults_have_no_host_network_rdma_or_gpu():
    _, _, _, objs = _children()
    for obj in objs.values():
        spec = obj["spec"]["template"]["spec"] if obj["kind"] == "StatefulSet" else obj.get("spec", {})
        if "containers" not in spec:
            continue
        assert "hostNetwork" not in spec and "dnsPolicy" not in spec
        c = spec["containers"][0]
        assert "securityContext" not in c
        assert set(c["resources"]["limits"]) == {"cpu", "memory"}


def test_network_policy_admits_own_pods_and_scrapers_to_metrics():
    _, _, _, objs = _children()
    np = objs["NetworkPolicy", "cp"]["spec"]
    assert np["podSelector"] == {"matchLabels": {b.LABEL_JOB: "cp"}} and np["policyTypes"] == ["Ingress"]
    own, scrapers = np["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": {b.LABEL_JOB: "cp"}}}]}
    assert scrapers["ports"] == [{"protocol": "TCP", "port": "metrics"}]
    assert scrapers["from"] == DEFAULT_SCRAPERS


def test_configmap_carries_the_planned_job_and_the_applied_spec():
    job, plan, resolved, objs = _children(VARIANTS["auto"])
    cm = objs["ConfigMap", "cp-job"]
    planned = parse_job(yaml.safe_load(cm["data"]["job.yaml"]))
    assert planned.name == "cp" and planned.spec.topology.auto is False
    assert planned.spec.topology.learners == plan.learners and planned.spec.topology.buffers == plan.buffers
    assert cm["metadata"]["annotations"][b.ANNOTATION_SPEC] == b.spec_json(job.spec)
    pod = objs["Pod", "cp-learner-0-0"]["spec"]
    assert {"name": "job", "configMap": {"name": "cp-job", "items": [{"key": "job.yaml", "path": "job.yaml"}]}} \
        in pod["volumes"]


@pytest.mark.parametrize("cores, q", [(1.0, "1"), (0.5, "500m"), (2.5, "2500m"), (0.25, "250m"), (8, "8")])
def test_cpu_quantity(cores, q):
    assert b.cpu_quantity(cores) == q


def test_the_curve_secret_is_mounted_only_into_the_jobs_pods_and_holds_a_working_key_pair():
    import json

    import zmq

    _, _, _, objs = _children(VARIANTS["groups"])
    secret = objs[("Secret", "cp-curve")]
    keys = json.loads(secret["stringData"]["curve.json"])
    assert zmq.curve_public(keys["secret"].encode()) == keys["public"].encode()
    for (kind, _), obj in objs.items():
        if kind not in ("Pod", "StatefulSet"):
            continue
        pod = obj["spec"] if kind == "Pod" else obj["spec"]["template"]["spec"]
        vols = {v["name"]: v for v in pod["volumes"]}
        assert vols["curve"]["secret"]["secretName"] == "cp-curve" and vols["curve"]["secret"]["defaultMode"] == 0o400
        c = pod["containers"][0]
        assert {"name": "curve", "mountPath": "/etc/tianji-curve", "readOnly": True} in c["volumeMounts"]
        assert {"name": "TIANJI_CURVE_KEYS", "value": "/etc/tianji-curve/curve.json"} in c["env"]
