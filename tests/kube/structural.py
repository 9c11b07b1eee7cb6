"""What kube-apiserver does to a custom resource with a structural schema, in its order:
prune unknown fields, drop non-nullable nulls, coerce `metadata` to ObjectMeta (then the
caller defaults), and validate against the openAPIV3Schema.

Pruning follows apiextensions-apiserver's `pruning.PruneWithOptions`: an object node keeps
the fields its `properties` (or `additionalProperties`) declare; a node with
`x-kubernetes-preserve-unknown-fields: true` keeps its unknown fields, while the fields it
does declare are pruned again by their own schemas; at the root (and in
`x-kubernetes-embedded-resource` nodes) apiVersion, kind and metadata are left to
ObjectMeta coercion, which drops what ObjectMeta does not have.
"""
from __future__ import annotations

import datetime
import re
from collections.abc import Iterator
from typing import Any, Optional

import jsonschema

from . import apierrors
from .apierrors import FieldError

TYPE_META = ("apiVersion", "kind", "metadata")
OBJECT_META = frozenset({
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations",
    "ownerReferences", "finalizers", "managedFields"})


def join(path: str, key: Any) -> str:
    """Field paths as the apiserver prints them: `spec.ports[0].name`."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


# ----------------------------------------------------------------- pruning
def prune(obj: dict, schema: dict) -> list[str]:
    """Drop, in place, every field `schema` does not declare; return their paths, sorted."""
    pruned: list[str] = []
    _prune(obj, {**schema, "x-kubernetes-embedded-resource": True}, "", pruned)
    _drop_non_nullable_nulls(obj, schema)
    pruned += coerce_object_meta(obj)
    return sorted(pruned)


def coerce_object_meta(obj: dict, path: str = "") -> list[str]:
    """ObjectMeta keeps only its own fields (unknown ones are dropped and reported)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return []
    unknown = sorted(k for k in meta if k not in OBJECT_META)
    for k in unknown:
        del meta[k]
    return [join(join(path, "metadata"), k) for k in unknown]


def _prune(value: Any, schema: Optional[dict], path: str, pruned: list[str]) -> None:
    if schema is not None and schema.get("x-kubernetes-preserve-unknown-fields"):
        _prune_declared_only(value, schema, path, pruned)
    elif isinstance(value, dict):
        embedded = schema is not None and schema.get("x-kubernetes-embedded-resource")
        for k in list(value):
            if embedded and k in TYPE_META:
                continue
            sub = _field_schema(schema, k)
            if sub is None:
                pruned.append(join(path, k))
                del value[k]
            else:
                _prune(value[k], sub, join(path, k), pruned)
        if embedded and path:
            pruned += coerce_object_meta(value, path)
    elif isinstance(value, list):
        items = schema.get("items") if schema is not None else None
        for i, v in enumerate(value):
            _prune(v, items, join(path, i), pruned)


def _prune_declared_only(value: Any, schema: dict, path: str, pruned: list[str]) -> None:
    """Under x-kubernetes-preserve-unknown-fields: unknown fields stay, declared ones are pruned."""
    if isinstance(value, dict):
        for k, v in value.items():
            if schema.get("x-kubernetes-embedded-resource") and k in TYPE_META:
                continue
            sub = _field_schema(schema, k)
            if sub is not None:
                _prune(v, sub, join(path, k), pruned)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            _prune_declared_only(v, schema["items"], join(path, i), pruned)


def _field_schema(schema: Optional[dict], key: str) -> Optional[dict]:
    if schema is None:
        return None
    if key in schema.get("properties", {}):
        return schema["properties"][key]
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def _drop_non_nullable_nulls(value: Any, schema: Optional[dict]) -> None:
    """A null where the schema is not nullable is dropped (PruneNonNullableNullsWithoutDefaults;
    where the field has a default, defaulting then fills it, as the apiserver does)."""
    if isinstance(value, dict):
        for k in list(value):
            sub = _field_schema(schema, k)
            if value[k] is None and sub is not None and not sub.get("nullable"):
                del value[k]
            else:
                _drop_non_nullable_nulls(value[k], sub)
    elif isinstance(value, list):
        items = schema.get("items") if schema is not None else None
        for v in value:
            _drop_non_nullable_nulls(v, items)


