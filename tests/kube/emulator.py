"""A Kubernetes API emulator for the operator tests: kmock 0.8 plus the gaps it leaves.
(Over 500 lines on purpose: it is one request path, each rule below a few lines of it; the
schema rules live in structural.py. The real control plane of tests/cluster checks the same
behaviour end to end.)

Stock `kmock.KubernetesEmulator` stores objects and serves list/watch/fetch,
but assigns no uid,
resourceVersion, creationTimestamp or generation; answers a failed JSON-patch
`test` with 500; replays watches from the beginning regardless of
`?resourceVersion`; ignores label/field selectors; treats strategic-merge as
JSON-merge; has no PUT, no owner-reference garbage collection, no status
subresource semantics and no admission. `KubeEmulator` fills those in, enough
for the real Kopf operator to run against it, and refuses or alters writes
where a real kube-apiserver (v1.30+) would, so that what the operator writes
is what a cluster would store:

* metadata: uid, resourceVersion (one global counter), creationTimestamp,
  generation (bumped when anything but metadata/status changes);
* create → 409 AlreadyExists; generateName; namespace from the URL;
* PATCH: merge-patch (RFC 7386), JSON-patch (a failed `test` → 422),
  strategic-merge (merge-patch, except that lists of objects with a `name`
  are merged by name: containers, ports, env, volumes; 415 on custom
  resources, as there), apply-patch → 415; PUT replaces, 409 on a stale
  resourceVersion;
* the `status` subresource: for resources declared with it, create and the
  main endpoint ignore status (a created Pod gets `status.phase: Pending`),
  /status changes only status;
* CRDs declared with `declare_crd()`, on create, PUT, every patch and /status
  (structural.py): unknown fields pruned (`x-kubernetes-preserve-unknown-fields`
  keeps a node's undeclared fields while its declared ones prune again;
  metadata keeps the ObjectMeta fields only), non-nullable nulls dropped, then
  defaulting, then validation of the whole object, status included: 422
  Invalid naming each field (enum, type, required, pattern, bounds, the
  date-time and date formats). Every pruned field is recorded in `pruned`
  (`Pruned`: resource, namespace, name, subresource, path, User-Agent) and
  sent back as an `unknown field` warning;
* built-in kinds (core_validation.py): resource quantities in pod specs and
  templates must parse (else 400 BadRequest to a create or PUT, 422 `patch`
  to a patch); names (a Service's a DNS-1035 label), label keys and values,
  pod hostname/subdomain; requests within limits, extended resources whole
  and equal;
  container port names valid and unique per container, numbers in range, no
  two containers on one host port; Service port names and (port, protocol)
  pairs unique; a containerPort/protocol repeated in a pod is only a
  `Warning` header, as there. Quantities are stored as written (the API
  server would canonicalise them) and unknown fields of built-in kinds are
  kept (the API server drops them);
* refused writes are recorded in `refused` (`Refused`), warnings in
  `warnings` (`Warned`); errors are `Status` objects (kind Status, reason,
  code, details.causes with field paths);
* delete: finalizers → deletionTimestamp; the object goes when its last
  finalizer is removed; background garbage collection of dependents whose
  ownerReferences point at a deleted uid;
* list: labelSelector (=, ==, !=, in, notin, exists, !exists) and
  fieldSelector (metadata.name, metadata.namespace, status.phase);
* watch: events after `?resourceVersion` from the event log, then live;
  without one, synthetic ADDED for what exists; `timeoutSeconds` honoured;
  a watch whose client went away ends (no lingering handler task);
* `/scale` (StatefulSets, CRDs that declare it) answers an autoscaling/v1 `Scale`, as the
  API server does, not the object;
* `/api/v1/namespaces[/NAME]` addresses Namespaces (kmock 0.8 parses
  "namespaces" there as a namespace prefix and answers 500).

No controllers and no kubelet run here: pods get no status beyond Pending,
StatefulSets create no pods, and a pod is deleted at once (a test that needs
one to linger gives it a finalizer). Tests play the controllers with
`set_status()` / `put_object()` (which act as a controller: no status reset);
pods that really run are the real control plane's (tests/cluster). Assertions read `obj()`,
`live()`, `requests`, `api_calls()` (verbs as RBAC names them), `pruned`,
`refused` and `warnings`.

The real operator against it: `operator_harness.py` (which fails a test whose
operator writes were pruned or refused); canned metric sources: `fakes.py`.
"""
from __future__ import annotations

import asyncio
import base64
import collections
import copy
import dataclasses
import datetime
import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Optional

