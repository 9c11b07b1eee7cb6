"""Kubernetes API errors as the apiserver words them: field errors (k8s.io/apimachinery
util/validation/field) and the `Status` objects of 422 Invalid and 400 BadRequest."""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any, Optional

import kmock


@dataclasses.dataclass(frozen=True)
class FieldError:
    """One `field.Error`: `type` is the Status cause type (FieldValueInvalid, ...)."""
    type: str
    field: str
    body: str  # "Invalid value: ...", "Duplicate value: ...", "Required value", ...

    def __str__(self) -> str:
        return f"{self.field}: {self.body}"

    def cause(self) -> dict:
        return {"reason": self.type, "message": self.body, "field": self.field}


def show(value: Any) -> str:
    """A bad value as field errors print it: strings quoted, numbers and booleans bare, else JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if value is None:
        return "null"
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def invalid(field: str, value: Any, detail: str = "") -> FieldError:
    return FieldError("FieldValueInvalid", field, f"Invalid value: {show(value)}" + (f": {detail}" if detail else ""))


def type_invalid(field: str, value: Any, detail: str) -> FieldError:
    return FieldError("FieldValueTypeInvalid", field, f"Invalid value: {show(value)}: {detail}")


def duplicate(field: str, value: Any) -> FieldError:
    return FieldError("FieldValueDuplicate", field, f"Duplicate value: {show(value)}")


def required(field: str) -> FieldError:
    return FieldError("FieldValueRequired", field, "Required value")


def not_supported(field: str, value: Any, supported: Iterable[Any]) -> FieldError:
    return FieldError("FieldValueNotSupported", field, f"Unsupported value: {show(value)}: supported values: "
                      + ", ".join(show(s) for s in supported))


def too_long(field: str, limit: int) -> FieldError:
    return FieldError("FieldValueTooLong", field, f"Too long: may not be more than {limit} bytes")


def aggregate(errors: list) -> str:
    """utilerrors.Aggregate's text: one error alone, several in brackets."""
    texts = [str(e) for e in errors]
    return texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"


def invalid_error(kind: str, group: str, name: Optional[str], errors: list[FieldError]) -> kmock.KubernetesError:
    """apierrors.NewInvalid: 422, reason Invalid, one cause per field error."""
    qualified = f"{kind}.{group}" if group else kind
    return kmock.KubernetesError(
        status=422, reason="Invalid",
        message=f"{qualified} {json.dumps(name or '')} is invalid: {aggregate(errors)}",
        details={"name": name or "", "group": group, "kind": kind, "causes": [e.cause() for e in errors]})


def bad_request(message: str) -> kmock.KubernetesError:
    return kmock.KubernetesError(status=400, reason="BadRequest", message=message, details={})
