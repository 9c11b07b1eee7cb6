"""Child manifests of a TianJiJob (pure functions, no API server)."""
from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

import kopf
import kubernetes_validate
import pytest
import yaml

from kube import pod_security
from tianji.cli import build_parser
from tianji.control.contracts.launch import torch_threads
from tianji.control.planner.plan import resolve
from tianji.control.spec import SpecError, parse_job
from tianji_operator.children import builders as b
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
        ("ConfigMap", "cp-job"), ("Service", "cp"), ("NetworkPolicy", "cp"),
        *(("Secret", f"cp-curve-{r}") for r in ("learner", "buffer", "actor", "evaluator")),
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
            if not resolved.spec.network.host_network:  # else per pod: test_host_network_ports_never_collide
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


HOSTNET = {"network": {"hostNetwork": True}, "topology": {"groups": 3, "actors": 4, "buffers": 2, "learners": 2}}


def test_host_network_ports_never_collide():
    """Under hostNetwork every pod binds on its node's IP: any two pods that may share a node
    (other groups, other indices, other roles) have disjoint ports; the addresses the workers
    compute (tianji.control.contracts.addressing, from the env the pods get) are the pods' ports."""
    from tianji.control.contracts.addressing import Addresses

    _, _, resolved, objs = _children(HOSTNET)
    taken: dict[int, str] = {}
    for (kind, name), o in objs.items():
        if kind not in ("Pod", "StatefulSet"):
            continue
        spec = o["spec"]["template"]["spec"] if kind == "StatefulSet" else o["spec"]
        c = spec["containers"][0]
        for p in c["ports"]:
            assert p["containerPort"] not in taken, (name, p, taken.get(p["containerPort"]))
            taken[p["containerPort"]] = f"{name}/{p['name']}"
        a = build_parser().parse_args([*c["command"][1:], *c["args"]])
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert a.metrics_port == ports["metrics"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        addrs = Addresses("cp", resolved.spec.network.base_port, None, "ns", "10.0.0.1",
                          int(env["TIANJI_HOST_PORT_SLOTS"]))
        for ch in b.ROLE_PORTS[a.role]:
            assert addrs.bind(ch, a.group, int(a.index)) == f"tcp://10.0.0.1:{ports[ch]}"
            assert addrs.connect(ch, a.group, int(a.index)).endswith(f".cp.ns.svc:{ports[ch]}")
    assert len(taken) == 3 * (2 * 3 + 2 * 3 + 1)  # buffers 3 ports, learners 3, one actor set per group


def test_host_network_refuses_overlapping_or_out_of_range_ports():
    with pytest.raises(SpecError, match="overlap: move network.metricsPort"):
        _job({**HOSTNET, "network": {"hostNetwork": True, "basePort": 9000, "metricsPort": 9020}})
    with pytest.raises(SpecError, match="beyond 65535"):
        _job({"network": {"hostNetwork": True, "basePort": 65000, "metricsPort": 9090},
              "topology": {"groups": 64, "actors": 8, "buffers": 8, "learners": 1}})
    _job({**HOSTNET, "network": {"hostNetwork": True, "basePort": 9000, "metricsPort": 9030}})  # fits


def test_actor_index_comes_from_the_pod_index_label_never_the_hostname():
    from tianji.control.contracts.addressing import auto_index

    _, _, _, objs = _children(HOSTNET)
    c = objs["StatefulSet", "cp-actor-1"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    index_from = env["TIANJI_INDEX"]["valueFrom"]
    assert index_from["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    assert env["TIANJI_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    node = {"HOSTNAME": "gpu-node-17"}  # hostNetwork: HOSTNAME is the node's name
    assert auto_index({**node, "TIANJI_INDEX": "3", "TIANJI_POD_NAME": "cp-actor-1-3"}) == 3
    assert auto_index({**node, "TIANJI_INDEX": "", "TIANJI_POD_NAME": "cp-actor-1-5"}) == 5  # label absent (< 1.28)
    with pytest.raises(ValueError, match="TIANJI_INDEX"):
        auto_index(node)


def test_requests_and_limits_come_from_the_plan():
    job, plan, resolved, objs = _children(VARIANTS["auto"])
    assert resolved.spec.topology.auto is False
    assert resolved.spec.topology.actors == plan.actors and resolved.spec.topology.groups == plan.groups
    for (kind, _name), obj in objs.items():
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
        assert "add" not in c["securityContext"]["capabilities"]
        assert set(c["resources"]["limits"]) == {"cpu", "memory"}


def _pod_specs(objs: dict) -> dict:
    return {name: (o["spec"]["template"]["spec"] if kind == "StatefulSet" else o["spec"])
            for (kind, name), o in objs.items() if kind in ("Pod", "StatefulSet")}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_pod_meets_pod_security_restricted_unless_host_network_or_rdma(variant):
    """The restricted profile's rules (tests/kube/pod_security.py, after the Pod Security
    Standards page): every generated pod passes them, but host networking / RDMA pods, which
    break exactly the host-namespace and capability rules (they need a privileged namespace)."""
    _, _, resolved, objs = _children(VARIANTS[variant])
    net = resolved.spec.network
    for name, spec in _pod_specs(objs).items():
        problems = pod_security.violations(spec, "restricted")
        expected = []
        if net.host_network:
            expected.append("host namespaces (hostNetwork=true)")
        if net.rdma:
            expected += ['non-default capabilities (container "worker" must not include "IPC_LOCK" in '
                         'securityContext.capabilities.add)',
                         'unrestricted capabilities (container "worker" must not include "IPC_LOCK" in '
                         'securityContext.capabilities.add)']
        assert problems == expected, name


def test_the_root_filesystem_is_read_only_with_scratch_on_an_emptydir():
    _, _, _, objs = _children()
    for name, spec in _pod_specs(objs).items():
        c = spec["containers"][0]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert spec["securityContext"]["runAsUser"] == b.WORKER_UID and spec["securityContext"]["runAsNonRoot"]
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        vols = {v["name"]: v for v in spec["volumes"]}
        for path in ("/tmp", "/var/lib/tianji", "/dev/shm"):  # every place the worker writes
            assert "emptyDir" in vols[mounts[path]], (name, path)
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["HOME"] == env["TMPDIR"] == "/tmp"


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


# ----------------------------------------------------------------- scheduling overlays
OVERLAY = {
    "all": {"nodeSelector": {"pool": "rl", "zone": "a"}, "priorityClassName": "rl-batch",
            "imagePullSecrets": ["registry-creds"], "env": [{"name": "WANDB_MODE", "value": "offline"}],
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "rl", "effect": "NoSchedule"}],
            "volumes": [{"name": "datasets", "persistentVolumeClaim": {"claimName": "atari-roms", "readOnly": True}}],
            "volumeMounts": [{"name": "datasets", "mountPath": "/data", "readOnly": True}]},
    "learner": {"nodeSelector": {"pool": "a100"}, "serviceAccountName": "rl-learner",
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}]}}},
                "env": [{"name": "WANDB_MODE", "value": "online"},
                        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]},
}
GPU_POOL = {"resources": {"gpus": 1, "learner": {"gpu": 1, "cpu": 2, "memory": "8Gi"}}, "pods": OVERLAY}


