"""The TianJiJob CRD: generated from the pydantic spec, structural, in step with crds/."""
from __future__ import annotations

import contextlib
import copy
import glob
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from kube.operator_harness import start_cluster
from tianji.control.spec import JobSpec, parse_job
from tianji.control.spec.crd import PRINTER_COLUMNS, apply_defaults, crd_dict, crd_yaml

ROOT = Path(__file__).resolve().parents[2]
CHECKED_IN = ROOT / "crds" / "tianjijob.yaml"


def _schema() -> dict:
    return crd_dict()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _spec_schema() -> dict:
    return _schema()["properties"]["spec"]


def test_checked_in_crd_matches_generated():
    assert CHECKED_IN.exists(), "crds/tianjijob.yaml is missing: run `make crd`"
    assert CHECKED_IN.read_text() == crd_yaml(), "crds/tianjijob.yaml is stale: run `make crd`"


def test_crd_validates_strictly():
    kubernetes_validate.validate(yaml.safe_load(crd_yaml()), "1.33.0", strict=True)


def test_names_scope_and_subresources():
    crd = crd_dict()
    assert crd["metadata"]["name"] == "tianjijobs.tianji.dev"
    spec = crd["spec"]
    assert spec["group"] == "tianji.dev" and spec["scope"] == "Namespaced"
    assert spec["names"]["plural"] == "tianjijobs" and spec["names"]["shortNames"] == ["tjj"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"]["status"] == {} and set(version["subresources"]) == {"status", "scale"}
    # Every status field is declared (a real apiserver prunes undeclared ones); only opaque records
    # keep unknown fields.
    status = _schema()["properties"]["status"]
    assert "x-kubernetes-preserve-unknown-fields" not in status
    assert {k for k, v in status["properties"].items() if v.get("x-kubernetes-preserve-unknown-fields")} == {
        "plan", "accounting", "autoscale"}
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names == ["Phase", "Actors", "Frames", "Frames/s", "Episodes", "Mean return", "Policy version", "Start",
                     "End", "Ended by", "Age", "Groups", "Learners", "Episode length", "Policy lag", "Eval return",
                     "Restarts", "Reason"]
    wide = [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority") == 1]
    # kubectl get tjj -o wide
    assert wide == ["Groups", "Learners", "Episode length", "Policy lag", "Eval return", "Restarts", "Reason"]
    assert "all" in spec["names"]["categories"]  # kubectl get all


def test_printer_columns_point_at_declared_status_fields():
    status = _schema()["properties"]["status"]
    for col in PRINTER_COLUMNS:
        parts = re.findall(r"[^.\[]+(?:\[[^\]]*\])?", col["jsonPath"])  # dots outside [?(...)] filters
        if parts[0] == "metadata":
            continue
        node = _schema()
        for p in parts:
            node = node["properties"][p.split("[")[0]]
            if "[" in p:  # conditions[?(@.type=="Failed")].reason
                node = node["items"]
            if node.get("x-kubernetes-preserve-unknown-fields"):
                break  # status.plan: an opaque record (the planner's output, tianji.control.planner.plan)
        else:
            assert node["type"] == {"date": "string"}.get(col["type"], col["type"]), col
    assert status["type"] == "object"


def test_plan_columns_name_fields_the_plan_has():
    from tianji.control.planner.plan import resolve
    from tianji.control.spec import parse_job
    from tianji_operator.status import camel_keys

    _, plan = resolve(parse_job({"metadata": {"name": "a"}, "spec": {"topology": {"groups": 2}}}))
    record = camel_keys(plan.to_json())
    assert (record["groups"], record["learners"]) == (2, 1)
    assert {c["jsonPath"] for c in PRINTER_COLUMNS if c["jsonPath"].startswith(".status.plan.")} == {
        ".status.plan.groups", ".status.plan.learners"}


# ----------------------------------------------------------------- structurality
_JUNCTORS = ("allOf", "anyOf", "oneOf", "not")
_FORBIDDEN_IN_JUNCTORS = ("type", "default", "description", "nullable", "additionalProperties", "title")


def _structural_errors(s: dict, path: str, root: bool = False) -> list[str]:
    """The rules of https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/
    custom-resource-definitions/#specifying-a-structural-schema (apiextensions' ValidateStructural)."""
    errs = []
    if not (s.get("type") or s.get("x-kubernetes-preserve-unknown-fields") or s.get("x-kubernetes-int-or-string")):
        errs.append(f"{path}: type must not be empty")
    if root and s.get("type") != "object":
        errs.append(f"{path}: root must be an object")
    if s.get("type") == "array" and "items" not in s:
        errs.append(f"{path}: array without items")
    if "additionalProperties" in s and ("properties" in s or root):
        errs.append(f"{path}: additionalProperties with properties / at the root")
    if "$ref" in s:
        errs.append(f"{path}: $ref")
    for j in _JUNCTORS:
        for sub in ([s[j]] if j == "not" and j in s else s.get(j, [])):
            for key in _FORBIDDEN_IN_JUNCTORS:
                if key in sub:
                    errs.append(f"{path}.{j}: {key} inside a logical junctor")
            for k in sub.get("properties", {}):
                if k not in s.get("properties", {}):
                    errs.append(f"{path}.{j}: property {k} not specified outside the junctor")
    if "default" in s:
        try:
            jsonschema.Draft4Validator(_to_jsonschema(s)).validate(s["default"])
        except jsonschema.ValidationError as e:
            errs.append(f"{path}: default does not validate: {e.message}")
        if isinstance(s["default"], dict) and not s.get("x-kubernetes-preserve-unknown-fields"):
            unknown = set(s["default"]) - set(s.get("properties", {}))
            if unknown:
                errs.append(f"{path}: default has fields that would be pruned: {unknown}")
    for k, v in s.get("properties", {}).items():
        if root and k == "metadata":
            extra = set(v.get("properties", {})) - {"name", "generateName"}
            if extra:
                errs.append(f"{path}.metadata: only name/generateName may be restricted")
        errs += _structural_errors(v, f"{path}.{k}")
    if "items" in s:
        errs += _structural_errors(s["items"], f"{path}[]")
    return errs


def test_schema_is_structural():
    assert _structural_errors(_schema(), "openAPIV3Schema", root=True) == []
    text = crd_yaml()
    for word in ("$ref", "anyOf", "oneOf", "allOf", "title:", "const:"):
        assert word not in text, word
    # additionalProperties only as a map's value schema, never beside properties.
    def maps(node, path):
        if isinstance(node, dict):
            if "additionalProperties" in node:
                assert "properties" not in node, path
                yield path
            for k, v in node.items():
                yield from maps(v, f"{path}.{k}")
    assert sorted(maps(_schema()["properties"]["spec"], "spec")) == [
        f"spec.properties.pods.properties.{r}.properties.nodeSelector"
        for r in ("actor", "all", "buffer", "evaluator", "learner")]


# ----------------------------------------------------------------- instances
def _to_jsonschema(node):
    """OpenAPI v3 (Kubernetes flavour) → JSON schema draft 4, for validating instances."""
    if isinstance(node, list):
        return [_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes-") and k != "nullable"}
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if "properties" in node and "properties" in out:
        out["properties"] = {k: _to_jsonschema(v) for k, v in node["properties"].items()}
    return out


def _validate_instance(doc: dict) -> None:
    jsonschema.Draft4Validator(_to_jsonschema(_schema())).validate(doc)


def _job(spec: dict | None = None, name: str = "cartpole") -> dict:
    doc = {"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob", "metadata": {"name": name}}
    if spec is not None:
        doc["spec"] = spec
    return doc


@pytest.mark.parametrize("spec", [
    None,
    {},
    {"topology": "auto", "resources": {"cpus": 16}},
    {"topology": {"groups": 2, "actors": 8, "buffers": 2, "learners": 1}},
    {"algorithm": {"name": "dqn", "lr": 1e-4, "batchSize": 32}, "env": {"id": "ALE/Pong-v5"}},
    {"network": {"hostNetwork": True, "rdma": "rdma/hca_shared_devices_a"}, "resources": {"learner": {"gpu": 1}}},
    {"autoscale": {"enabled": True, "prometheusUrl": "http://prometheus:9090", "minActors": 2, "maxActors": 32}},
    {"stop": {"meanReturn": 475.0, "envFrames": None}},
])
def test_valid_instances_pass(spec):
    _validate_instance(_job(spec))


@pytest.mark.parametrize("spec, where", [
    ({"topology": "banana"}, "topology"),
    ({"topology": {"actors": 0}}, "actors"),
    ({"algorithm": {"lr": 1e-3}}, "name"),
    ({"algorithm": {"name": "a2c"}}, "name"),
    ({"algorithm": {"name": "ppo", "lr": 0}}, "lr"),
    ({"env": {"numEnvs": "many"}}, "numEnvs"),
    ({"resources": {"actor": {"memory": "lots"}}}, "memory"),
    # What the Kubernetes grammar refuses, the API server refuses at admission too.
    ({"resources": {"actor": {"memory": "524288K"}}}, "memory"),
    ({"resources": {"buffer": {"cpu": 0.0004}}}, "cpu"),
    ({"network": {"basePort": 65533}}, "basePort"),
    ({"network": {"rdma": "hca_shared_devices_a"}}, "rdma"),
    ({"image": "registry.example.com/TianJi:0.1.0"}, "image"),
    ({"autoscale": {"band": 1.0}}, "band"),
    ({"runPolicy": {"cleanPodPolicy": "Sometimes"}}, "runPolicy/cleanPodPolicy"),
])
def test_invalid_instances_fail(spec, where):
    with pytest.raises(jsonschema.ValidationError) as err:
        _validate_instance(_job(spec))
    assert where in "/".join(str(p) for p in err.value.absolute_path) + err.value.message


def test_long_or_bad_names_fail():
    with pytest.raises(jsonschema.ValidationError):
        _validate_instance(_job({}, name="x" * 41))
    with pytest.raises(jsonschema.ValidationError):
        _validate_instance(_job({}, name="Bad_Name"))


def _example_jobs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict) and d.get("kind") == "TianJiJob"]


EXAMPLES = sorted(Path(p) for p in glob.glob(str(ROOT / "examples" / "*.yaml")))


def test_example_manifests_validate():
    assert EXAMPLES
    for path in EXAMPLES:
        for doc in _example_jobs(path):
            _validate_instance(doc)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
async def test_examples_lose_no_field_to_pruning(path):
    """Created through the emulator (an API server's pruning), an example keeps every field it
    sets: a field the CRD does not declare would be dropped silently on a real cluster."""
    jobs = _example_jobs(path)
    assert jobs, f"{path.name} holds no TianJiJob"
    async with contextlib.AsyncExitStack() as stack:
        kube = await start_cluster(stack)
        for doc in jobs:
            await kube.create_job(doc)
    lost = [f"{p.name}: {p.path}" for p in kube.pruned]
    assert not lost, f"{path.name}: a real API server would drop {lost}"


# ----------------------------------------------------------------- defaults
def _pydantic(spec: dict) -> dict:
    return parse_job(_job(spec)).spec.model_dump(mode="json", by_alias=True, exclude_none=True)


@pytest.mark.parametrize("spec", [
    {},
    {"resources": {"learner": {"cpu": 2}}, "topology": {"actors": 4}},
    {"resources": {"buffer": {"memory": "3Gi"}, "cpus": 8}},
    {"network": {"rdma": "rdma/hca_shared_devices_a"}, "autoscale": {"enabled": True}},
    {"algorithm": {"name": "ppo", "lr": 3e-4}, "model": {"hidden": [32]}},
])
def test_server_defaults_reproduce_pydantic_defaults(spec):
    """What the API server stores after defaulting parses to the same job, field for field."""
    defaulted = apply_defaults(copy.deepcopy(spec), _spec_schema())
    assert _pydantic(defaulted) == _pydantic(spec)
    # Field for field, except inside the algorithm union, which carries no inner defaults.
    without = lambda d: {k: v for k, v in d.items() if k != "algorithm"}
    assert without(defaulted) == without(_pydantic(spec))
    assert defaulted["algorithm"]["name"] == _pydantic(spec)["algorithm"]["name"]


def test_defaults_of_an_empty_spec_are_pydantics():
    defaulted = apply_defaults({}, _spec_schema())
    want = JobSpec().model_dump(mode="json", by_alias=True, exclude_none=True)
    assert defaulted.pop("algorithm") == {"name": want.pop("algorithm")["name"]}
    assert defaulted == want


def test_topology_shorthand_is_not_defaulted_into_an_object():
    assert apply_defaults({"topology": "auto"}, _spec_schema())["topology"] == "auto"