import aiohttp.web
import attrs
import jsonpatch
import kmock
import multidict
from kmock._internal import apps, enums, parsing, rendering

from tianji.control.spec.crd import apply_defaults

from . import apierrors, core_validation, pod_security, structural

CORE = {
    "v1/namespaces": ("Namespace", False, set()),
    "v1/pods": ("Pod", True, {"status"}),
    "v1/services": ("Service", True, {"status"}),
    "v1/configmaps": ("ConfigMap", True, set()),
    "v1/persistentvolumeclaims": ("PersistentVolumeClaim", True, {"status"}),
    "storage.k8s.io/v1/storageclasses": ("StorageClass", False, set()),
    "v1/secrets": ("Secret", True, set()),
    "v1/events": ("Event", True, set()),
    "apps/v1/statefulsets": ("StatefulSet", True, {"status", "scale"}),
    "networking.k8s.io/v1/networkpolicies": ("NetworkPolicy", True, set()),
    "events.k8s.io/v1/events": ("Event", True, set()),
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", False, {"status"}),
}
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}


_kmock_parse_path = parsing.parse_path


def _parse_path(path: str) -> parsing.ParsedPath:
    """kmock 0.8 reads `/api/v1/namespaces[/NAME]` as a namespace prefix with no resource
    (and crashes on the list): those URLs address the Namespace resource itself."""
    parts = path.strip("/").split("/")
    if len(parts) >= 3 and parts[0] == "api" and parts[2] == "namespaces" and (
            len(parts) <= 4 or (len(parts) == 5 and parts[4] in ("status", "finalize"))):
        return parsing.ParsedPath("", parts[1], "namespaces", None,
                                  parts[3] if len(parts) >= 4 else None, parts[4] if len(parts) == 5 else None)
    return _kmock_parse_path(path)


parsing.parse_path = _parse_path  # rendering.Request._parse looks it up on the module at call time