def test_pod_overlays_per_role_over_all():
    _, _, _, objs = _children(GPU_POOL)
    learner = objs["Pod", "cp-learner-0-0"]["spec"]
    actor = objs["StatefulSet", "cp-actor-0"]["spec"]["template"]["spec"]
    assert learner["nodeSelector"] == {"pool": "a100", "zone": "a"}
    assert actor["nodeSelector"] == {"pool": "rl", "zone": "a"}
    assert learner["priorityClassName"] == actor["priorityClassName"] == "rl-batch"
    assert learner["imagePullSecrets"] == [{"name": "registry-creds"}]
    assert learner["serviceAccountName"] == "rl-learner" and "serviceAccountName" not in actor
    assert "affinity" in learner and "affinity" not in actor
    env = {e["name"]: e for e in learner["containers"][0]["env"]}
    assert env["WANDB_MODE"]["value"] == "online"
    assert env["NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert {e["name"]: e.get("value") for e in actor["containers"][0]["env"]}["WANDB_MODE"] == "offline"
    assert {"name": "datasets", "mountPath": "/data", "readOnly": True} in learner["containers"][0]["volumeMounts"]
    assert learner["volumes"][-1]["persistentVolumeClaim"]["claimName"] == "atari-roms"
    for obj in objs.values():
        kubernetes_validate.validate(obj, "1.33.0", strict=True)
        spec = obj["spec"]["template"]["spec"] if obj["kind"] == "StatefulSet" else obj.get("spec", {})
        if "containers" in spec:
            assert pod_security.violations(spec, "restricted") == []


def test_gpu_learners_tolerate_tainted_gpu_pools():
    _, _, _, objs = _children(GPU_POOL)
    learner = objs["Pod", "cp-learner-0-0"]["spec"]
    assert learner["tolerations"] == [b.GPU_TOLERATION, OVERLAY["all"]["tolerations"][0]]
    buffer = objs["Pod", "cp-buffer-0-0"]["spec"]
    assert b.GPU_TOLERATION not in buffer["tolerations"]  # no GPU requested, no GPU node needed
    _, _, _, plain = _children()
    assert "tolerations" not in plain["Pod", "cp-learner-0-0"]["spec"]


def test_cluster_defaults_lie_beneath_the_jobs_overlay():
    from tianji.control.spec import PodOverlay
    from tianji_operator.config import OperatorConfig

    cfg = OperatorConfig.from_env({"TIANJI_WORKER_DEFAULTS": '{"priorityClassName": "cluster-default", '
                                   '"nodeSelector": {"zone": "b", "arch": "amd64"}, "imagePullSecrets": ["mirror"]}'})
    assert isinstance(cfg.worker_defaults, PodOverlay)
    job = _job(GPU_POOL)
    resolved, _ = resolve(job)
    objs = {o["metadata"]["name"]: o for o in b.children(resolved, job.spec, {}, scrapers=[], command=CMD,
                                                         defaults=cfg.worker_defaults)}
    learner = objs["cp-learner-0-0"]["spec"]
    assert learner["nodeSelector"] == {"zone": "a", "arch": "amd64", "pool": "a100"}
    assert learner["priorityClassName"] == "rl-batch"  # the job's wins
    assert learner["imagePullSecrets"] == [{"name": "mirror"}, {"name": "registry-creds"}]


@pytest.mark.parametrize("pods, where", [
    ({"all": {"env": [{"name": "TIANJI_INDEX", "value": "3"}]}}, "TIANJI_* variables are set by the operator"),
    ({"learner": {"volumes": [{"name": "state", "emptyDir": {}}]}}, "volume name 'state' is the operator's"),
    ({"actor": {"volumeMounts": [{"name": "x", "mountPath": "/tmp/"}]}}, "mountPath '/tmp/' is the operator's"),
    ({"buffer": {"tolerations": [{"operator": "Sometimes"}]}}, "pods.buffer.tolerations[0].operator"),
])
def test_overlays_may_not_take_what_the_operator_sets(pods, where):
    with pytest.raises(SpecError, match=where.replace("[", r"\[").replace("]", r"\]").replace("*", r"\*")):
        _job({"pods": pods})


# ----------------------------------------------------------------- checkpoints
def test_learners_checkpoint_onto_a_claim_the_operator_creates():
    _, _, _, objs = _children({"checkpoint": {"size": "20Gi", "storageClassName": "fast",
                                              "accessMode": "ReadWriteMany"},
                               "topology": {"groups": 2}})
    pvc = objs["PersistentVolumeClaim", "cp-checkpoints"]
    kubernetes_validate.validate(pvc, "1.33.0", strict=True)
    assert pvc["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "20Gi"}},
                           "storageClassName": "fast"}
    for name, spec in _pod_specs(objs).items():
        state = next(v for v in spec["volumes"] if v["name"] == "state")
        if "learner" in name:
            assert state == {"name": "state", "persistentVolumeClaim": {"claimName": "cp-checkpoints"}}
        else:
            assert state == {"name": "state", "emptyDir": {}}
        assert pod_security.violations(spec, "restricted") == []
    assert list(objs).index(("PersistentVolumeClaim", "cp-checkpoints")) < list(objs).index(("Pod", "cp-learner-0-0"))


def test_replay_snapshots_put_buffers_on_the_checkpoint_claim_too():
    _, _, _, objs = _children({"algorithm": {"name": "dqn"}, "topology": {"buffers": 2},
                               "checkpoint": {"size": "20Gi", "replaySnapshot": True}})
    specs = _pod_specs(objs)
    assert any("buffer" in n for n in specs)
    for name, spec in specs.items():
        state = next(v for v in spec["volumes"] if v["name"] == "state")
        if "learner" in name or "buffer" in name:
            assert state == {"name": "state", "persistentVolumeClaim": {"claimName": "cp-checkpoints"}}, name
        else:
            assert state == {"name": "state", "emptyDir": {}}, name


def test_learners_checkpoint_onto_a_named_claim():
    _, _, _, objs = _children({"checkpoint": {"persistentVolumeClaim": "team-ckpt"}})
    assert not [k for k in objs if k[0] == "PersistentVolumeClaim"]
    learner = objs["Pod", "cp-learner-0-0"]["spec"]
    assert {"name": "state", "persistentVolumeClaim": {"claimName": "team-ckpt"}} in learner["volumes"]
    _, _, _, plain = _children()
    assert {"name": "state", "emptyDir": {}} in plain["Pod", "cp-learner-0-0"]["spec"]["volumes"]


def test_by_default_each_learner_pod_gets_its_own_claim():
    """The plan's stateVolume "claims" (operator statevolume.py: the cluster has a default StorageClass):
    one ReadWriteOnce claim per learner pod (learners on different nodes never share one), and per
    buffer pod with replaySnapshot, sized like its memory; a claim in the spec wins."""
    spec = {"algorithm": {"name": "dqn"}, "topology": {"groups": 2, "buffers": 2},
            "checkpoint": {"replaySnapshot": True}, "resources": {"buffer": {"memory": "3Gi"}}}
    job = _job(spec)
    resolved, _ = resolve(job)
    plan = {"stateVolume": {"mode": "claims", "storageClass": "standard"}}
    objs = {(o["kind"], o["metadata"]["name"]): o
            for o in b.children(resolved, job.spec, {}, scrapers=DEFAULT_SCRAPERS, command=CMD, plan=plan)}
    claims = {n: o for (k, n), o in objs.items() if k == "PersistentVolumeClaim"}
    pods = [n for (k, n) in objs if k == "Pod"]
    assert set(claims) == {f"{p}-state" for p in pods}  # 2 learners, 4 buffers
    for name, pvc in claims.items():
        kubernetes_validate.validate(pvc, "1.33.0", strict=True)
        size = "1Gi" if "learner" in name else "3Gi"
        assert pvc["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    for name, spec_ in _pod_specs(objs).items():
        state = next(v for v in spec_["volumes"] if v["name"] == "state")
        want = {"persistentVolumeClaim": {"claimName": f"{name}-state"}} if name in pods else {"emptyDir": {}}
        assert state == {"name": "state", **want}, name
    for override in ({"persistentVolumeClaim": "team"}, {"ephemeral": True}):
        job = _job({"checkpoint": override})
        resolved, _ = resolve(job)
        objs = b.children(resolved, job.spec, {}, scrapers=DEFAULT_SCRAPERS, command=CMD, plan=plan)
        assert not [o for o in objs if o["kind"] == "PersistentVolumeClaim"], override


@pytest.mark.parametrize("ckpt, where", [
    ({"ephemeral": True, "size": "1Gi"}, "set one or the other"),
    ({"persistentVolumeClaim": "a", "size": "1Gi"}, "set one or the other"),
    ({"storageClassName": "fast"}, "storageClassName needs size"),
    ({"size": "0"}, "positive size"),
])
def test_checkpoint_volume_settings_are_checked(ckpt, where):
    with pytest.raises(SpecError, match=where):
        _job({"checkpoint": ckpt})


def test_each_role_gets_its_own_curve_secret_mounted_only_into_that_roles_pods():
    """A learner, buffer or evaluator pod holds its role's keyring (a working key pair that names
    every role's public key), mounted only into its role's pods; learners and buffers also hold
    the actor seed; the actor Secret is an issuer: the seed and the public keys, no key pair."""
    import zmq

    from tianji.runtime.security import read_keyring

    _, _, _, objs = _children(VARIANTS["groups"])
    rings = {}
    for role in ("learner", "buffer", "evaluator"):
        keys = json.loads(objs[("Secret", f"cp-curve-{role}")]["stringData"]["curve.json"])
        assert keys["identity"] == role and zmq.curve_public(keys["secret"].encode()) == keys["public"].encode()
        rings[role] = keys
    assert len({k["secret"] for k in rings.values()}) == 3  # three different secret keys
    assert all(k["peers"] == {r: x["public"] for r, x in rings.items()} for k in rings.values())
    issuer = json.loads(objs[("Secret", "cp-curve-actor")]["stringData"]["issuer.json"])
    assert set(issuer) == {"actorSeed", "peers"} and issuer["peers"] == rings["learner"]["peers"]
    assert rings["learner"]["actorSeed"] == rings["buffer"]["actorSeed"] == issuer["actorSeed"]
    assert "actorSeed" not in rings["evaluator"]  # it runs user env code and admits no actor
    mounted = set()
    for (kind, _), obj in objs.items():
        if kind != "Pod":
            continue
        pod, role = obj["spec"], obj["metadata"]["labels"]["tianji.dev/role"]
        vols = {v["name"]: v for v in pod["volumes"]}
        assert vols["curve"]["secret"]["secretName"] == f"cp-curve-{role}"
        assert vols["curve"]["secret"]["defaultMode"] == 0o400
        assert [v for v in pod["volumes"] if "secret" in v] == [vols["curve"]]  # no other role's Secret
        assert "initContainers" not in pod
        mounted.add(role)
        c = pod["containers"][0]
        assert {"name": "curve", "mountPath": "/etc/tianji-curve", "readOnly": True} in c["volumeMounts"]
        assert {"name": "TIANJI_CURVE_KEYS", "value": "/etc/tianji-curve/curve.json"} in c["env"]
    assert mounted == {"learner", "buffer"}
    path = Path(tempfile.mkdtemp()) / "curve.json"  # the worker reads the operator's format
    path.write_text(objs[("Secret", "cp-curve-learner")]["stringData"]["curve.json"])
    ring = read_keyring(path)
    assert ring.identity == "learner" and ring.public_of("buffer-1-0") == rings["buffer"]["public"].encode()
    assert ring.actor_seed == bytes.fromhex(issuer["actorSeed"])


def _mounted_text(objs: dict, pod: dict, container: dict) -> str:
    """Everything a container can read from its volumes that the API holds (Secrets, ConfigMaps);
    an emptyDir holds only what the pod's own containers write."""
    vols = {v["name"]: v for v in pod["volumes"]}
    out = []
    for m in container["volumeMounts"]:
        v = vols[m["name"]]
        assert not {"hostPath", "projected", "csi"} & set(v), v
        if "secret" in v:
            out.append(json.dumps(objs[("Secret", v["secret"]["secretName"])]))
        if "configMap" in v:
            out.append(json.dumps(objs[("ConfigMap", v["configMap"]["name"])]))
    return "\n".join(out)


@pytest.mark.parametrize("variant", ["groups", "gpu-rdma-hostnet"])
def test_an_actor_pod_can_read_only_its_own_key(variant, tmp_path, monkeypatch):
    """The actor worker (user env code) mounts no key material at all: its init container alone
    mounts the issuer and derives the pod's own keyring, which a buffer admits as that actor only;
    a neighbour's pod derives a different key. The Secrets' text never reaches the worker."""
    from tianji.cli import main
    from tianji.runtime import security

    _, _, _, objs = _children(VARIANTS[variant])
    secrets = [o for (k, _), o in objs.items() if k == "Secret" and "curve" in o["metadata"]["name"]]
    secret_values = [v for s in secrets for doc in s["stringData"].values() for k, v in json.loads(doc).items()
                     if k in ("secret", "actorSeed")]
    assert len(secret_values) == 6  # three role keys, the seed in two keyrings and in the issuer
    pod = objs[("StatefulSet", "cp-actor-0")]["spec"]["template"]["spec"]
    worker = pod["containers"][0]
    assert not [v for v in secret_values if v in _mounted_text(objs, pod, worker)]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["curve"] == {"name": "curve", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
    [init] = pod["initContainers"]
    assert init["name"] == "actor-key" and init["command"] == [*CMD[:-1], "actor-key"]
    assert init["securityContext"] == {**worker["securityContext"], "capabilities": {"drop": ["ALL"]}}
    assert "cp-curve-actor" in _mounted_text(objs, pod, init)
    issuer = tmp_path / "issuer.json"
    issuer.write_text(objs[("Secret", "cp-curve-actor")]["stringData"]["issuer.json"])
    args = init["args"]
    rings = {}
    for ordinal in (0, 1):  # what the init containers of pods cp-actor-0-0 and -1 write
        out = tmp_path / f"{ordinal}.json"
        monkeypatch.setenv("TIANJI_INDEX", str(ordinal))
        assert main(["actor-key", *args[:args.index("--issuer") + 1], str(issuer), "--out", str(out)]) == 0
        assert oct(out.stat().st_mode & 0o777) == "0o400"
        rings[ordinal] = security.read_keyring(out)
        assert rings[ordinal].actor_seed is None and "actorSeed" not in out.read_text()
    assert [r.identity for r in rings.values()] == ["actor-0-0", "actor-0-1"]
    assert rings[0].keys.secret != rings[1].keys.secret
    buffer_ring = security.parse_keyring(objs[("Secret", "cp-curve-buffer")]["stringData"]["curve.json"], "buffer")
    ids = security._Identities(buffer_ring, group=0)
    assert ids.callback("", rings[1].keys.public) and ids.by_key[rings[1].keys.public] == "actor-0-1"
    assert not security._Identities(buffer_ring, group=1).callback("", rings[1].keys.public)  # another group's
    assert not security.covers("actor-0-0", "actor-0-1") and security.exclusive(buffer_ring, "actor-0-1")
