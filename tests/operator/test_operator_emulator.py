"""The test API server itself (tests/kube/emulator.py): the kmock gaps it fills behave like
Kubernetes, since the operator tests rely on them."""
from __future__ import annotations

import asyncio
import json
import threading

import pytest

from kube import core_validation
from kube.operator_harness import JOBS, NAMESPACE, RunningOperator, job_manifest, operator_write_problems

CM = f"/api/v1/namespaces/{NAMESPACE}/configmaps"


def _cm(name, **labels):
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}, "data": {"a": "1"}}


async def test_metadata_conflicts_and_generation(kube):
    code, a = await kube.api("POST", CM, _cm("a"))
    assert code == 201 and a["metadata"]["uid"] and a["metadata"]["generation"] == 1
    assert a["metadata"]["namespace"] == NAMESPACE and a["metadata"]["creationTimestamp"]
    code, err = await kube.api("POST", CM, _cm("a"))
    assert code == 409 and err["reason"] == "AlreadyExists"
    code, b = await kube.api("PATCH", f"{CM}/a", {"data": {"a": "2"}})
    assert int(b["metadata"]["resourceVersion"]) > int(a["metadata"]["resourceVersion"])
    assert b["metadata"]["generation"] == 2 and b["metadata"]["uid"] == a["metadata"]["uid"]
    code, c = await kube.api("PATCH", f"{CM}/a", {"metadata": {"labels": {"x": "y"}}})
    assert c["metadata"]["generation"] == 2  # metadata changes keep the generation
    code, _ = await kube.api("PUT", f"{CM}/a", {**c, "data": {}, "metadata": {**c["metadata"], "resourceVersion": "1"}})
    assert code == 409
    code, gen = await kube.api("POST", CM, {"apiVersion": "v1", "kind": "ConfigMap",
                                            "metadata": {"generateName": "g-"}})
    assert code == 201 and gen["metadata"]["name"].startswith("g-")


async def test_json_patch_test_failure_is_422(kube):
    _, a = await kube.api("POST", CM, _cm("a"))
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": "nope"},
           {"op": "add", "path": "/data/b", "value": "2"}]
    code, err = await kube.api("PATCH", f"{CM}/a", ops, content_type="application/json-patch+json")
    assert code == 422 and kube.obj("v1/configmaps", NAMESPACE, "a")["data"] == {"a": "1"}
    ops[0]["value"] = a["metadata"]["resourceVersion"]
    code, b = await kube.api("PATCH", f"{CM}/a", ops, content_type="application/json-patch+json")
    assert code == 200 and b["data"] == {"a": "1", "b": "2"}


