"""The TianJiJob CustomResourceDefinition, generated from the pydantic spec.

`tianji crd` prints it; `crds/tianjijob.yaml` is its checked-in output and a
test fails when the two differ. The pydantic models in `spec/` stay the
single source of truth: this module only translates their JSON schema into a
Kubernetes *structural* OpenAPI v3 schema:

* `$ref`s are inlined; `title`s and `additionalProperties: false` are dropped
  (Kubernetes forbids `additionalProperties` next to `properties`; unknown
  fields are pruned by the API server and rejected by `kubectl --validate=strict`);
* `Optional[X]` (`anyOf: [X, null]`) becomes `X` with `nullable: true`;
* `exclusiveMinimum: n` (JSON schema 2020) becomes `minimum: n, exclusiveMinimum: true`;
  `const` becomes a one-value `enum`;
* the discriminated `algorithm` union (`oneOf` PPO | DQN) becomes one object
  with the union of both variants' properties, `name` required and an enum.
  No defaults inside it (the variants' defaults differ) and `{name: ppo}` as
  its own default: the operator fills the rest with pydantic and rejects
  fields of the other variant (status condition naming the field);
* `topology` takes the shorthand string `auto` or an object. It is a node
  without `type` carrying `x-kubernetes-preserve-unknown-fields: true` (the
  structural-schema exception that allows an empty type), with `pattern:
  ^auto$` (applies to strings only) and the object's `properties` with their
  bounds and defaults (apply to objects only);
* defaults: leaf defaults come from the models; an object-valued field whose
  pydantic default differs from what its leaves' defaults would build (e.g.
  `resources.learner.memory: 2Gi`) carries exactly that difference as its
  `default`, so API-server defaulting reproduces pydantic's defaults exactly
  (a test checks this).
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from tianji.control.contracts.accounting import STATUS_RATE_KEYS
from tianji.control.spec import API_VERSION, JOB_NAME_PATTERN, KIND, JobSpec, immutable

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "tianjijobs"
SINGULAR = "tianjijob"
SHORT_NAMES = ["tjj"]
CATEGORIES = ["tianji", "all"]  # `kubectl get all` lists jobs too
CRD_NAME = f"{PLURAL}.{GROUP}"

# Printer columns read these status fields (written by the operator, see docs/operator.md).
PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {
        "name": "Actors",
        "type": "string",
        "jsonPath": ".status.actors",
        "description": "actor pods ready/desired over all groups",
    },
    {
        "name": "Frames",
        "type": "integer",
        "jsonPath": ".status.envFrames",
        "description": "env frames (summary.json env_frames)",
    },
    {"name": "Frames/s", "type": "number", "jsonPath": ".status.rates.producedFps"},
    {"name": "Episodes", "type": "integer", "jsonPath": ".status.episodes"},
    {
        "name": "Mean return",
        "type": "number",
        "jsonPath": ".status.meanReturn",
        "description": "mean of the last 100 finished episodes (summary.json mean_return)",
    },
    {"name": "Policy version", "type": "integer", "jsonPath": ".status.policyVersion"},
    {
        "name": "Start",
        "type": "date",
        "jsonPath": ".status.startTime",
        "description": "when every learner and buffer first ran",
    },
    {"name": "End", "type": "date", "jsonPath": ".status.completionTime"},
    {
        "name": "Ended by",
        "type": "string",
        "jsonPath": ".status.endReason",
        "description": "TargetReached, FrameBudget, TimeBudget, or the reason the job failed",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    # -o wide
    {"name": "Groups", "type": "integer", "jsonPath": ".status.plan.groups", "priority": 1},
    {
        "name": "Learners",
        "type": "integer",
        "jsonPath": ".status.plan.learners",
        "priority": 1,
        "description": "learners per group",
    },
    {
        "name": "Episode length",
        "type": "number",
        "jsonPath": ".status.meanEpisodeLength",
        "priority": 1,
        "description": "mean length of the last 100 finished episodes, in env steps (summary.json mean_episode_length)",
    },
    {
        "name": "Policy lag",
        "type": "number",
        "jsonPath": ".status.policyLag.mean",
        "priority": 1,
        "description": "mean lag of consumed samples, in learner versions",
    },
    {
        "name": "Eval return",
        "type": "number",
        "jsonPath": ".status.evalReturn",
        "priority": 1,
        "description": "mean return of the last periodic evaluation (spec.evaluation; summary.json evaluation.last)",
    },
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts", "priority": 1},
    {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Failed")].reason', "priority": 1},
]

# HPA/KEDA scale actors per group through /scale: spec.topology.actors (an explicit topology;
# with `topology: auto` the apiserver cannot read replicas), status written by the operator.
SCALE = {
    "specReplicasPath": ".spec.topology.actors",
    "statusReplicasPath": ".status.actorReplicas",
    "labelSelectorPath": ".status.actorSelector",
}

_DROP = {"title", "additionalProperties", "discriminator"}


class CRDGenerationError(RuntimeError):
    """The pydantic schema uses a construct this translator cannot make structural."""


# ----------------------------------------------------------------- translation
def _deref(node: dict, defs: dict) -> dict:
    """Inline `$ref` (and pydantic's single-element `allOf` wrapper), keeping sibling keys."""
    while True:
        if "$ref" in node:
            target = defs[node["$ref"].split("/")[-1]]
            node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        elif "allOf" in node and len(node["allOf"]) == 1:
            node = {**node["allOf"][0], **{k: v for k, v in node.items() if k != "allOf"}}
        else:
            return node


def _convert(node: dict, defs: dict, path: str, defaults: bool = True) -> dict:
    node = _deref(node, defs)
    out: dict[str, Any] = {}

    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        if len(branches) != 1 or len(branches) == len(node["anyOf"]):
            raise CRDGenerationError(f"{path}: only Optional[X] unions are supported, got {node['anyOf']}")
        inner = {**branches[0], **{k: v for k, v in node.items() if k != "anyOf"}}
        out = _convert(inner, defs, path, defaults)
        out["nullable"] = True
        out.pop("default", None)  # a null default adds nothing
        return out

    if "oneOf" in node:
        return _merge_union(node, defs, path)

    for key, value in node.items():
        if key == "additionalProperties" and isinstance(value, dict) and "properties" not in node:
            out[key] = _convert(value, defs, f"{path}{{}}", defaults)  # a map: dict[str, X]
            continue
        if key in _DROP or key in ("properties", "items", "$defs"):
            continue
        if key == "exclusiveMinimum":
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum":
            out["maximum"], out["exclusiveMaximum"] = value, True
        elif key == "const":
            out["enum"] = [value]
        elif key == "default":
            if defaults and value is not None:
                out["default"] = value
        else:
            out[key] = value

    if "properties" in node:
        out["type"] = "object"
        out["properties"] = {k: _convert(v, defs, f"{path}.{k}", defaults) for k, v in node["properties"].items()}
    if "items" in node:
        out["items"] = (
            dict(node["items"])
            if node["items"].get("x-kubernetes-preserve-unknown-fields")
            else _convert(node["items"], defs, f"{path}[]", defaults)
        )
    if "type" not in out:
        raise CRDGenerationError(f"{path}: no type in {node}")
    return _ordered(out)


def _merge_union(node: dict, defs: dict, path: str) -> dict:
    """A discriminated union of objects → one object with the union of the variants' properties."""
    disc = node.get("discriminator", {}).get("propertyName")
    if not disc:
        raise CRDGenerationError(f"{path}: oneOf without a discriminator")
    variants = [_convert(v, defs, path, defaults=False) for v in node["oneOf"]]
    props: dict[str, dict] = {}
    tags: list[str] = []
    for v in variants:
        for name, prop in v["properties"].items():
            if name == disc:
                tags += prop["enum"]
                continue
            if name in props:
                a = {k: x for k, x in props[name].items() if k != "description"}
                b = {k: x for k, x in prop.items() if k != "description"}
                if a != b:
                    raise CRDGenerationError(f"{path}.{name}: variants disagree on the schema ({a} vs {b})")
                da, db = props[name].get("description"), prop.get("description")
                if db and db != da:
                    props[name]["description"] = f"{da}; {db}" if da else db
            else:
                props[name] = prop
    desc = node.get("description") or (
        f"one of: {', '.join(tags)} (selected by `{disc}`); fields of another variant are rejected by the operator"
    )
    return {
        "type": "object",
        "description": desc,
        "required": [disc],
        "properties": {
            disc: {
                "type": "string",
                "enum": tags,
                "description": "algorithm variant",
                "x-kubernetes-validations": [immutable(f"algorithm.{disc}")],
            },
            **props,
        },
    }


_ORDER = [
    "type",
    "description",
    "nullable",
    "enum",
    "format",
    "pattern",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "default",
    "required",
    "items",
    "properties",
]


def _ordered(d: dict) -> dict:
    keys = [k for k in _ORDER if k in d] + sorted(k for k in d if k not in _ORDER)
    return {k: d[k] for k in keys}


# ----------------------------------------------------------------- defaulting
def apply_defaults(value: Any, schema: dict) -> Any:
    """Kubernetes structural defaulting: fill absent properties from `default`, then recurse.

    Used to derive minimal object defaults here, and by tests to check that the
    API server would reproduce pydantic's defaults.
    """
    value = copy.deepcopy(value)
    if isinstance(value, dict) and "properties" in schema:
        for k, prop in schema["properties"].items():
            if k not in value and "default" in prop:
                value[k] = copy.deepcopy(prop["default"])
        for k, v in list(value.items()):
            if k in schema["properties"]:
                value[k] = apply_defaults(v, schema["properties"][k])
    elif isinstance(value, list) and "items" in schema:
        value = [apply_defaults(v, schema["items"]) for v in value]
    return value


def _delta(want: Any, have: Any) -> Any:
    """The smallest default that, once applied and recursed into, turns `have` into `want`."""
    if isinstance(want, dict) and isinstance(have, dict):
        return {k: (_delta(v, have[k]) if k in have else v) for k, v in want.items() if have.get(k) != v}
    return want


def _add_object_defaults(schema: dict, want: Any) -> None:
    """Give each object node whose pydantic default isn't rebuilt by its leaves the difference."""
    if not isinstance(want, dict) or "properties" not in schema:
        return
    for k, prop in schema["properties"].items():
        if k not in want or "default" in prop:
            continue
        if "properties" in prop:
            _add_object_defaults(prop, want[k])
            if isinstance(want[k], dict):
                prop["default"] = _delta(want[k], apply_defaults({}, prop))
                # keep the canonical key order (default before nested structure)
                schema["properties"][k] = _ordered(prop)
        elif "items" in prop or prop.get("type") in ("array",):
            prop["default"] = want[k]
            schema["properties"][k] = _ordered(prop)


# ----------------------------------------------------------------- the CRD
def spec_schema() -> dict:
    """openAPIV3Schema of `.spec`."""
    raw = JobSpec.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    props = raw["properties"]
    out_props: dict[str, dict] = {}
    for name, node in props.items():
        if name == "topology":
            out_props[name] = _topology_schema(_convert(node, defs, f"spec.{name}"))
        else:
            out_props[name] = _convert(node, defs, f"spec.{name}")
    schema = {
        "type": "object",
        "description": "What to train and with what: algorithm, environment, model, topology, "
        "staleness control, stop conditions, resources, network, autoscaling.",
        "properties": out_props,
    }
    defaults = JobSpec().model_dump(mode="json", by_alias=True, exclude_none=True)
    _add_object_defaults(schema, defaults)
    # The union's default is just its discriminator: pydantic fills the variant's fields, and a
    # stored object holds no fields that a later switch to the other variant would have to drop.
    out_props["algorithm"]["default"] = {"name": defaults["algorithm"]["name"]}
    for name in out_props:  # topology's object default was computed against its properties
        out_props[name] = _ordered(out_props[name])
    return schema


def _topology_schema(obj: dict) -> dict:
    desc = obj.get("description", "")
    out = {
        "description": (desc + " " if desc else "") + "Either the string `auto` or an object.",
        "x-kubernetes-preserve-unknown-fields": True,
        "pattern": "^auto$",
        "properties": obj["properties"],
    }
    return out


def status_schema() -> dict:
    """Every field the operator writes, declared: a real apiserver prunes what is not
    (a test writes each status the operator produces through pruning). Only opaque
    records (the plan, the accounting state, autoscaler decisions) keep unknown fields."""
    num = {"type": "number"}
    count = {"type": "integer", "minimum": 0}
    evaluation = {  # one confirming evaluation (tianji.control.contracts.confirm)
        "checkpoint": {"type": "string"},
        "policy_version": count,
        "episodes": count,
        "mean_return": {"type": "number"},
        "std_return": {"type": "number"},
        "mean_length": {"type": "number"},
        "seed": {"type": "integer"},
        "t": {"type": "number"},
    }
    opaque = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    cond = {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {
                "type": "string",
                "description": "Planned, Durable, Ready, Progressing, Rescaled, Suspended, Succeeded, Failed "
                "or TargetReached",
            },
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": {"type": "string"},
            "message": {"type": "string"},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "observedGeneration": {"type": "integer"},
        },
    }
    counts = {"type": "object", "properties": {"desired": {"type": "integer"}, "ready": {"type": "integer"}}}
    rates = {"type": "object", "properties": {k: num for k in STATUS_RATE_KEYS.values()}}
    return {
        "type": "object",
        "description": "Written by the operator (see docs/operator.md). The training numbers are "
        "tianji.control.contracts.accounting's view, the same as a local run's summary.json.",
        "properties": {
            "phase": {"type": "string", "enum": ["Pending", "Running", "Suspended", "Succeeded", "Failed"]},
            "observedGeneration": {"type": "integer"},
            "conditions": {"type": "array", "items": cond},
            "actors": {"type": "string", "description": "actor pods ready/desired over all groups"},
            "groups": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "group": {"type": "integer"},
                        "actors": counts,
                        "buffers": counts,
                        "learners": counts,
                    },
                },
            },
            "plan": {**opaque, "description": "the planner's output (topology, requests, predictions)"},
            "envFrames": {**count, "description": "env frames stepped by all actors (summary.json env_frames)"},
            "episodes": {**count, "description": "episodes finished"},
            "meanReturn": {**num, "description": "mean return of the last 100 finished episodes"},
            "meanEpisodeLength": {**num, "description": "mean length (env steps) of the last 100 finished episodes"},
            "evalReturn": {**num, "description": "mean return of the last periodic evaluation (spec.evaluation)"},
            "policyVersion": {**count, "description": "newest learner version"},
            "policyLag": {
                "type": "object",
                "description": "lag of consumed samples, in learner versions",
                "properties": {"min": num, "mean": num, "max": num},
            },
            "throughput": {**rates, "description": "whole-run averages: totals / seconds since startTime"},
            "rates": {**rates, "description": "over the last few seconds"},
            "bytesSent": count,
            "droppedSamples": {"type": "object", "additionalProperties": count, "description": "by reason"},
            "rejectedMessages": count,
            "droppedFraction": {**num, "description": "samples dropped (any reason) / env frames"},
            "replayRatio": {
                **num,
                "description": "samples sent to learners / samples stored by buffers "
                "(off-policy: since learningStarts)",
            },
            "reportTime": {
                "type": "string",
                "format": "date-time",
                "description": "when the numbers above were last counted",
            },
            "accounting": {**opaque, "description": "the counting state (restored after an operator restart)"},
            "autoscale": {**opaque, "description": "lastRescaleTime, lastDecision, lastEvaluation"},
            "actorReplicas": {**count, "description": "actors per group (the scale subresource's replicas)"},
            "actorSelector": {"type": "string", "description": "label selector of the actor pods (scale subresource)"},
            "hostPorts": {
                "type": "object",
                "description": "hostNetwork: the node ports this job holds "
                "(allocated from the operator's range, or pinned by the spec); kept for the job's life",
                "properties": {
                    "basePort": {"type": "integer"},
                    "metricsPort": {"type": "integer"},
                    "slots": {"type": "integer", "description": "groups x buffers"},
                    "dataPorts": {"type": "string"},
                    "metricsPorts": {"type": "string"},
                    "pinned": {"type": "boolean"},
                },
            },
            "restarts": {
                **count,
                "description": "container restarts of the job's pods (runPolicy.backoffLimit); "
                "kept across operator restarts",
            },
            "restartsByRole": {
                "type": "object",
                "description": "by role: container restarts and pods re-created "
                "(deleted, evicted or stopped while the job ran)",
                "additionalProperties": {"type": "object", "properties": {"containers": count, "pods": count}},
            },
            "podsSeen": {
                "type": "object",
                "description": "what restarts counted of each pod (uid, restarts, the "
                "uid it replaced), so that the next tick, or the next operator, adds only what is new",
                "additionalProperties": {
                    "type": "object",
                    "properties": {
                        "uid": {"type": "string"},
                        "restarts": count,
                        "before": {"type": "array", "items": {"type": "string"}},
                    },
                },
            },
            "targetCheck": {
                "type": "object",
                "description": "the confirming evaluation of the saved policy (a target is reached only "
                "when it meets stop.meanReturn): stage, the learner's version at the trigger, the checkpoint "
                "under evaluation, how many checks were made and the last answer",
                "properties": {
                    "stage": {"type": "string"},
                    "version": count,
                    "retryVersion": {"type": "integer"},
                    "retryAt": {"type": "string", "format": "date-time"},
                    "since": {"type": "string", "format": "date-time"},
                    "checkpoint": {"type": "string"},
                    "checkpointVersion": count,
                    "sha256": {"type": "string"},
                    "count": count,
                    "last": {"type": "object", "properties": {**evaluation, "error": {"type": "string"}}},
                },
            },
            "targetEvaluation": {
                "type": "object",
                "description": "the evaluation that confirmed the target (summary.json target_evaluation)",
                "properties": evaluation,
            },
            "model": {
                "type": "array",
                "description": "each learner's newest checkpoint as it named it; after the "
                "end, the one it wrote as it stopped (final: true): the job's trained model",
                "items": {
                    "type": "object",
                    "properties": {
                        "learner": {"type": "string"},
                        "checkpoint": {"type": "string"},
                        "policyVersion": count,
                        "final": {"type": "boolean"},
                    },
                },
            },
            "activeSince": {
                "type": "string",
                "format": "date-time",
                "description": "creation or last resume: runPolicy.activeDeadlineSeconds counts from here",
            },
            "startTime": {"type": "string", "format": "date-time"},
            "completionTime": {"type": "string", "format": "date-time"},
            "endReason": {
                "type": "string",
                "description": "how the job ended: TargetReached (stop.meanReturn met), "
                "FrameBudget or TimeBudget (stop.envFrames or stop.seconds spent first; condition "
                "TargetReached False says by how much), or the reason it failed",
            },
        },
    }


def crd_dict() -> dict:
    schema = {
        "type": "object",
        "description": "A TianJi deep-RL training job: actors, buffers and learners in training groups.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 40, "pattern": f"^{JOB_NAME_PATTERN}$"}},
            },
            "spec": spec_schema(),
            "status": status_schema(),
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/name": "tianji"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": CATEGORIES,
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}, "scale": SCALE},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:  # no &id001 anchors: plain, diffable YAML
        return True


HEADER = "# Generated from worker/tianji/control/spec/__init__.py by `tianji crd` (make crd). Do not edit by hand.\n"


def crd_yaml() -> str:
    return HEADER + yaml.dump(crd_dict(), Dumper=_Dumper, sort_keys=False, width=120)