def _now() -> str:
    return datetime.datetime.now(tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _name_of(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    return meta.get("name") or meta.get("generateName") or ""


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge_patch(out.get(k), v)
    return out


def _json_patch(target: dict, patch: Any) -> Any:
    """RFC 6902 JSON patch; a failed `test` (or a bad path) is 422, as the API server answers."""
    try:
        return jsonpatch.apply_patch(target, patch)
    except jsonpatch.JsonPatchTestFailed as e:
        raise kmock.KubernetesError(status=422, reason="Invalid", message=f"test failed: {e}", details={}) from e
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
        raise kmock.KubernetesError(status=422, reason="Invalid", message=str(e), details={}) from e


def _strategic_patch(target: Any, patch: Any) -> Any:
    """Merge patch, but lists of named objects merge by `name` (what containers/ports/env do)."""
    if isinstance(patch, list) and isinstance(target, list) and all(
            isinstance(x, dict) and "name" in x for x in patch + target):
        out = [copy.deepcopy(x) for x in target]
        for item in patch:
            for i, old in enumerate(out):
                if old["name"] == item["name"]:
                    out[i] = _strategic_patch(old, item)
                    break
            else:
                out.append(copy.deepcopy(item))
        return out
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$"):
            continue
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _strategic_patch(out.get(k), v)
    return out


_REQ = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(sel: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in sel:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def match_label_selector(labels: dict, selector: Optional[str]) -> bool:
    if not selector:
        return True
    for req in _split_selector(selector):
        m = _REQ.match(req)
        if m:
            key, op, vals = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if (op == "in") != (labels.get(key) in vals):
                return False
        elif "!=" in req:
            k, v = req.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in req:
            k, v = req.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif req.startswith("!"):
            if req[1:].strip() in labels:
                return False
        elif req not in labels:
            return False
    return True


def match_field_selector(obj: dict, selector: Optional[str]) -> bool:
    if not selector:
        return True
    for req in _split_selector(selector):
        neg = "!=" in req
        k, v = req.replace("==", "=").split("!=" if neg else "=", 1)
        node: Any = obj
        for part in k.strip().split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if (str(node) == v.strip()) == neg:
            return False
    return True


def resource_key(res) -> str:
    """`group/version/plural` (`v1/pods` for the core group), as `declare()` and tests name resources."""
    return f"{res.group + '/' if res.group else ''}{res.version}/{res.plural}"


@dataclasses.dataclass(frozen=True)
class Pruned:
    """A field a write lost to structural pruning (the apiserver drops it silently)."""
    resource: str
    namespace: Optional[str]
    name: str
    subresource: Optional[str]
    path: str
    user_agent: str


@dataclasses.dataclass(frozen=True)
class Refused:
    """A write admission refused (a bad quantity, an invalid field): `fields` its causes name."""
    resource: str
    namespace: Optional[str]
    name: str
    subresource: Optional[str]
    verb: str
    code: int
    reason: str
    message: str
    fields: tuple[str, ...]
    user_agent: str


@dataclasses.dataclass(frozen=True)
class Warned:
    """A warning the apiserver sent back with an accepted write (`Warning: 299 - "..."`)."""
    resource: str
    namespace: Optional[str]
    name: str
    text: str
    user_agent: str


@dataclasses.dataclass
class Write:
    """One write as admission sees it: who (User-Agent), how (create/update/patch), where
    (subresource); `warnings` collects what goes back in `Warning` headers. `as_controller`
    writes (the test helpers) keep a created object's status, as a controller's would."""
    agent: str = ""
    verb: str = "create"
    subresource: Optional[str] = None
    as_controller: bool = False
    warnings: list[str] = dataclasses.field(default_factory=list)


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    """`kmock.KubernetesEmulator` with the behaviour Kopf and the operator rely on (module doc)."""

    _rv: int = attrs.field(default=0, init=False)
    _log: dict = attrs.field(factory=lambda: collections.defaultdict(list), init=False)
    _changed: Optional[asyncio.Event] = attrs.field(default=None, init=False)
    # CRD resources: openAPIV3Schema for pruning, defaulting and validation on writes.
    _schemas: dict = attrs.field(factory=dict, init=False)
    _scale_paths: dict = attrs.field(factory=dict, init=False)  # CRD resource -> its scale subresource paths
    _custom: set = attrs.field(factory=set, init=False)  # resources served for a CRD
    # What admission did to writes, for assertions (see operator_harness.operator_write_problems).
    pruned: list = attrs.field(factory=list, init=False)
    refused: list = attrs.field(factory=list, init=False)
    warnings: list = attrs.field(factory=list, init=False)
    # Plays the confirming evaluation's pod (operator timers/confirm.py): a pod labelled role
    # `confirm` ends at once with this answer as its termination message (None: it never ends).
    confirm_answer: Optional[dict] = attrs.field(factory=lambda: {"mean_return": 1e9, "std_return": 0.0,
                                                                  "mean_length": 500.0, "episodes": 100},
                                                 init=False)
    confirmed: list = attrs.field(factory=list, init=False)  # the confirm pods' args, in order
    confirm_meta: list = attrs.field(factory=list, init=False)  # and their metadata

    # ----------------------------------------------------------------- assertions
    @property
    def requests(self) -> list[rendering.Request]:
        return list(self._requests)

    def api_calls(self, user_agent: Optional[str] = None) -> set[tuple[str, str, str]]:
        """(verb, apiGroup, resource[/subresource]) of every Kubernetes request, as RBAC names them."""
        out = set()
        for r in self._requests:
            if r.resource is None or r.resource.plural is None:
                continue
            if user_agent is not None and not r.headers.get("User-Agent", "").startswith(user_agent):
                continue
            if r.action == enums.action.WATCH:
                verb = "watch"
            elif r.method == enums.method.GET:
                verb = "get" if r.name else "list"
            else:
                verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(
                    str(r.method.value), str(r.method.value).lower())
                if verb == "delete" and not r.name:
                    verb = "deletecollection"
            res = r.resource.plural + (f"/{r.subresource}" if r.subresource else "")
            out.add((verb, r.resource.group, res))
        return out

    # ----------------------------------------------------------------- a client, as kubectl would
    async def api(self, method: str, path: str, body: Any = None,
                  content_type: str = "application/merge-patch+json",
                  headers: Optional[dict] = None) -> tuple[int, Any]:
        """One HTTP call to this server. `Connection: close`: no idle keep-alive handler task
        outlives the call (Kopf waits for such tasks of its event loop when it stops)."""
        headers = {"Connection": "close", **(headers or {})}
        if body is not None:
            headers["Content-Type"] = "application/json" if method == "POST" else content_type
        async with self.request(method, path, data=None if body is None else json.dumps(body),
                                headers=headers) as resp:
            text = await resp.text()
            return resp.status, (json.loads(text) if text else None)

    async def create_job(self, manifest: dict, namespace: str = "tianji-test") -> dict:
        status, out = await self.api("POST", f"/apis/tianji.dev/v1alpha1/namespaces/{namespace}/tianjijobs", manifest)
        assert status == 201, (status, out)
        return out

    async def patch_job(self, name: str, patch: dict, namespace: str = "tianji-test") -> dict:
        status, out = await self.api("PATCH", f"/apis/tianji.dev/v1alpha1/namespaces/{namespace}/tianjijobs/{name}",
                                     patch)
        assert status == 200, (status, out)
        return out

    async def delete_job(self, name: str, namespace: str = "tianji-test") -> dict:
        status, out = await self.api("DELETE", f"/apis/tianji.dev/v1alpha1/namespaces/{namespace}/tianjijobs/{name}")
        assert status == 200, (status, out)
        return out

    # ----------------------------------------------------------------- set-up helpers
    def declare(self, key: str, kind: str, namespaced: bool, subresources=(), shortnames=()) -> None:
        self.resources[key] = kmock.ResourceInfo(
            kind=kind, singular=kind.lower(), namespaced=namespaced, verbs=VERBS,
            subresources=set(subresources), shortnames=set(shortnames))

    def declare_core(self) -> None:
        for key, (kind, namespaced, subs) in CORE.items():
            self.declare(key, kind, namespaced, subs)

    def declare_crd(self, crd: dict, validate: bool = True) -> None:
        """Serve a CRD's resource; with `validate`, writes are pruned, defaulted and validated by
        its schema, as the API server does (module doc)."""
        spec = crd["spec"]
        for v in spec["versions"]:
            subs = set(v.get("subresources", {}))
            key = f"{spec['group']}/{v['name']}/{spec['names']['plural']}"
            self.declare(key, spec["names"]["kind"], spec["scope"] == "Namespaced", subs,
                         spec["names"].get("shortNames", ()))
            self._custom.add(kmock.resource(key))
            if "scale" in v.get("subresources", {}):
                self._scale_paths[kmock.resource(key)] = v["subresources"]["scale"]
            if validate:
                self._schemas[kmock.resource(key)] = v["schema"]["openAPIV3Schema"]

    def obj(self, key: Any, namespace: Optional[str], name: str) -> Optional[dict]:
        """A copy of the current object, or None."""
        res = key if isinstance(key, kmock.resource) else kmock.resource(key)
        k = (res, namespace, name)
        if k not in self.objects or self.objects[k].deleted:
            return None
        return copy.deepcopy(self.objects[k].raw)

    def live(self, key: str, namespace: Optional[str] = None) -> list[dict]:
        """Current (non-deleted) objects of one resource, sorted by name."""
        res = kmock.resource(key)
        out = [copy.deepcopy(o.raw) for (r, ns, _), o in self.objects.items()
               if r == res and not o.deleted and (namespace is None or ns == namespace)]
        return sorted(out, key=lambda o: o["metadata"]["name"])

    async def put_object(self, key: str, body: dict) -> dict:
        """Create an object as a client would (events, metadata), without HTTP."""
        res = kmock.resource(key)
        async with self._lock:
            return self._create(res, body["metadata"].get("namespace"), body, Write(as_controller=True))

    async def set_status(self, key: str, namespace: Optional[str], name: str, status: dict) -> dict:
        """Merge `status` into an object, as a controller or kubelet would."""
        res = kmock.resource(key)
        async with self._lock:
            return self._update(res, namespace, name, lambda o: _merge_patch(o, {"status": status}),
                                Write(verb="patch", subresource="status", as_controller=True))

    # ----------------------------------------------------------------- internals
    def _signal(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _emit(self, res, etype: str, obj: dict) -> None:
        self._log[res].append((int(obj["metadata"]["resourceVersion"]), {"type": etype, "object": copy.deepcopy(obj)}))
        ev = self._signal()
        self._changed = asyncio.Event()
        ev.set()

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _has_status_subresource(self, res) -> bool:
        return res in self.resources and "status" in self.resources[res].subresources

    # ----------------------------------------------------------------- admission
    def _admit(self, res, obj: dict, old: Optional[dict], namespace: Optional[str], w: Write) -> dict:
        """What the API server does to a write between reading the body and storing it, in its
        order: decode (pruning, quantities), keep to the subresource, default, validate."""
        if w.subresource == "scale" and old is not None and res in self._scale_paths:
            obj = self._custom_scale(res, obj, old)
            w = dataclasses.replace(w, subresource=None)
        self._decode(res, obj, namespace, w)
        if res == kmock.resource("v1/secrets") and "stringData" in obj:  # write-only: merged into data
            obj["data"] = {**(obj.get("data") or {}), **{k: base64.b64encode(str(v).encode()).decode()
                                                         for k, v in (obj.pop("stringData") or {}).items()}}
        obj = self._scope(res, obj, old, w)
        schema = self._schemas.get(res)
        if schema is not None:
            obj = apply_defaults(obj, schema)
            errors = structural.validation_errors(obj, schema)
            if old is not None and w.subresource is None:
                errors += structural.transition_errors(obj, old, schema)
            self._check(res, obj, namespace, w, errors)
        elif w.subresource is None:
            self._check(res, obj, namespace, w, core_validation.validation_errors(self._kind(res), obj))
            self._warn_pod_ports(res, obj, old, w)
        return obj

    def _custom_scale(self, res, new: dict, old: dict) -> dict:
        """/scale of a custom resource: `spec.replicas` of the Scale goes to specReplicasPath."""
        merged = copy.deepcopy(old)
        node = merged
        *parents, leaf = self._scale_paths[res]["specReplicasPath"].lstrip(".").split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise kmock.KubernetesError(status=400, reason="BadRequest",
                                            message=f"{self._scale_paths[res]['specReplicasPath']} is not an object "
                                                    "path of this object")
        node[leaf] = (new.get("spec") or {}).get("replicas")
        return merged

    def _scale_of(self, res, obj: dict) -> dict:
        """The autoscaling/v1 Scale the API server serves at /scale: replicas from the object's
        spec/status paths (a CRD's scale subresource, else spec.replicas/status.replicas) and
        the label selector as a string."""
        paths = self._scale_paths.get(res) or {"specReplicasPath": ".spec.replicas",
                                               "statusReplicasPath": ".status.replicas"}

        def at(path: Optional[str]) -> Any:
            node: Any = obj
            for part in (path or "").lstrip(".").split(".") if path else []:
                node = node.get(part) if isinstance(node, dict) else None
            return node if path else None

        selector = at(paths.get("labelSelectorPath"))
        if res not in self._scale_paths:  # built-in kinds: spec.selector.matchLabels
            labels = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or None
        meta = obj.get("metadata") or {}
        return {"apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                             if k in meta},
                "spec": {"replicas": int(at(paths["specReplicasPath"]) or 0)},
                "status": {"replicas": int(at(paths["statusReplicasPath"]) or 0),
                           **({"selector": selector} if isinstance(selector, str) else {})}}

    def _decode(self, res, obj: dict, namespace: Optional[str], w: Write) -> None:
        """Decoding the body: a custom resource loses what its schema does not declare; a
        built-in object fails on a quantity that does not parse."""
        if res in self._schemas:
            self._prune(res, obj, namespace, w)
        else:
            self._decode_quantities(res, obj, namespace, w)

    def _prune(self, res, obj: dict, namespace: Optional[str], w: Write) -> None:
        """Structural pruning, silent but for an `unknown field` warning; recorded in `pruned`."""
        for path in structural.prune(obj, self._schemas[res]):
            self.pruned.append(Pruned(resource_key(res), namespace, _name_of(obj), w.subresource, path, w.agent))
            w.warnings.append(f'unknown field "{path}"')

    def _decode_quantities(self, res, obj: dict, namespace: Optional[str], w: Write) -> None:
        """400 to a create or PUT (the body does not decode); 422 naming `patch` to a patch
        (the patched object does not: apiserver endpoints/handlers/patch.go)."""
        problem = core_validation.decode_error(self._kind(res), obj)
        if problem is None:
            return
        kind = self._kind(res)
        if w.verb == "patch":
            patched = json.dumps(obj, separators=(",", ":"))
            err = apierrors.invalid_error("", "", "", [apierrors.invalid("patch", patched, problem)])
        else:
            err = apierrors.bad_request(f'{kind} in version "{res.version}" cannot be handled as a {kind}: {problem}')
        raise self._refuse(res, obj, namespace, w, err)

    def _scope(self, res, new: dict, old: Optional[dict], w: Write) -> dict:
        """Status subresource semantics: /status changes only status, /scale only replicas, the
        main endpoint (and create) never status."""
        if old is None:
            if self._has_status_subresource(res) and not w.as_controller:
                new.pop("status", None)
                if self._kind(res) == "Pod":
                    new["status"] = {"phase": "Pending"}
            return new
        if w.subresource == "status":
            merged = copy.deepcopy(old)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
            return merged
        if w.subresource == "scale":
            merged = copy.deepcopy(old)
            merged.setdefault("spec", {})["replicas"] = new.get("spec", {}).get("replicas")
            return merged
        if self._has_status_subresource(res):
            if "status" in old:
                new["status"] = old["status"]
            else:
                new.pop("status", None)
        return new

    def _check(self, res, obj: dict, namespace: Optional[str], w: Write, errors: list) -> None:
        if errors:
            err = apierrors.invalid_error(self._kind(res), res.group, _name_of(obj), errors)
            raise self._refuse(res, obj, namespace, w, err)

    def _warn_pod_ports(self, res, obj: dict, old: Optional[dict], w: Write) -> None:
        """Pod(-template) warnings come with a create, or an update that changes the pod spec."""
        kind = self._kind(res)
        if old is None or core_validation.pod_spec(kind, old)[1] != core_validation.pod_spec(kind, obj)[1]:
            w.warnings += core_validation.warnings(kind, obj)

    def _refuse(self, res, obj: dict, namespace: Optional[str], w: Write,
                err: kmock.KubernetesError) -> kmock.KubernetesError:
        causes = (err.details or {}).get("causes", [])
        self.refused.append(Refused(resource_key(res), namespace, _name_of(obj), w.subresource, w.verb, err.status,
                                    err.reason or "", err.message or "", tuple(c["field"] for c in causes), w.agent))
        return err

    def _pod_security(self, res, obj: dict, namespace: Optional[str], w: Write) -> None:
        """Pod Security admission (enforce mode) on pod creation: 403 Forbidden with its message.
        Workload objects (StatefulSets) are admitted; their pods are refused when created."""
        if self._kind(res) != "Pod" or namespace is None or w.as_controller:
            return
        level = pod_security.enforced_level(self.obj("v1/namespaces", None, namespace))
        problems = pod_security.violations(obj.get("spec") or {}, level)
        if problems:
            name = _name_of(obj)
            raise self._refuse(res, obj, namespace, w, kmock.KubernetesError(
                status=403, reason="Forbidden", message=pod_security.forbidden_message(name, level, problems),
                details={"name": name, "kind": "pods"}))

    def _kind(self, res) -> str:
        return self.resources[res].kind or res.plural

    # ----------------------------------------------------------------- storage
    def _create(self, res, namespace: Optional[str], body: Any, w: Write) -> dict:
        if not isinstance(body, dict):
            raise kmock.KubernetesError(status=400, reason="BadRequest", message="body must be an object")
        obj = self._admit(res, copy.deepcopy(body), None, namespace, w)
        self._pod_security(res, obj, namespace, w)
        meta = obj.setdefault("metadata", {})
        if namespace is not None:
            if meta.get("namespace") not in (None, namespace):
                raise kmock.KubernetesError(status=400, reason="BadRequest",
                                            message="the namespace of the object does not match the URL")
            meta["namespace"] = namespace
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise kmock.KubernetesError(status=422, reason="Invalid", message="name or generateName is required")
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        key = (res, meta.get("namespace"), meta["name"])
        if key in self.objects and not self.objects[key].deleted:
            raise kmock.KubernetesError(status=409, reason="AlreadyExists",
                                        message=f'{res.plural} "{meta["name"]}" already exists')
        meta["uid"] = str(uuid.uuid4())
        meta["resourceVersion"] = self._next_rv()
        meta["creationTimestamp"] = _now()
        meta["generation"] = 1
        meta.pop("deletionTimestamp", None)
        self._play_confirm(res, obj)
        if key in self.objects:
            self.objects[key].history.append(obj)
        else:
            self.objects[key] = obj
        self._emit(res, "ADDED", obj)
        return obj

    def _play_confirm(self, res, obj: dict) -> None:
        if res.plural != "pods" or (obj["metadata"].get("labels") or {}).get("tianji.dev/role") != "confirm":
            return
        args = (((obj.get("spec") or {}).get("containers") or [{}])[0]).get("args") or []
        if "--url" not in args:
            return  # not the operator's (a test's own object)
        self.confirmed.append(args)
        self.confirm_meta.append(copy.deepcopy(obj["metadata"]))
        if self.confirm_answer is None:
            return
        url = args[args.index("--url") + 1]
        version = int(url.rsplit("ckpt-", 1)[1].split(".")[0])
        answer = {"policy_version": version, **self.confirm_answer, "checkpoint": url.rsplit("/", 1)[1]}
        obj["status"] = {"phase": "Succeeded", "containerStatuses": [{
            "name": "worker", "ready": False, "restartCount": 0, "image": "", "imageID": "", "started": False,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": json.dumps(answer)}}}]}

    def _update(self, res, namespace, name, fn, w: Write, expect_rv: Optional[str] = None) -> dict:
        key = (res, namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            raise kmock.KubernetesObjectNotFoundError()
        old = copy.deepcopy(self.objects[key].raw)
        if expect_rv and expect_rv != old["metadata"]["resourceVersion"]:
            raise kmock.KubernetesError(status=409, reason="Conflict", message="the object has been modified; "
                                        "please apply your changes to the latest version")
        new = fn(copy.deepcopy(old))
        if not isinstance(new, dict):
            raise kmock.KubernetesError(status=422, reason="Invalid", message="the result is not an object")
        new = self._admit(res, new, old, namespace, w)
        meta = new.setdefault("metadata", {})
        for k in ("uid", "creationTimestamp", "name", "namespace", "deletionTimestamp"):
            if k in old["metadata"]:
                meta[k] = old["metadata"][k]
            else:
                meta.pop(k, None)
        if old["metadata"].get("deletionTimestamp") and len(meta.get("finalizers", [])) > len(
                old["metadata"].get("finalizers", [])):
            raise kmock.KubernetesError(status=422, reason="Invalid",
                                        message="no new finalizers can be added if the object is being deleted")
        body_old = {k: v for k, v in old.items() if k not in ("metadata", "status")}
        body_new = {k: v for k, v in new.items() if k not in ("metadata", "status")}
        meta["generation"] = old["metadata"].get("generation", 1) + (1 if body_old != body_new else 0)
        meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        if new == old:
            return new  # a no-op write keeps the resourceVersion, like the API server
        meta["resourceVersion"] = self._next_rv()
        self.objects[key].history.append(new)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._finalize(res, key)
        else:
            self._emit(res, "MODIFIED", new)
        return new

    def _delete(self, res, namespace, name) -> dict:
        key = (res, namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            raise kmock.KubernetesObjectNotFoundError()
        obj = copy.deepcopy(self.objects[key].raw)
        meta = obj["metadata"]
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                self._mark_deleting(res, key, obj)
            return obj
        self._finalize(res, key)
        return obj

    def _mark_deleting(self, res, key, obj: dict) -> None:
        """The object stays, being deleted (its finalizers): deletionTimestamp, a MODIFIED event."""
        meta = obj["metadata"]
        meta["deletionTimestamp"] = _now()
        meta["resourceVersion"] = self._next_rv()
        self.objects[key].history.append(obj)
        self._emit(res, "MODIFIED", obj)

    def _finalize(self, res, key) -> None:
        obj = copy.deepcopy(self.objects[key].raw)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self.objects[key].delete()
        self._emit(res, "DELETED", obj)
        self._collect_garbage(obj["metadata"]["uid"])

    def _collect_garbage(self, uid: str) -> None:
        """Background cascading deletion: dependents of a deleted owner go too."""
        for (res, ns, name), o in list(self.objects.items()):
            if o.deleted:
                continue
            refs = o.raw.get("metadata", {}).get("ownerReferences", [])
            if any(r.get("uid") == uid for r in refs):
                self._delete(res, ns, name)

    # ----------------------------------------------------------------- HTTP
    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        res = request.resource
        if res is None:
            return await apps.RawHandler._handle(self, request)
        method = request.method
        mutating = request.action in (enums.action.CREATE, enums.action.UPDATE, enums.action.DELETE) or (
            method == enums.method.PUT and request.name)
        if not mutating and request.subresource == "scale" and request.name and res in self.resources:
            obj = self.obj(res, request.namespace, request.name)
            if obj is None:
                raise kmock.KubernetesObjectNotFoundError()
            return aiohttp.web.json_response(self._scale_of(res, obj))
        if not mutating:
            return await super()._handle(request)
        if res not in self.resources:
            raise kmock.KubernetesResourceNotFoundError()
        async with self._lock:
            if request.action == enums.action.DELETE:
                return aiohttp.web.json_response(self._delete(res, request.namespace, request.name))
            w = Write(agent=request.headers.get("User-Agent", ""), subresource=request.subresource)
            status, out = self._write(request, w)
            for text in w.warnings:
                self.warnings.append(Warned(resource_key(res), request.namespace, _name_of(out), text, w.agent))
            if request.subresource == "scale":  # the API server answers /scale with a Scale, not the object
                out = self._scale_of(res, out)
            headers = multidict.CIMultiDict(("Warning", f"299 - {json.dumps(text)}") for text in w.warnings)
            return aiohttp.web.json_response(out, status=status, headers=headers)

    def _write(self, request: rendering.Request, w: Write) -> tuple[int, dict]:
        """Create, replace (PUT) or patch: (HTTP status, the stored object)."""
        res = request.resource
        if request.action == enums.action.CREATE:
            return 201, self._create(res, request.namespace, request.data, w)
        if request.method == enums.method.PUT:
            w.verb = "update"
            body = request.data
            rv = (body or {}).get("metadata", {}).get("resourceVersion")
            return 200, self._update(res, request.namespace, request.name, lambda _: copy.deepcopy(body), w,
                                     expect_rv=rv)
        w.verb = "patch"
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
        patcher = self._patcher(res, ctype, request.data)
        return 200, self._update(res, request.namespace, request.name, patcher, w)

    def _patcher(self, res, ctype: str, patch: Any):
        """The function that applies a patch of this content type (415 for what the API server
        does not take: apply patches here, strategic merge on custom resources there)."""
        if ctype == "application/json-patch+json":
            return lambda obj: _json_patch(obj, patch)
        if ctype == "application/merge-patch+json":
            return lambda obj: _merge_patch(obj, patch)
        if ctype == "application/strategic-merge-patch+json" and res not in self._custom:
            return lambda obj: _strategic_patch(obj, patch)
        if ctype == "application/strategic-merge-patch+json":
            raise kmock.KubernetesError(
                status=415, reason="UnsupportedMediaType", details={},
                message="the body of the request was in an unknown format - accepted media types include: "
                        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml")
        raise kmock.KubernetesError(status=415, reason="UnsupportedMediaType", details={},
                                    message=f"the emulator does not support {ctype!r} patches")

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        """A Status as the API server writes it: no traceback where the error carries details."""
        if isinstance(exc, kmock.KubernetesError) and exc.details is not None:
            status = {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                      "message": exc.message or "", "reason": exc.reason or "", "code": exc.status}
            if exc.details:
                status["details"] = exc.details
            return aiohttp.web.json_response(status, status=exc.status)
        return await super()._render_error(exc)

    def _matching(self, request: rendering.Request) -> list[dict]:
        sel_l = request.params.get("labelSelector")
        sel_f = request.params.get("fieldSelector")
        out = []
        for (res, ns, name), o in self.objects.items():
            if res != request.resource or o.deleted:
                continue
            if request.namespace is not None and ns != request.namespace:
                continue
            if request.name is not None and name != request.name:
                continue
            raw = o.raw
            if match_label_selector(raw.get("metadata", {}).get("labels", {}), sel_l) and \
                    match_field_selector(raw, sel_f):
                out.append(copy.deepcopy(raw))
        return out

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        if request.resource not in self.resources:
            raise kmock.KubernetesResourceNotFoundError()
        async with self._lock:
            items = self._matching(request)
            rv = str(self._rv)
        info = self.resources[request.resource]
        return {"apiVersion": f"{request.resource.group + '/' if request.resource.group else ''}"
                              f"{request.resource.version}",
                "kind": f"{info.kind or 'Object'}List", "metadata": {"resourceVersion": rv}, "items": items}

    def _event_matches(self, request: rendering.Request, event: dict) -> bool:
        obj = event["object"]
        meta = obj.get("metadata", {})
        if request.namespace is not None and meta.get("namespace") != request.namespace:
            return False
        if request.name is not None and meta.get("name") != request.name:
            return False
        return match_label_selector(meta.get("labels", {}), request.params.get("labelSelector")) and \
            match_field_selector(obj, request.params.get("fieldSelector"))

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        yield b""
        timeout = request.params.get("timeoutSeconds")
        deadline = time.monotonic() + float(timeout) if timeout else None
        since = request.params.get("resourceVersion")
        log = self._log[request.resource]
        signal = self._signal()
        if since in (None, "", "0"):
            for obj in self._matching(request):
                yield {"type": "ADDED", "object": obj}
            pos = len(log)
        else:
            pos = next((i for i, (rv, _) in enumerate(log) if rv > int(since)), len(log))
        while True:
            while pos < len(log):
                _, event = log[pos]
                pos += 1
                if self._event_matches(request, event):
                    yield event
            signal = self._signal()
            if pos < len(log):
                continue
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            # Poll for a client that went away: aiohttp keeps the handler task alive otherwise,
            # and Kopf waits 5 s for such "hung" tasks of its event loop when it stops.
            transport = request._raw_request.transport if request._raw_request is not None else None
            if transport is None or transport.is_closing():
                return
            try:
                await asyncio.wait_for(signal.wait(), 0.05 if left is None else min(left, 0.05))
            except asyncio.TimeoutError:
                pass

    async def _serve_fetch(self, request: rendering.Request) -> rendering.Payload:
        async with self._lock:
            obj = self.obj(request.resource, request.namespace, request.name)
        if obj is None:
            raise kmock.KubernetesObjectNotFoundError()
        return obj