async def test_strategic_merge_merges_named_lists(kube):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}}
    await kube.api("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
    code, out = await kube.api("PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/p",
                               {"spec": {"containers": [{"name": "b", "image": "z"}]}},
                               content_type="application/strategic-merge-patch+json")
    assert [c["image"] for c in out["spec"]["containers"]] == ["x", "z"]
    code, out = await kube.api("PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/p",
                               {"spec": {"containers": [{"name": "b", "image": "w"}]}})
    assert [c["name"] for c in out["spec"]["containers"]] == ["b"]  # merge-patch replaces lists


async def test_status_subresource_and_crd_admission(kube):
    job = await kube.create_job(job_manifest("j", {"topology": "auto"}))
    assert job["spec"]["topology"] == "auto" and job["spec"]["env"]["numEnvs"] == 8  # defaulted
    code, err = await kube.api("POST", f"/apis/{JOBS.rsplit('/', 1)[0]}/namespaces/{NAMESPACE}/tianjijobs",
                               job_manifest("bad", {"topology": {"actors": 0}}))
    assert code == 422 and "spec.topology.actors" in err["message"]
    base = f"/apis/tianji.dev/v1alpha1/namespaces/{NAMESPACE}/tianjijobs/j"
    _, out = await kube.api("PATCH", base, {"status": {"phase": "Running"}, "spec": {"autoscale": {"maxActors": 9}}})
    assert "status" not in out and out["spec"]["autoscale"]["maxActors"] == 9
    _, out = await kube.api("PATCH", base + "/status", {"status": {"phase": "Running"},
                                                        "spec": {"autoscale": {"maxActors": 3}}})
    assert out["status"] == {"phase": "Running"} and out["spec"]["autoscale"]["maxActors"] == 9


async def test_selectors_namespaces_and_garbage_collection(kube):
    _, owner = await kube.api("POST", CM, _cm("owner", role="x"))
    dep = _cm("dep", role="y")
    dep["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                                           "uid": owner["metadata"]["uid"]}]
    await kube.api("POST", CM, dep)
    _, lst = await kube.api("GET", CM + "?labelSelector=role%3Dy")
    assert [o["metadata"]["name"] for o in lst["items"]] == ["dep"]
    _, lst = await kube.api("GET", CM + "?labelSelector=role+in+(x,z)")
    assert [o["metadata"]["name"] for o in lst["items"]] == ["owner"]
    _, lst = await kube.api("GET", CM + "?fieldSelector=metadata.name%3Ddep")
    assert [o["metadata"]["name"] for o in lst["items"]] == ["dep"]
    code, nss = await kube.api("GET", "/api/v1/namespaces")
    assert code == 200 and [n["metadata"]["name"] for n in nss["items"]] == [NAMESPACE]
    code, _ = await kube.api("DELETE", f"{CM}/owner")
    assert code == 200 and kube.obj("v1/configmaps", NAMESPACE, "dep") is None


async def test_finalizers_hold_deletion(kube):
    cm = _cm("f")
    cm["metadata"]["finalizers"] = ["x/y"]
    await kube.api("POST", CM, cm)
    _, out = await kube.api("DELETE", f"{CM}/f")
    assert out["metadata"]["deletionTimestamp"] and kube.obj("v1/configmaps", NAMESPACE, "f")
    await kube.api("PATCH", f"{CM}/f", {"metadata": {"finalizers": None}})
    assert kube.obj("v1/configmaps", NAMESPACE, "f") is None


async def test_watch_resumes_after_a_resource_version(kube):
    _, a = await kube.api("POST", CM, _cm("a"))
    rv = a["metadata"]["resourceVersion"]
    await kube.api("PATCH", f"{CM}/a", {"data": {"a": "2"}})
    await kube.api("POST", CM, _cm("b"))
    events = []
    async with kube.request("GET", f"{CM}?watch=true&resourceVersion={rv}&timeoutSeconds=1",
                            headers={"Connection": "close"}) as resp:
        async def read():
            async for line in resp.content:
                if line.strip():
                    events.append(json.loads(line))
        reader = asyncio.create_task(read())
        await asyncio.sleep(0.1)
        await kube.api("DELETE", f"{CM}/b")
        await asyncio.wait_for(reader, 3)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("MODIFIED", "a"), ("ADDED", "b"), ("DELETED", "b")]


# ----------------------------------------------------------------- what a real API server alters or refuses
# A CRD of the tests' own, shaped like TianJiJob's (status preserves unknown fields, its declared
# children prune again), so that these tests hold whatever TianJiJob's schema becomes.
WIDGETS = "example.com/v1/widgets"
WIDGET_URL = f"/apis/example.com/v1/namespaces/{NAMESPACE}/widgets"
_COUNTS = {"type": "object", "properties": {"desired": {"type": "integer"}, "ready": {"type": "integer"}}}
_WIDGET_SCHEMA = {"type": "object", "properties": {
    "spec": {"type": "object", "properties": {
        "size": {"type": "integer", "minimum": 1, "default": 1},
        "color": {"type": "string", "default": "red"},
        "note": {"type": "string", "nullable": True},
        "shape": {"x-kubernetes-preserve-unknown-fields": True, "pattern": "^round$",  # like spec.topology
                  "properties": {"sides": {"type": "integer", "minimum": 3}}}}},
    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {
        "phase": {"type": "string", "enum": ["Pending", "Running"]},
        "observedGeneration": {"type": "integer"},
        "startTime": {"type": "string", "format": "date-time"},
        "conditions": {"type": "array", "items": {"type": "object", "required": ["type", "status"], "properties": {
            "type": {"type": "string"}, "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "lastTransitionTime": {"type": "string", "format": "date-time"}}}},
        "plan": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "throughput": {"type": "object", "properties": {
            "framesPerSecond": {"type": "number"},
            "groups": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}},
        "groups": {"type": "array", "items": {"type": "object", "properties": {
            "group": {"type": "integer"}, "actors": _COUNTS}}}}}}}
WIDGET_CRD = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
              "metadata": {"name": "widgets.example.com"},
              "spec": {"group": "example.com", "scope": "Namespaced",
                       "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
                       "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                                     "schema": {"openAPIV3Schema": _WIDGET_SCHEMA}}]}}
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
STS = f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets"
SVC = f"/api/v1/namespaces/{NAMESPACE}/services"
STATUS_WRITES = ("json", "merge", "put")  # every way to write /status


@pytest.fixture
async def widgets(kube):
    kube.declare_crd(WIDGET_CRD)
    yield kube


def _widget(name="w", spec=None, **extra):
    return {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec or {}, **extra}


async def _new_widget(kube, name="w", spec=None) -> dict:
    code, out = await kube.api("POST", WIDGET_URL, _widget(name, spec))
    assert code == 201, out
    return out


async def _write_status(kube, how: str, name: str, value: dict, agent: str = "") -> tuple[int, dict]:
    url, headers = f"{WIDGET_URL}/{name}/status", {"User-Agent": agent} if agent else None
    if how == "put":
        return await kube.api("PUT", url, {**kube.obj(WIDGETS, NAMESPACE, name), "status": value}, headers=headers)
    if how == "json":
        return await kube.api("PATCH", url, [{"op": "add", "path": "/status", "value": value}],
                              content_type="application/json-patch+json", headers=headers)
    return await kube.api("PATCH", url, {"status": value}, headers=headers)


def _pruned(kube) -> list[tuple]:
    return [(p.path, p.subresource) for p in kube.pruned]


def _causes(err: dict) -> list[tuple[str, str]]:
    return [(c["reason"], c["field"]) for c in err["details"]["causes"]]


async def test_crd_writes_lose_what_the_schema_does_not_declare(widgets):
    kube = widgets
    w = _widget(spec={"size": 2, "bogus": 1, "shape": {"sides": 4, "rounded": True}}, status={"phase": "Running"})
    w["metadata"]["bogus"] = 2
    async with kube.request("POST", WIDGET_URL, data=json.dumps(w), headers={"Content-Type": "application/json"}) as r:
        assert r.status == 201 and '299 - "unknown field \\"spec.bogus\\""' in r.headers.getall("Warning")
        out = await r.json()
    assert out["spec"] == {"size": 2, "color": "red", "shape": {"sides": 4, "rounded": True}}  # defaulted, pruned
    assert "bogus" not in out["metadata"] and "status" not in out  # create ignores status (status subresource)
    assert _pruned(kube) == [("metadata.bogus", None), ("spec.bogus", None)]
    code, out = await kube.api("PUT", f"{WIDGET_URL}/w", {**out, "spec": {**out["spec"], "nope": 1}})
    assert code == 200 and "nope" not in out["spec"]
    ops = [{"op": "add", "path": "/spec/depth", "value": 3}]
    code, out = await kube.api("PATCH", f"{WIDGET_URL}/w", ops, content_type="application/json-patch+json")
    assert code == 200 and "depth" not in out["spec"]
    code, out = await kube.api("PATCH", f"{WIDGET_URL}/w", {"spec": {"size": 3, "depth": 3}})
    assert code == 200 and out["spec"]["size"] == 3 and "depth" not in out["spec"]
    assert _pruned(kube)[2:] == [("spec.nope", None), ("spec.depth", None), ("spec.depth", None)]
    assert {p.user_agent for p in kube.pruned} == {kube.requests[-1].headers["User-Agent"]}
    assert kube.obj(WIDGETS, NAMESPACE, "w")["spec"] == out["spec"]


@pytest.mark.parametrize("how", STATUS_WRITES)
async def test_status_pruning_keeps_only_preserved_unknown_fields(widgets, how):
    """`status` preserves unknown fields, but its declared children prune again: `throughput`
    declares properties without `framesTotal`, so it is dropped (TianJiJob's status had that
    shape), while `plan` (no properties) and `throughput.groups[]` items keep anything."""
    kube = widgets
    await _new_widget(kube)
    status = {"kopf": {"progress": {"h": {"retries": 1}}}, "plan": {"any": {"thing": 1}},
              "throughput": {"framesPerSecond": 1.5, "framesTotal": 10, "groups": [{"group": 0, "extra": 1}]},
              "groups": [{"group": 0, "actors": {"desired": 2, "ready": 1, "spare": 0}, "extra": 1}]}
    code, out = await _write_status(kube, how, "w", status)
    assert code == 200, out
    assert out["status"]["kopf"] == status["kopf"] and out["status"]["plan"] == status["plan"]
    assert out["status"]["throughput"] == {"framesPerSecond": 1.5, "groups": [{"group": 0, "extra": 1}]}
    assert out["status"]["groups"] == [{"group": 0, "actors": {"desired": 2, "ready": 1}}]
    assert _pruned(kube) == [("status.groups[0].actors.spare", "status"), ("status.groups[0].extra", "status"),
                             ("status.throughput.framesTotal", "status")]
    assert kube.obj(WIDGETS, NAMESPACE, "w")["status"] == out["status"]


async def test_non_nullable_nulls_are_dropped_and_defaulted(widgets):
    out = await _new_widget(widgets, spec={"size": None, "color": "blue", "note": None, "shape": None})
    assert out["spec"] == {"size": 1, "color": "blue", "note": None}  # defaulted; nullable kept; dropped
    assert widgets.pruned == []  # nulls are not unknown fields


async def test_strategic_merge_patch_of_a_custom_resource_is_415(widgets):
    await _new_widget(widgets)
    code, err = await widgets.api("PATCH", f"{WIDGET_URL}/w", {"spec": {"size": 2}},
                                  content_type="application/strategic-merge-patch+json")
    assert code == 415 and err["reason"] == "UnsupportedMediaType"


@pytest.mark.parametrize("status, cause", [
    ({"phase": "Bogus"}, ("FieldValueNotSupported", "status.phase")),
    ({"conditions": [{"type": "Ready", "status": "Maybe"}]}, ("FieldValueNotSupported", "status.conditions[0].status")),
    ({"conditions": [{"status": "True"}]}, ("FieldValueRequired", "status.conditions[0].type")),
    ({"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "yesterday"}]},
     ("FieldValueInvalid", "status.conditions[0].lastTransitionTime")),
    ({"startTime": "2026-02-30T00:00:00Z"}, ("FieldValueInvalid", "status.startTime")),
    ({"observedGeneration": "two"}, ("FieldValueTypeInvalid", "status.observedGeneration")),
    ({"throughput": {"framesPerSecond": "fast"}}, ("FieldValueTypeInvalid", "status.throughput.framesPerSecond")),
])
async def test_status_writes_are_validated(widgets, status, cause):
    kube = widgets
    await _new_widget(kube)
    before = kube.obj(WIDGETS, NAMESPACE, "w")
    for how in STATUS_WRITES:
        code, err = await _write_status(kube, how, "w", status)
        assert code == 422 and err["kind"] == "Status" and err["reason"] == "Invalid", (how, err)
        assert _causes(err) == [cause], (how, err)
        assert err["message"].startswith('Widget.example.com "w" is invalid: ' + cause[1])
    assert kube.obj(WIDGETS, NAMESPACE, "w") == before
    assert [r.fields for r in kube.refused] == [(cause[1],)] * len(STATUS_WRITES)


async def test_valid_status_passes_and_the_main_endpoint_ignores_status(widgets):
    kube = widgets
    await _new_widget(kube)
    ok = {"phase": "Running", "startTime": "2026-01-31T23:59:59Z", "observedGeneration": 1,
          "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-31T23:59:59.5+01:00"}]}
    code, out = await _write_status(kube, "merge", "w", ok)
    assert code == 200 and out["status"] == ok
    code, out = await kube.api("PATCH", f"{WIDGET_URL}/w", {"status": {"phase": "Bogus"}})
    assert code == 200 and out["status"] == ok  # reset to the stored status before validation
    code, err = await kube.api("PATCH", f"{WIDGET_URL}/w", {"spec": {"size": 0, "shape": "square"}})
    assert code == 422 and _causes(err) == [("FieldValueInvalid", "spec.shape"), ("FieldValueInvalid", "spec.size")]
    assert [r.fields for r in kube.refused] == [("spec.shape", "spec.size")]


@pytest.mark.parametrize("text, value", [
    ("1", 1), ("0", 0), ("500m", 0.5), ("1.5", 1.5), (".5", 0.5), ("1.", 1), ("+2", 2), ("-2", -2),
    ("2Gi", 2 * 2**30), ("512Mi", 512 * 2**20), ("1Ki", 1024), ("3Ei", 3 * 2**60), ("1k", 1000), ("1M", 10**6),
    ("1E", 10**18), ("100n", 1e-7), ("3u", 3e-6), ("1e3", 1000), ("1E-3", 0.001), ("2e+2", 200),
    (" 1Gi ", 2**30), (4, 4), (0.25, 0.25),  # JSON decoding trims spaces and takes numbers
])
def test_quantity_grammar_accepts(text, value):
    assert float(core_validation.parse_quantity(text)) == pytest.approx(value)


@pytest.mark.parametrize("text, message", [
    ("524288K", core_validation.ERR_SUFFIX),  # decimal kilo is a lower-case k
    ("1ki", core_validation.ERR_SUFFIX), ("1e", core_validation.ERR_SUFFIX), ("1mi", core_validation.ERR_SUFFIX),
    ("1.5.0", core_validation.ERR_FORMAT), ("1KB", core_validation.ERR_FORMAT), ("1 Gi", core_validation.ERR_FORMAT),
    ("lots", core_validation.ERR_FORMAT), ("", core_validation.ERR_FORMAT), (True, core_validation.ERR_FORMAT),
])
def test_quantity_grammar_refuses(text, message):
    with pytest.raises(core_validation.QuantityError) as e:
        core_validation.parse_quantity(text)
    assert str(e.value) == message


def _pod(name="p", containers=None, **spec):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": containers or [{"name": "a", "image": "x"}], **spec}}


def _sts(name="s", containers=None):
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name},
            "spec": {"serviceName": "x", "replicas": 1, "selector": {"matchLabels": {"a": "b"}},
                     "template": {"metadata": {"labels": {"a": "b"}}, "spec": _pod(containers=containers)["spec"]}}}


def _res(**requests):
    return {"name": "a", "image": "x", "resources": {"requests": requests, "limits": dict(requests)}}


async def test_unparsable_quantities_are_refused_like_the_api_server(kube):
    """Decoding fails before validation: 400 to a create or PUT, 422 (field `patch`) to a patch."""
    code, err = await kube.api("POST", PODS, _pod(containers=[_res(memory="524288K")]))
    assert code == 400 and err["reason"] == "BadRequest"
    assert err["message"] == "Pod in version \"v1\" cannot be handled as a Pod: unable to parse quantity's suffix"
    code, err = await kube.api("POST", STS, _sts(containers=[_res(cpu="1.5.0")]))
    assert code == 400 and core_validation.ERR_FORMAT in err["message"]
    assert kube.live("v1/pods") == [] and kube.live("apps/v1/statefulsets") == []
    code, _ = await kube.api("POST", STS, _sts(containers=[_res(cpu="1500m", memory="512Mi")]))
    assert code == 201
    bad = {"name": "a", "resources": {"limits": {"memory": "1GB"}}}
    patch = {"spec": {"template": {"spec": {"containers": [bad]}}}}
    code, err = await kube.api("PATCH", f"{STS}/s", patch, content_type="application/strategic-merge-patch+json")
    assert code == 422 and [c["field"] for c in err["details"]["causes"]] == ["patch"]
    assert core_validation.ERR_FORMAT in err["message"]
    stored = kube.obj("apps/v1/statefulsets", NAMESPACE, "s")["spec"]["template"]["spec"]["containers"][0]
    assert stored["resources"]["limits"] == {"cpu": "1500m", "memory": "512Mi"}
    assert [(r.code, r.verb) for r in kube.refused] == [(400, "create"), (400, "create"), (422, "patch")]


@pytest.mark.parametrize("resources, field, detail", [
    ({"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}, "spec.containers[0].resources.requests[cpu]",
     "must be less than or equal to cpu limit of 1"),
    ({"requests": {"memory": "-1Gi"}}, "spec.containers[0].resources.requests[memory]",
     "must be greater than or equal to 0"),
    ({"requests": {"nvidia.com/gpu": "0.5"}, "limits": {"nvidia.com/gpu": "0.5"}},
     "spec.containers[0].resources.limits[nvidia.com/gpu]", "must be an integer"),
    ({"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}},
     "spec.containers[0].resources.requests[nvidia.com/gpu]", "must be equal to nvidia.com/gpu limit of 2"),
])
async def test_resource_requirements_are_validated(kube, resources, field, detail):
    code, err = await kube.api("POST", PODS, _pod(containers=[{"name": "a", "image": "x", "resources": resources}]))
    assert code == 422 and err["reason"] == "Invalid", err
    assert any(c["field"] == field and detail in c["message"] for c in err["details"]["causes"]), err


@pytest.mark.parametrize("ports, field, reason", [
    ([{"name": "metrics", "containerPort": 80}, {"name": "metrics", "containerPort": 81}],
     "spec.containers[0].ports[1].name", "FieldValueDuplicate"),
    ([{"name": "a-sixteen-chars1", "containerPort": 80}], "spec.containers[0].ports[0].name", "FieldValueInvalid"),
    ([{"name": "Metrics", "containerPort": 80}], "spec.containers[0].ports[0].name", "FieldValueInvalid"),
    ([{"name": "m", "containerPort": 70000}], "spec.containers[0].ports[0].containerPort", "FieldValueInvalid"),
    ([{"name": "m"}], "spec.containers[0].ports[0].containerPort", "FieldValueRequired"),
    ([{"containerPort": 80, "protocol": "HTTP"}], "spec.containers[0].ports[0].protocol", "FieldValueNotSupported"),
])
async def test_container_ports_are_validated(kube, ports, field, reason):
    for url, obj in ((PODS, _pod(containers=[{"name": "a", "image": "x", "ports": ports}])),
                     (STS, _sts(containers=[{"name": "a", "image": "x", "ports": ports}]))):
        code, err = await kube.api("POST", url, obj)
        want = field if url == PODS else "spec.template." + field
        assert code == 422 and {"reason": reason, "field": want} in [
            {k: c[k] for k in ("reason", "field")} for c in err["details"]["causes"]], err


async def test_a_port_repeated_across_containers_is_a_warning_unless_host_ports_collide(kube):
    """validation.go checks port names per container; a containerPort/protocol declared twice in
    a pod is only warned about (pkg/api/pod/warnings.go) — but on the host network both take
    the same host port, and that is refused."""
    two = [{"name": "a", "image": "x", "ports": [{"name": "metrics", "containerPort": 9090}]},
           {"name": "b", "image": "y", "ports": [{"name": "metrics", "containerPort": 9090}]}]
    async with kube.request("POST", PODS, data=json.dumps(_pod(containers=two)),
                            headers={"Content-Type": "application/json"}) as r:
        assert r.status == 201
        text = "spec.containers[1].ports[0]: duplicate port definition with spec.containers[0].ports[0]"
        assert r.headers.getall("Warning") == [f'299 - "{text}"']
    assert [w.text for w in kube.warnings] == [text]
    code, err = await kube.api("POST", PODS, _pod("h", containers=two, hostNetwork=True))
    assert code == 422 and [(c["field"], c["message"]) for c in err["details"]["causes"]] == [
        ("spec.containers[1].ports[0].hostPort", 'Duplicate value: "TCP//9090"')]


@pytest.mark.parametrize("ports, field, reason", [
    ([{"name": "metrics", "port": 80}, {"name": "metrics", "port": 81}], "spec.ports[1].name", "FieldValueDuplicate"),
    ([{"name": "a", "port": 80}, {"name": "b", "port": 80, "protocol": "TCP"}], "spec.ports[1]",
     "FieldValueDuplicate"),
    ([{"name": "a", "port": 80}, {"port": 81}], "spec.ports[1].name", "FieldValueRequired"),
    ([{"name": "Web", "port": 80}], "spec.ports[0].name", "FieldValueInvalid"),
    ([{"name": "a", "port": 80, "targetPort": "metrics-port-long"}], "spec.ports[0].targetPort", "FieldValueInvalid"),
])
async def test_service_ports_are_validated(kube, ports, field, reason):
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"ports": ports}}
    code, err = await kube.api("POST", SVC, svc)
    assert code == 422 and {"reason": reason, "field": field} in [
        {k: c[k] for k in ("reason", "field")} for c in err["details"]["causes"]], err


async def test_service_port_may_repeat_with_another_protocol(kube):
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "dns"}, "spec": {"ports": [
        {"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]}}
    code, _ = await kube.api("POST", SVC, svc)
    assert code == 201


async def test_operator_writes_that_lose_fields_fail_the_operator_test(widgets):
    """`operator_write_problems` names the operator's pruned and refused writes, no one else's;
    RunningOperator raises them when the test ends."""
    kube = widgets
    await kube.api("POST", WIDGET_URL, _widget(spec={"bogus": 1}), headers={"User-Agent": "kubectl/v1.30"})
    await _write_status(kube, "json", "w", {"throughput": {"framesTotal": 1}}, agent="tianji-operator")
    await _write_status(kube, "merge", "w", {"phase": "Done"}, agent="kopf/1.45.2")
    problems = operator_write_problems(kube)
    assert len(problems) == 2 and "w/status: status.throughput.framesTotal was pruned" in problems[0]
    assert "patch refused 422 Invalid" in problems[1] and "status.phase" in problems[1]
    op = RunningOperator(kube)
    op.stop_requested, op.thread = threading.Event(), threading.Thread(target=lambda: None)
    op.thread.start()
    with pytest.raises(AssertionError, match=r"status\.throughput\.framesTotal"):
        await op.__aexit__(None, None, None)


@pytest.mark.parametrize("url, obj, field", [
    (SVC, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "1cartpole"}, "spec": {"ports": [
        {"name": "a", "port": 80}]}}, "metadata.name"),  # Services need DNS-1035 labels: a letter first
    (PODS, _pod("Pod_1"), "metadata.name"),
    (PODS, _pod("p", hostname="x" * 64), "spec.hostname"),
    (PODS, {**_pod(), "metadata": {"name": "p", "labels": {"tianji.dev/job": "-x"}}}, "metadata.labels"),
    (STS, {**_sts(), "metadata": {"name": "s", "labels": {"bad key!": "x"}}}, "metadata.labels"),
])
async def test_names_hostnames_and_labels_are_validated(kube, url, obj, field):
    code, err = await kube.api("POST", url, obj)
    assert code == 422 and field in [c["field"] for c in err["details"]["causes"]], err
    code, _ = await kube.api("POST", SVC, {"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": "cartpole", "labels": {"tianji.dev/job": "cartpole", "app.kubernetes.io/name": "tianji"}},
        "spec": {"ports": [{"name": "a", "port": 80}]}})
    assert code == 201
