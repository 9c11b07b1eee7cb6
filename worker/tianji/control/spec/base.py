"""The spec's base: SpecError, the Kubernetes grammar (names, quantities, immutable fields)
and the strict pydantic base model every part of a TianJiJob derives from."""

from __future__ import annotations

import re
import types
import typing
from decimal import Decimal
from typing import Any, Final, Optional, Union

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.alias_generators import to_camel

API_VERSION: Final = "tianji.dev/v1alpha1"
KIND: Final = "TianJiJob"


class SpecError(ValueError):
    """A job spec that cannot run. The message names the file and the field path."""


# ----------------------------------------------------------------- Kubernetes grammar
# What the operator puts in pods must pass the API server and the kubelet; these
# checks refuse it here instead, on both engines, with the field path. The
# patterns also go into the CRD schema (RE2 and Python `re` read them alike).

# Quantity: <number><suffix>, suffix binary (Ki..Ei), decimal (n u m "" k M G T P E) or e/E<int>.
# No sign: a memory size must be positive anyway.
QUANTITY_PATTERN = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
# Far below what any worker needs (Python with torch: ~250 MiB), so less is a unit slip
# (`memory: 512` is 512 bytes), never a tight budget.
MIN_MEMORY = "64Mi"
MIN_CPU = 0.001  # Kubernetes counts cpu in millicores

# Extended resource (`domain/name`): a DNS-1123 subdomain, '/', a qualified name of <= 63 chars.
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
EXTENDED_RESOURCE_PATTERN = rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*/([A-Za-z0-9][-A-Za-z0-9_.]{{0,61}})?[A-Za-z0-9]$"

# Image reference as the kubelet parses it: [registry[:port]/]path[:tag][@digest], path lowercase.
_PATH_COMPONENT = r"[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*"
_REGISTRY = r"[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?)*(:[0-9]+)?"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_PATTERN = rf"^({_REGISTRY}/)?{_PATH_COMPONENT}(/{_PATH_COMPONENT})*(:{_TAG})?(@{_DIGEST})?$"


def quantity_value(q: str) -> Decimal:
    """The number a Kubernetes quantity stands for, e.g. `1.5Gi` -> 1610612736."""
    m = re.fullmatch(QUANTITY_PATTERN, q)
    if not m:
        hint = " (K is no suffix: k is 1000, Ki 1024)" if q.endswith("K") else ""
        raise ValueError(
            f"{q!r} is not a Kubernetes quantity{hint}: "
            "e.g. 512Mi, 2Gi or 1.5G; suffixes Ki Mi Gi Ti Pi Ei or k M G T P E"
        )
    number, suffix = Decimal(m.group(1)), m.group(3) or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    exponent = _DECIMAL[suffix] if suffix in _DECIMAL else int(suffix[1:])
    try:
        return number.scaleb(exponent)
    except ArithmeticError:  # e.g. 1e99999999: a ValueError, so that pydantic reports it
        raise ValueError(f"{q!r} is out of range") from None


def immutable(field: str) -> dict:
    """A CEL transition rule for the CRD (Kubernetes >= 1.25): the apiserver refuses the change.
    The operator refuses every other immutable change itself (ImmutableFieldChanged)."""
    return {"rule": "self == oldSelf", "message": f"{field} is immutable: delete and re-create the job to change it"}


_JSON_TYPE = {bool: "a boolean", int: "an integer", float: "a number"}


class _FieldError(ValueError):
    """A model validator's error about one field (`key`): reported at that field's path."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def _scalar_type(annotation: Any) -> Optional[type]:
    """bool, int or float for a field of that type (or Optional of it); None for anything else."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = rest[0] if len(rest) == 1 else None
    return annotation if annotation in _JSON_TYPE else None


class _Model(BaseModel):
    # allow_inf_nan=False: `meanReturn: .nan` (or any NaN/inf) is an error, not a stop rule that never fires.
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_assignment=True,
        allow_inf_nan=False,
    )

    @model_validator(mode="before")
    @classmethod
    def _json_types(cls, data: Any) -> Any:
        """The CRD's types, as the apiserver applies them: `actors: "2"`, `actors: true` or
        `paceActors: 1` are refused here too, not coerced (one manifest, one meaning). An
        integral number is an integer (2.0), as it is to the apiserver."""
        if not isinstance(data, dict):
            return data
        for name, f in cls.model_fields.items():
            want = _scalar_type(f.annotation)
            for key in {f.alias or name, name}:
                v = data.get(key)
                if want is None or v is None:
                    continue
                number = isinstance(v, (int, float)) and not isinstance(v, bool)
                if not (isinstance(v, bool) if want is bool else number):
                    raise _FieldError(key, f"expected {_JSON_TYPE[want]}, got {type(v).__name__} {v!r}")
        return data
