"""The operator (real Kopf handlers) against the Kubernetes API emulator: reconciliation,
status, restarts, invalid specs, immutable fields, completion, deletion, RBAC."""
from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from kube.operator_harness import (
    JOBS,
    NAMESPACE,
    FakeClock,
    RunningOperator,
    children,
    cond,
    eventually,
    job,
    job_manifest,
    run_pods,
    status,
)
from tianji.control.spec import parse_job
from tianji_operator import rbac
from tianji_operator.children import builders as b


@pytest.fixture
async def operator(kube):
    async with RunningOperator(kube) as op:
        yield op
    assert_rbac_covers(kube)


def assert_rbac_covers(kube) -> None:
    """Every call the operator (Kopf's and ours) made is allowed by tianji_operator.rbac.RULES."""
    calls = kube.api_calls("kopf/") | kube.api_calls("tianji-operator")
    missing = sorted(c for c in calls if not rbac.allows(*c))
    assert not missing, f"RBAC rules miss {missing}"


def events(kube, reason=None):
    return [e for e in kube.live("v1/events") if reason is None or e.get("reason") == reason]


async def created(kube, name="cartpole", n=6):
    return await eventually(lambda: len(children(kube, name)) >= n and status(kube, name).get("plan"),
                            what=f"the children of {name}")


# ----------------------------------------------------------------- create
async def test_apply_creates_the_children(kube, operator):
    await kube.create_job(job_manifest("cartpole", {"topology": {"actors": 3}}))
    await created(kube)
    owner = job(kube)
    objs = children(kube)
    assert set(objs) == {("ConfigMap", "cartpole-job"), ("Service", "cartpole"), ("NetworkPolicy", "cartpole"),
                         ("Pod", "cartpole-learner-0-0"), ("Pod", "cartpole-buffer-0-0"),
                         ("StatefulSet", "cartpole-actor-0")}
    for obj in objs.values():
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
            "TianJiJob", "cartpole", owner["metadata"]["uid"], True)
        assert obj["metadata"]["labels"][b.LABEL_JOB] == "cartpole"
        kubernetes_validate.validate(obj, "1.33.0", strict=True)
    assert objs["StatefulSet", "cartpole-actor-0"]["spec"]["replicas"] == 3

    st = status(kube)
    plan = st["plan"]
    assert st["phase"] == "Pending" and st["observedGeneration"] == 1
    assert plan["topology"] == {"groups": 1, "actors": 3, "buffers": 1, "learners": 1}
    for role in ("learner", "buffer"):
        res = objs["Pod", f"cartpole-{role}-0-0"]["spec"]["containers"][0]["resources"]
        assert res["requests"] == {"cpu": b.cpu_quantity(plan[role]["cpu"]), "memory": plan[role]["memory"]}
    assert cond(kube, "Planned")["status"] == "True" and cond(kube, "Failed")["status"] == "False"
    assert st["groups"] == [{"group": 0, "actors": {"desired": 3, "ready": 0},
                             "buffers": {"desired": 1, "ready": 0}, "learners": {"desired": 1, "ready": 0}}]
    assert owner["metadata"]["finalizers"] == ["tianji.dev/finalizer"]
    await eventually(lambda: events(kube, "Planned"), what="a Planned event")
    assert operator.metrics.value("tianji_operator_reconciles_total", handler="create", result="ok") == 1


async def test_the_configmap_holds_the_planned_job(kube, operator):
    await kube.create_job(job_manifest("cartpole", {"topology": "auto", "resources": {"cpus": 8}}))
    await created(kube)
    cm = children(kube)["ConfigMap", "cartpole-job"]
    planned = parse_job(yaml.safe_load(cm["data"]["job.yaml"]))
    plan = status(kube)["plan"]
    assert planned.spec.topology.auto is False
    planned_topology = planned.spec.topology.model_dump(exclude={"group_sync"})  # not the planner's to choose
    assert planned_topology | {"auto": False} == {"auto": False, **plan["topology"]}
    assert planned.spec.topology.group_sync.mode == "average"  # the spec's, kept through planning
    sts = children(kube)["StatefulSet", "cartpole-actor-0"]
    assert sts["spec"]["replicas"] == plan["actors"]