# ----------------------------------------------------------------- validation
def openapi_to_jsonschema(node: Any) -> Any:
    """OpenAPI v3 (Kubernetes flavour: nullable, x-kubernetes-*) → JSON schema draft 4."""
    if isinstance(node, list):
        return [openapi_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k.startswith("x-kubernetes-") or k == "nullable":
            continue
        if k == "properties":
            out[k] = {name: openapi_to_jsonschema(p) for name, p in v.items()}
        elif k == "default":
            out[k] = v
        else:
            out[k] = openapi_to_jsonschema(v)
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


_DATE = re.compile(r"^([0-9]{4})-([0-9]{2})-([0-9]{2})$")
_TIME = re.compile(r"^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))$")


def is_date(text: str) -> bool:
    m = _DATE.match(text)
    if not m:
        return False
    try:
        datetime.date(int(m[1]), int(m[2]), int(m[3]))
    except ValueError:
        return False
    return True


def is_date_time(text: str) -> bool:
    """kube-openapi's strfmt.IsDateTime (RFC 3339 date-time, `T` or `t`, `Z` or an offset)."""
    parts = text.lower().split("t")
    if len(text) < 4 or len(parts) < 2 or not is_date(parts[0]):
        return False
    m = _TIME.match(parts[1])
    return bool(m) and m[1] <= "23" and m[2] <= "59" and m[3] <= "59"


# The formats the apiserver checks for CRDs include these two (formats.go); others are ignored here.
FORMATS = jsonschema.FormatChecker(formats=())
FORMATS.checks("date-time")(lambda v: not isinstance(v, str) or is_date_time(v))
FORMATS.checks("date")(lambda v: not isinstance(v, str) or is_date(v))


IMMUTABLE_RULE = "self == oldSelf"


def transition_errors(new: Any, old: Any, schema: dict, path: str = "") -> list[FieldError]:
    """CEL transition rules on an update. Only `self == oldSelf` (immutable fields) is
    evaluated; the apiserver skips a rule when the field is absent on either side."""
    out: list[FieldError] = []
    for v in schema.get("x-kubernetes-validations") or []:
        if v.get("rule") != IMMUTABLE_RULE:
            raise NotImplementedError(f"{path}: the emulator evaluates only {IMMUTABLE_RULE!r}, not {v.get('rule')!r}")
        if new != old:
            message = v.get("message") or "failed rule: " + IMMUTABLE_RULE
            out.append(FieldError("FieldValueInvalid", path.lstrip("."),
                                  f"Invalid value: \"{schema.get('type', 'object')}\": {message}"))
    if isinstance(new, dict) and isinstance(old, dict):
        for k, sub in (schema.get("properties") or {}).items():
            if k in new and k in old:
                out += transition_errors(new[k], old[k], sub, f"{path}.{k}")
    return out


def validation_errors(obj: dict, schema: dict) -> list[FieldError]:
    """The schema's verdict on `obj`, as the apiserver words it, in field-path order."""
    validator = jsonschema.Draft4Validator(openapi_to_jsonschema(schema), format_checker=FORMATS)
    out: list[FieldError] = []
    for e in validator.iter_errors(obj):
        out += [err for err in _field_errors(e) if err not in out]
    return sorted(out, key=lambda err: err.field)


def _path(e: jsonschema.ValidationError) -> str:
    path = ""
    for p in e.absolute_path:
        path = join(path, p)
    return path


def _field_errors(e: jsonschema.ValidationError) -> Iterator[FieldError]:
    path, value, rule = _path(e), e.instance, e.validator_value
    if e.validator == "required":
        missing = re.match(r"^'(.*)' is a required property$", e.message)
        yield apierrors.required(join(path, missing[1] if missing else "?"))
    elif e.validator == "enum":
        yield apierrors.not_supported(path, value, rule)
    elif e.validator == "type":
        want = rule if isinstance(rule, str) else rule[0]
        yield apierrors.type_invalid(path, _json_type(value), f"{path} in body must be of type {want}: "
                                     + apierrors.show(value))
    elif e.validator == "format":
        yield apierrors.invalid(path, value, f"{path} in body must be of type {rule}: {apierrors.show(value)}")
    elif e.validator == "pattern":
        yield apierrors.invalid(path, value, f"{path} in body should match '{rule}'")
    elif e.validator == "minimum":
        op = "greater than" if e.schema.get("exclusiveMinimum") else "greater than or equal to"
        yield apierrors.invalid(path, value, f"{path} in body should be {op} {rule}")
    elif e.validator == "maximum":
        op = "less than" if e.schema.get("exclusiveMaximum") else "less than or equal to"
        yield apierrors.invalid(path, value, f"{path} in body should be {op} {rule}")
    elif e.validator == "maxLength":
        yield apierrors.too_long(path, rule)
    else:
        yield apierrors.invalid(path, value, e.message)


def _json_type(value: Any) -> str:
    for name, types in (("boolean", bool), ("integer", int), ("number", float), ("string", str),
                        ("array", list), ("object", dict)):
        if isinstance(value, types):
            return name
    return "null"
