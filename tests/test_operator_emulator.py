"""The test API server itself (tests/kube/emulator.py): the kmock gaps it fills behave like
Kubernetes, since the operator tests rely on them."""
from __future__ import annotations

import asyncio
import json

from kube.operator_harness import JOBS, NAMESPACE, job_manifest

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
    _, out = await kube.api("PATCH", base, {"status": {"phase": "Running"}, "spec": {"image": "i:2"}})
    assert "status" not in out and out["spec"]["image"] == "i:2"
    _, out = await kube.api("PATCH", base + "/status", {"status": {"phase": "Running"}, "spec": {"image": "i:3"}})
    assert out["status"] == {"phase": "Running"} and out["spec"]["image"] == "i:2"


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