async def test_host_network_and_rdma_when_asked(kube, operator):
    spec = {"network": {"hostNetwork": True, "rdma": "rdma/hca_shared_devices_a"}}
    await kube.create_job(job_manifest("cartpole", spec))
    await created(kube)
    objs = children(kube)
    for pod in (objs["Pod", "cartpole-learner-0-0"]["spec"],
                objs["StatefulSet", "cartpole-actor-0"]["spec"]["template"]["spec"]):
        assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
        c = pod["containers"][0]
        assert c["resources"]["requests"]["rdma/hca_shared_devices_a"] == "1"
        assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]


async def test_pods_running_make_the_job_running(kube, operator):
    await kube.create_job(job_manifest("cartpole"))
    await created(kube)
    await run_pods(kube, "cartpole")
    await eventually(lambda: status(kube).get("phase") == "Running" and cond(kube, "Ready")["status"] == "True",
                     what="phase Running")
    st = status(kube)
    assert st["actors"] == "2/2" and st["startTime"]
    assert cond(kube, "Progressing")["reason"] == "Training"


# ----------------------------------------------------------------- restart
async def test_restarting_the_operator_creates_no_duplicates(kube):
    async with RunningOperator(kube) as first:
        await kube.create_job(job_manifest("cartpole", {"topology": {"groups": 2, "actors": 2}}))
        await created(kube, n=9)
        before = {k: o["metadata"]["uid"] for k, o in children(kube).items()}
        await run_pods(kube, "cartpole")
        await eventually(lambda: status(kube).get("phase") == "Running")
    posts_before = sum(1 for r in kube.requests if str(r.method.value) == "POST")
    async with RunningOperator(kube) as second:
        await eventually(lambda: second.metrics.value("tianji_operator_reconciles_total", handler="resume",
                                                      result="ok") == 1, what="the resume handler")
        await eventually(lambda: second.metrics.value("tianji_operator_timer_runs_total", timer="monitor") >= 2,
                         what="two monitor ticks")
    after = {k: o["metadata"]["uid"] for k, o in children(kube).items()}
    assert after == before
    assert first.metrics.value("tianji_operator_reconciles_total", handler="create", result="ok") == 1
    # The second operator created nothing: every POST it made (if any) was answered 409.
    assert second.metrics.value("tianji_operator_api_requests_total", verb="create", kind="Pod", code="201") == 0
    assert status(kube)["phase"] == "Running"
    assert_rbac_covers(kube)
    assert posts_before >= 6


async def test_a_restart_restores_a_status_that_was_never_written(kube):
    async with RunningOperator(kube):
        await kube.create_job(job_manifest("cartpole"))
        await created(kube)
        plan = status(kube)["plan"]
    await kube.set_status(JOBS, NAMESPACE, "cartpole", None)  # as if it stopped before its status write
    async with RunningOperator(kube) as second:
        await eventually(lambda: status(kube).get("plan") == plan and status(kube).get("phase") == "Pending",
                         what="the status restored from the ConfigMap")
        assert cond(kube, "Planned")["status"] == "True"
        await run_pods(kube, "cartpole")
        await eventually(lambda: status(kube).get("phase") == "Running")
    assert second.metrics.value("tianji_operator_api_requests_total", verb="create", kind="Pod", code="201") == 0


async def test_a_lost_pod_is_recreated(kube, operator):
    await kube.create_job(job_manifest("cartpole"))
    await created(kube)
    uid = children(kube)["Pod", "cartpole-buffer-0-0"]["metadata"]["uid"]
    status_code, _ = await kube.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/cartpole-buffer-0-0")
    assert status_code == 200
    pod = await eventually(lambda: children(kube).get(("Pod", "cartpole-buffer-0-0")), what="the pod back")
    assert pod["metadata"]["uid"] != uid
    await eventually(lambda: events(kube, "Recreated"), what="a Recreated event")


# ----------------------------------------------------------------- invalid specs
async def test_an_invalid_job_fails_with_the_field_path_and_no_pods(kube, operator):
    # The CRD admits it (cross-field rule); pydantic does not: buffers > actors.
    await kube.create_job(job_manifest("cartpole", {"topology": {"actors": 1, "buffers": 2}}))
    await eventually(lambda: status(kube).get("phase") == "Failed", what="phase Failed")
    failed = cond(kube, "Failed")
    assert failed["status"] == "True" and failed["reason"] == "InvalidSpec"
    assert failed["message"].startswith("spec.topology:") and "buffers (2) > actors (1)" in failed["message"]
    assert cond(kube, "Planned")["status"] == "False"
    assert children(kube) == {}
    await eventually(lambda: [e for e in events(kube, "InvalidSpec") if e["type"] == "Warning"])

    # Fixing the spec creates the job.
    await kube.patch_job("cartpole", {"spec": {"topology": {"buffers": 1}}})
    await created(kube)
    await eventually(lambda: status(kube).get("phase") == "Pending" and cond(kube, "Failed")["status"] == "False")
    assert status(kube)["observedGeneration"] == 2


async def test_a_field_of_the_other_algorithm_is_named(kube, operator):
    await kube.create_job(job_manifest("cartpole", {"algorithm": {"name": "ppo", "replayCapacity": 10}}))
    await eventually(lambda: status(kube).get("phase") == "Failed")
    assert "spec.algorithm.replayCapacity" in cond(kube, "Failed")["message"]
    assert children(kube) == {}


async def test_an_impossible_plan_fails_with_the_field_path(kube, operator):
    await kube.create_job(job_manifest("cartpole", {"topology": {"actors": 8}, "resources": {"cpus": 4}}))
    await eventually(lambda: status(kube).get("phase") == "Failed")
    failed = cond(kube, "Failed")
    assert failed["reason"] == "PlanFailed" and failed["message"].startswith("spec.topology:")
    assert "resources.cpus" in failed["message"]
    assert children(kube) == {}


# ----------------------------------------------------------------- updates
async def test_changing_actors_rescales_the_statefulset(kube, operator):
    await kube.create_job(job_manifest("cartpole"))
    await created(kube)
    await kube.patch_job("cartpole", {"spec": {"topology": {"actors": 5}, "runPolicy": {"cleanPodPolicy": "All"}}})
    await eventually(lambda: children(kube)["StatefulSet", "cartpole-actor-0"]["spec"]["replicas"] == 5,
                     what="5 replicas")
    cm = await eventually(lambda: (c := children(kube)["ConfigMap", "cartpole-job"]) and
                          '"actors":5' in c["metadata"]["annotations"][b.ANNOTATION_SPEC] and c)
    planned = parse_job(yaml.safe_load(cm["data"]["job.yaml"]))
    assert planned.spec.topology.actors == 5 and planned.spec.run_policy.clean_pod_policy == "All"
    await eventually(lambda: status(kube).get("observedGeneration") == 2)
    assert cond(kube, "Planned")["status"] == "True"


async def test_an_immutable_change_is_refused_whole(kube, operator):
    await kube.create_job(job_manifest("cartpole"))
    await created(kube)
    before = {k: (o["metadata"]["uid"], o["metadata"]["resourceVersion"]) for k, o in children(kube).items()}
    # One immutable field and one mutable field: neither is applied.
    await kube.patch_job("cartpole", {"spec": {"env": {"numEnvs": 16}, "algorithm": {"batchSize": 512},
                                               "topology": {"actors": 4}}})
    await eventually(lambda: cond(kube, "Planned")["status"] == "False", what="Planned=False")
    planned = cond(kube, "Planned")
    assert planned["reason"] == "ImmutableFieldChanged"
    assert "spec.env.numEnvs: 8 -> 16" in planned["message"] and "spec.algorithm.batchSize" in planned["message"]
    assert "spec.topology.actors" not in planned["message"]
    assert status(kube)["observedGeneration"] == 2 and status(kube)["phase"] == "Pending"
    after = {k: (o["metadata"]["uid"], o["metadata"]["resourceVersion"]) for k, o in children(kube).items()}
    assert after == before
    await eventually(lambda: [e for e in events(kube, "ImmutableFieldChanged") if e["type"] == "Warning"])

    # Reverting the immutable fields applies the rest.
    await kube.patch_job("cartpole", {"spec": {"env": {"numEnvs": 8}, "algorithm": {"batchSize": 256}}})
    await eventually(lambda: cond(kube, "Planned")["status"] == "True")
    await eventually(lambda: children(kube)["StatefulSet", "cartpole-actor-0"]["spec"]["replicas"] == 4)


async def test_an_invalid_edit_of_a_created_job_keeps_it_running(kube, operator):
    await kube.create_job(job_manifest("cartpole"))
    await created(kube)
    await kube.patch_job("cartpole", {"spec": {"topology": {"buffers": 3}}})
    await eventually(lambda: cond(kube, "Planned")["status"] == "False")
    assert cond(kube, "Planned")["reason"] == "InvalidSpec"
    assert "spec.topology" in cond(kube, "Planned")["message"]
    assert status(kube)["phase"] == "Pending" and cond(kube, "Failed")["status"] == "False"
    assert len(children(kube)) == 6


# ----------------------------------------------------------------- completion
@pytest.mark.parametrize("policy, left", [
    ("Running", set()),
    ("All", set()),
    ("None", {"cartpole-learner-0-0", "cartpole-buffer-0-0"}),
])
async def test_the_stop_rule_ends_the_job_per_clean_pod_policy(kube, policy, left):
    clock = FakeClock()
    async with RunningOperator(kube, clock=clock):
        await kube.create_job(job_manifest("cartpole", {"runPolicy": {"cleanPodPolicy": policy},
                                                        "stop": {"seconds": 60}}))
        await created(kube)
        await run_pods(kube, "cartpole")
        await eventually(lambda: status(kube).get("phase") == "Running")
        clock.advance(61)
        await eventually(lambda: status(kube).get("phase") == "Succeeded", what="phase Succeeded")
        assert cond(kube, "Progressing")["reason"] == "JobSucceeded" and status(kube)["completionTime"]
        assert "ran 61 s >= 60 s" in cond(kube, "Succeeded")["message"]
        await eventually(lambda: events(kube, "Succeeded"), what="a Succeeded event")  # posted after the clean-up
        pods = {n for (k, n) in children(kube) if k == "Pod"}
        assert pods == left
        replicas = children(kube)["StatefulSet", "cartpole-actor-0"]["spec"]["replicas"]
        assert replicas == (2 if policy == "None" else 0)
        # groups and actors as they are after the end: no actors left (cleanPodPolicy Running/All)
        if policy != "None":
            await kube.set_status("apps/v1/statefulsets", NAMESPACE, "cartpole-actor-0",
                                  {"replicas": 0, "readyReplicas": 0})
            await eventually(lambda: status(kube).get("actors") == "0/0", what="actors 0/0 after the end")
            g = status(kube)["groups"][0]
            assert g["learners"] == {"desired": 0, "ready": 0} and g["buffers"] == {"desired": 0, "ready": 0}, g
            assert status(kube)["actorReplicas"] == 0
    assert_rbac_covers(kube)


async def test_a_learner_pod_that_exited_0_is_no_completion(kube, operator):
    """A worker exits 0 on SIGTERM (a deletion, an eviction, a kill in the container): its pod's
    phase Succeeded is never "training completed". The pod is made again; the job goes on."""
    await kube.create_job(job_manifest("cartpole"))
    await created(kube)
    await run_pods(kube, "cartpole")
    await eventually(lambda: status(kube).get("phase") == "Running")
    old = children(kube)["Pod", "cartpole-learner-0-0"]["metadata"]["uid"]
    await kube.set_status("v1/pods", NAMESPACE, "cartpole-learner-0-0", {"phase": "Succeeded"})
    new = await eventually(lambda: (p := children(kube).get(("Pod", "cartpole-learner-0-0")))
                           and p["metadata"]["uid"] != old and p, what="the learner pod made again")
    assert status(kube)["phase"] in ("Pending", "Running") and cond(kube, "Succeeded") is None
    await eventually(lambda: status(kube).get("restartsByRole", {}).get("learner", {}).get("pods") == 1,
                     what="the re-creation counted")
    assert status(kube)["podsSeen"]["cartpole-learner-0-0"]["uid"] == new["metadata"]["uid"]
    assert status(kube)["restarts"] == 0  # a re-creation is no container restart (backoffLimit)


async def test_a_failed_pod_fails_the_job(kube, operator):
    await kube.create_job(job_manifest("cartpole"))
    await created(kube)
    await run_pods(kube, "cartpole")
    await kube.set_status("v1/pods", NAMESPACE, "cartpole-buffer-0-0", {"phase": "Failed", "reason": "Evicted"})
    await eventually(lambda: status(kube).get("phase") == "Failed")
    assert cond(kube, "Failed")["reason"] == "PodFailed" and "Evicted" in cond(kube, "Failed")["message"]


# ----------------------------------------------------------------- delete
async def test_delete_releases_the_finalizer_and_the_children_go(kube, operator):
    await kube.create_job(job_manifest("cartpole"))
    await created(kube)
    await kube.delete_job("cartpole")
    await eventually(lambda: job(kube) is None, what="the job gone (finalizer released)")
    assert children(kube) == {}  # garbage-collected through ownerReferences
    assert operator.metrics.value("tianji_operator_reconciles_total", handler="delete", result="ok") == 1


# ----------------------------------------------------------------- children kept whole
@pytest.mark.parametrize("kind, path", [
    ("Service", "/api/v1/namespaces/{ns}/services/cartpole"),
    ("NetworkPolicy", "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/cartpole"),
    ("ConfigMap", "/api/v1/namespaces/{ns}/configmaps/cartpole-job"),
])
async def test_a_deleted_child_is_recreated(kube, operator, kind, path):
    await kube.create_job(job_manifest("cartpole", {"topology": "auto", "resources": {"cpus": 6}}))
    await created(kube)
    name = path.rsplit("/", 1)[-1]
    before = children(kube)[kind, name]
    code, _ = await kube.api("DELETE", path.format(ns=NAMESPACE))
    assert code == 200
    after = await eventually(lambda: (o := children(kube).get((kind, name)))
                             and o["metadata"]["uid"] != before["metadata"]["uid"] and o, what=f"{kind} back")
    assert after["metadata"]["ownerReferences"] == before["metadata"]["ownerReferences"]
    if kind == "ConfigMap":  # the same planned job and applied spec, rebuilt from the spec and status.plan
        assert yaml.safe_load(after["data"]["job.yaml"]) == yaml.safe_load(before["data"]["job.yaml"])
        key = b.ANNOTATION_SPEC
        assert after["metadata"]["annotations"][key] == before["metadata"]["annotations"][key]
    else:
        assert after["spec"] == before["spec"]
    await eventually(lambda: [e for e in events(kube, "Recreated") if kind in e["message"]])
    # An edit after the rebuild is still judged against the applied spec: a mutable one applies.
    await kube.patch_job("cartpole", {"spec": {"runPolicy": {"cleanPodPolicy": "All"}}})
    await eventually(lambda: '"cleanPodPolicy":"All"' in children(kube)["ConfigMap", "cartpole-job"]["metadata"][
        "annotations"][b.ANNOTATION_SPEC], what="the edit applied")
    assert cond(kube, "Planned")["status"] == "True"


async def test_manual_scaling_of_actors_is_set_back(kube, operator):
    await kube.create_job(job_manifest("cartpole", {"topology": {"actors": 3}}))
    await created(kube)
    code, _ = await kube.api("PATCH", f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets/cartpole-actor-0/scale",
                             {"spec": {"replicas": 7}})
    assert code == 200
    await eventually(lambda: children(kube)["StatefulSet", "cartpole-actor-0"]["spec"]["replicas"] == 3,
                     what="replicas set back to 3")
    ev = await eventually(lambda: events(kube, "ScaleReconciled"))
    assert "group 0: 7 -> 3" in ev[0]["message"]


async def test_a_scale_newer_than_the_ticks_copy_of_the_job_is_not_set_back(monkeypatch):
    """The monitor's tick holds a copy of the job read before `kubectl scale tjj --replicas=3`,
    whose handler has already patched the StatefulSet (and records the applied spec last): the
    tick must not set the new actors back, which would delete and re-make actor-0-2 (a
    re-creation counted, seen on the real control plane). A manual scale of the StatefulSet
    itself, with the job unchanged, is still set back."""
    from tianji_operator.children import lifecycle

    def manifest(actors: int) -> dict:
        m = job_manifest("cartpole", {"topology": {"actors": actors}})
        m["metadata"].update(namespace=NAMESPACE, uid="u1")
        return m

    class Kube:
        def __init__(self, live: dict):
            self.live, self.patches = live, []

        async def get(self, kind, ns, name):
            assert (kind, ns, name) == ("TianJiJob", NAMESPACE, "cartpole")
            return self.live

        async def patch(self, kind, ns, name, body):
            self.patches.append((kind, name, body))

    warned = []
    monkeypatch.setattr(lifecycle.kopf, "warn", lambda body, reason, message: warned.append((reason, message)))
    stale, applied = manifest(2), parse_job(job_manifest("cartpole", {"topology": {"actors": 2}}))
    sets = {0: {"spec": {"replicas": 3}}}
    op = type("Op", (), {"kube": Kube(manifest(3))})()
    await lifecycle.reconcile_manual_scaling(op, stale, applied, sets, logger=None)
    assert op.kube.patches == [] and warned == []
    op.kube.live = manifest(2)  # the job still asks for 2: a `kubectl scale sts` of its own
    await lifecycle.reconcile_manual_scaling(op, stale, applied, sets, logger=None)
    assert op.kube.patches == [("StatefulSet", "cartpole-actor-0", {"spec": {"replicas": 2}})]
    assert warned and "group 0: 3 -> 2" in warned[0][1]


async def test_the_apiserver_refuses_changing_an_immutable_field(kube, operator):
    """CEL transition rules (self == oldSelf) on spec.env.id, spec.algorithm.name, spec.image."""
    await kube.create_job(job_manifest("cartpole"))
    await created(kube)
    for patch, field in (({"env": {"id": "Acrobot-v1"}}, "spec.env.id"),
                         ({"algorithm": {"name": "dqn"}}, "spec.algorithm.name"),
                         ({"image": "tianji-worker:0.2.0"}, "spec.image")):
        code, out = await kube.api("PATCH", f"/apis/tianji.dev/v1alpha1/namespaces/{NAMESPACE}/tianjijobs/cartpole",
                                   {"spec": patch})
        assert code == 422, (patch, out)
        assert f"{field}: Invalid value" in out["message"] and "is immutable" in out["message"]
    assert job(kube)["metadata"]["generation"] == 1
    # A mutable edit goes through.
    await kube.patch_job("cartpole", {"spec": {"topology": {"actors": 4}}})
