"""Admission of the built-in kinds the operator writes, as kube-apiserver (v1.30+) does it:
resource quantities (k8s.io/apimachinery resource.Quantity), container and Service ports
(pkg/apis/core/validation) and the port warnings of pkg/api/pod/warnings.go.

A quantity that does not parse fails the decoding of the object, before validation: the
apiserver answers 400 BadRequest to a create or an update and 422 (field `patch`) to a
patch. Everything else here is validation: 422 Invalid, one cause per field. Duplicate
containerPort/protocol pairs (in one container or across containers) are only a warning
(`Warning` header), exactly as there; duplicate host ports, port names within a container
and Service port names or (port, protocol) pairs are refused.
"""
from __future__ import annotations

import decimal
import re
from collections.abc import Iterator
from typing import Any, Optional

from . import apierrors
from .apierrors import FieldError
from .structural import join

# ----------------------------------------------------------------- quantities
SPLIT_RE = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
ERR_FORMAT = f"quantities must match the regular expression '{SPLIT_RE}'"
ERR_SUFFIX = "unable to parse quantity's suffix"
DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_SCAN = re.compile(r"^([+-]?)([0-9]*)(?:\.([0-9]*))?([eEinumkKMGTP]*[-+]?[0-9]*)$")


class QuantityError(ValueError):
    pass


def parse_quantity(text: Any) -> decimal.Decimal:
    """`<signedNumber><suffix>` → its value; QuantityError with the apiserver's message otherwise.

    The scan is resource.ParseQuantity's: a number (digits, an optional `.digits`), suffix
    letters from `eEinumkKMGTP`, an optional sign and digits; then the suffix must be a
    decimal SI one (n u m "" k M G T P E), a binary one (Ki .. Ei) or `e`/`E` and an integer.
    So `524288K` scans but has no such suffix; `1.5.0` does not scan."""
    # Quantity.UnmarshalJSON trims spaces, and parses an unquoted JSON number's text alike.
    text = text.strip() if isinstance(text, str) else _json_number(text)
    m = _SCAN.match(text)
    if not text or not m:
        raise QuantityError(ERR_FORMAT)
    sign, whole, frac, suffix = m.groups()
    number = decimal.Decimal(f"{sign}{whole or '0'}.{frac or '0'}")
    if suffix in DECIMAL_SUFFIXES:
        return number.scaleb(DECIMAL_SUFFIXES[suffix])
    if suffix in BINARY_SUFFIXES:
        return number * (2 ** BINARY_SUFFIXES[suffix])
    if len(suffix) > 1 and suffix[0] in "eE" and re.fullmatch(r"[-+]?[0-9]+", suffix[1:]):
        return number.scaleb(int(suffix[1:]))
    raise QuantityError(ERR_SUFFIX)


def _json_number(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, (int, float)) else ""


# Where each kind keeps its pod specs (pod templates included).
POD_SPECS = {
    "Pod": ("spec",),
    "PodTemplate": ("template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "Deployment": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")


def _at(obj: dict, path: str) -> dict:
    """The object at a dotted path (no indexes), or {}."""
    node: Any = obj
    for key in path.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def pod_spec(kind: str, obj: dict) -> tuple[str, Optional[dict]]:
    """(field path, pod spec) of an object of `kind`; (.., None) when it has none."""
    node: Any = obj
    path = ""
    for key in POD_SPECS.get(kind, ()):
        node = node.get(key) if isinstance(node, dict) else None
        path = join(path, key)
    return path, node if isinstance(node, dict) and kind in POD_SPECS else None


def quantities(kind: str, obj: dict) -> Iterator[tuple[str, Any]]:
    """(field path, value) of every resource quantity in the object's pod spec and claims."""
    path, spec = pod_spec(kind, obj)
    if spec is not None:
        for lst in CONTAINER_LISTS:
            for i, c in enumerate(_dicts(spec.get(lst))):
                yield from _requirements(join(join(join(path, lst), i), "resources"), c.get("resources"))
        yield from _requirements(join(path, "resources"), spec.get("resources"))
        yield from _resource_list(join(path, "overhead"), spec.get("overhead"))
        for i, v in enumerate(_dicts(spec.get("volumes"))):
            if isinstance(v.get("emptyDir"), dict) and "sizeLimit" in v["emptyDir"]:
                yield join(join(join(join(path, "volumes"), i), "emptyDir"), "sizeLimit"), v["emptyDir"]["sizeLimit"]
    if kind == "StatefulSet":
        for i, t in enumerate(_dicts((obj.get("spec") or {}).get("volumeClaimTemplates"))):
            yield from _requirements(f"spec.volumeClaimTemplates[{i}].spec.resources",
                                     (t.get("spec") or {}).get("resources"))


def _requirements(path: str, res: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(res, dict):
        for part in ("limits", "requests"):
            yield from _resource_list(join(path, part), res.get(part))


def _resource_list(path: str, items: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(items, dict):
        for name, value in items.items():
            yield f"{path}[{name}]", value


def _dicts(value: Any) -> list[dict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def decode_error(kind: str, obj: dict) -> Optional[str]:
    """Why the object would not decode (the first bad quantity), or None."""
    for _path, value in quantities(kind, obj):
        try:
            parse_quantity(value)
        except QuantityError as e:
            return str(e)
    return None


# ----------------------------------------------------------------- validation
def validation_errors(kind: str, obj: dict) -> list[FieldError]:
    """What ValidatePod / ValidateStatefulSet / ValidateService (...) refuse in the parts the
    emulator checks: names and labels, pod hostnames, resource requirements and ports."""
    errors = metadata_errors(kind, obj.get("metadata") or {})
    path, spec = pod_spec(kind, obj)
    if spec is not None:
        if kind != "Pod":  # a template's labels are validated too
            template = path.rsplit(".", 1)[0]
            errors += label_errors(f"{template}.metadata.labels", _at(obj, template + ".metadata").get("labels"))
        errors += _pod_spec_errors(path, spec, default_host_ports=kind == "Pod")
    if kind == "Service":
        errors += service_port_errors((obj.get("spec") or {}).get("ports"))
    return errors


DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
NAME_RULES = {  # kind → (regex, max length, what the apiserver calls it); the rest: DNS-1123 subdomains
    "Service": (DNS1035_LABEL, 63, "a DNS-1035 label must consist of lower case alphanumeric characters or "
                "'-', start with an alphabetic character, and end with an alphanumeric character"),
    "Namespace": (DNS1123_LABEL, 63, "a lowercase RFC 1123 label must consist of lower case alphanumeric "
                  "characters or '-', and must start and end with an alphanumeric character"),
}
SUBDOMAIN_RULE = (DNS1123_SUBDOMAIN, 253, "a lowercase RFC 1123 subdomain must consist of lower case "
                  "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character")


def _format_errors(field: str, value: str, rule: tuple) -> list[FieldError]:
    regex, limit, what = rule
    errors = []
    if len(value) > limit:
        errors.append(apierrors.invalid(field, value, f"must be no more than {limit} characters"))
    if not regex.match(value):
        errors.append(apierrors.invalid(field, value, what))
    return errors


def metadata_errors(kind: str, meta: dict) -> list[FieldError]:
    """ValidateObjectMeta: the name's format for the kind (a Service's is a DNS-1035 label, which
    must start with a letter); label keys and values."""
    errors = []
    if meta.get("name"):
        errors += _format_errors("metadata.name", meta["name"], NAME_RULES.get(kind, SUBDOMAIN_RULE))
    errors += label_errors("metadata.labels", meta.get("labels"))
    return errors


def label_errors(path: str, labels: Any) -> list[FieldError]:
    """ValidateLabels: qualified-name keys (an optional DNS subdomain prefix and `/`, a name of at
    most 63 characters); values of at most 63 characters, alphanumeric at both ends."""
    errors: list[FieldError] = []
    for key, value in (labels or {}).items():
        prefix, _, name = key.rpartition("/")
        if (prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix))) or len(name) > 63 \
                or not LABEL_NAME.match(name):
            errors.append(apierrors.invalid(path, key, "name part must consist of alphanumeric characters, '-', "
                                            "'_' or '.', and must start and end with an alphanumeric character"))
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
            errors.append(apierrors.invalid(path, value,
                                            "a valid label must be an empty string or consist of alphanumeric "
                                            "characters, '-', '_' or '.', and must start and end with an "
                                            "alphanumeric character (at most 63 characters)"))
    return errors


def _pod_spec_errors(path: str, spec: dict, default_host_ports: bool) -> list[FieldError]:
    errors: list[FieldError] = []
    for key in ("hostname", "subdomain"):  # DNS names of the pod: RFC 1123 labels
        if spec.get(key):
            errors += _format_errors(join(path, key), spec[key], NAME_RULES["Namespace"])
    host_network = bool(spec.get("hostNetwork"))
    for lst in CONTAINER_LISTS:
        for i, c in enumerate(_dicts(spec.get(lst))):
            cpath = join(join(path, lst), i)
            ports = _effective_ports(c.get("ports"), host_network and default_host_ports)
            errors += container_port_errors(join(cpath, "ports"), ports, host_network)
            errors += resource_errors(join(cpath, "resources"), c.get("resources"))
    errors += _host_port_conflicts(join(path, "containers"), spec, host_network and default_host_ports)
    return errors


def _effective_ports(ports: Any, default_host_port: bool) -> list[dict]:
    """Ports after the apiserver's defaulting: protocol TCP; on a host-network Pod,
    hostPort = containerPort (SetDefaults_Pod)."""
    out = []
    for p in _dicts(ports):
        p = {"protocol": "TCP", **p}
        if default_host_port and not p.get("hostPort"):
            p["hostPort"] = p.get("containerPort")
        out.append(p)
    return out


PROTOCOLS = ("SCTP", "TCP", "UDP")


def is_valid_port_name(name: str) -> list[str]:
    """IsValidPortName (IANA_SVC_NAME): what is wrong with a container port name."""
    msgs = []
    if len(name) > 15:
        msgs.append("must be no more than 15 characters")
    if not re.fullmatch(r"[-a-z0-9]+", name):
        msgs.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if not re.search(r"[a-z]", name):
        msgs.append("must contain at least one letter (a-z)")
    if "--" in name:
        msgs.append("must not contain consecutive hyphens")
    if name.startswith("-") or name.endswith("-"):
        msgs.append("must not begin or end with a hyphen")
    return msgs


def _port_number_errors(field: str, value: Any) -> list[FieldError]:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        return [apierrors.invalid(field, value, "must be between 1 and 65535, inclusive")]
    return []


def container_port_errors(path: str, ports: list[dict], host_network: bool) -> list[FieldError]:
    """validateContainerPorts: valid, unique (within the container) names; valid numbers."""
    errors: list[FieldError] = []
    names: set[str] = set()
    for i, p in enumerate(ports):
        ppath = join(path, i)
        name = p.get("name") or ""
        if name:
            msgs = is_valid_port_name(name)
            errors += [apierrors.invalid(join(ppath, "name"), name, m) for m in msgs]
            if not msgs and name in names:
                errors.append(apierrors.duplicate(join(ppath, "name"), name))
            names.add(name)
        if not p.get("containerPort"):
            errors.append(apierrors.required(join(ppath, "containerPort")))
        else:
            errors += _port_number_errors(join(ppath, "containerPort"), p["containerPort"])
        if p.get("hostPort"):
            errors += _port_number_errors(join(ppath, "hostPort"), p["hostPort"])
            if host_network and p["hostPort"] != p.get("containerPort"):
                errors.append(apierrors.invalid(join(ppath, "hostPort"), p["hostPort"],
                                                "must match `containerPort` when `hostNetwork` is true"))
        if p["protocol"] not in PROTOCOLS:
            errors.append(apierrors.not_supported(join(ppath, "protocol"), p["protocol"], PROTOCOLS))
    return errors


def _host_port_conflicts(path: str, spec: dict, default_host_port: bool) -> list[FieldError]:
    """AccumulateUniqueHostPorts over the pod's containers: one (protocol, hostIP, hostPort) each."""
    errors: list[FieldError] = []
    seen: set[str] = set()
    for i, c in enumerate(_dicts(spec.get("containers"))):
        for j, p in enumerate(_effective_ports(c.get("ports"), default_host_port)):
            if not p.get("hostPort"):
                continue
            key = f"{p['protocol']}/{p.get('hostIP', '')}/{p['hostPort']}"
            if key in seen:
                errors.append(apierrors.duplicate(f"{path}[{i}].ports[{j}].hostPort", key))
            seen.add(key)
    return errors


def _is_extended_resource(name: str) -> bool:
    """A fully qualified resource name outside kubernetes.io (nvidia.com/gpu, rdma/...)."""
    return "/" in name and not name.startswith(("kubernetes.io/", "requests."))


def resource_errors(path: str, res: Any) -> list[FieldError]:
    """ValidateResourceRequirements: no negative amounts, requests within limits; extended
    resources are whole numbers with requests equal to limits."""
    if not isinstance(res, dict):
        return []
    limits, requests = res.get("limits") or {}, res.get("requests") or {}
    errors: list[FieldError] = []
    for part, items in (("limits", limits), ("requests", requests)):
        for name, value in items.items():
            field = f"{join(path, part)}[{name}]"
            amount = parse_quantity(value)
            if amount < 0:
                errors.append(apierrors.invalid(field, value, "must be greater than or equal to 0"))
            if _is_extended_resource(name) and amount != amount.to_integral_value():
                errors.append(apierrors.invalid(field, value, "must be an integer"))
    for name, value in requests.items():
        field = f"{join(path, 'requests')}[{name}]"
        if name in limits:
            over = parse_quantity(value) > parse_quantity(limits[name])
            if _is_extended_resource(name) and parse_quantity(value) != parse_quantity(limits[name]):
                errors.append(apierrors.invalid(field, value, f"must be equal to {name} limit of {limits[name]}"))
            elif over:
                errors.append(apierrors.invalid(field, value,
                                                f"must be less than or equal to {name} limit of {limits[name]}"))
        elif _is_extended_resource(name):
            errors.append(FieldError("FieldValueRequired", f"{join(path, 'limits')}",
                                     "Required value: Limit must be set for non overcommitable resources"))
    return errors


def service_port_errors(ports: Any) -> list[FieldError]:
    """ValidateService's port rules: names (DNS-1123 labels, required when there are several)
    unique, numbers valid, (port, protocol) unique."""
    errors: list[FieldError] = []
    ports = _effective_ports(ports, False)
    names: set[str] = set()
    pairs: set[tuple[Any, str]] = set()
    for i, p in enumerate(ports):
        ppath = f"spec.ports[{i}]"
        name = p.get("name") or ""
        if not name and len(ports) > 1:
            errors.append(apierrors.required(join(ppath, "name")))
        elif name:
            if len(name) > 63:
                errors.append(apierrors.invalid(join(ppath, "name"), name, "must be no more than 63 characters"))
            if not DNS1123_LABEL.match(name):
                errors.append(apierrors.invalid(join(ppath, "name"), name, "a lowercase RFC 1123 label must consist "
                              "of lower case alphanumeric characters or '-', and must start and end with an "
                              "alphanumeric character"))
            if name in names:
                errors.append(apierrors.duplicate(join(ppath, "name"), name))
            names.add(name)
        errors += _port_number_errors(join(ppath, "port"), p.get("port"))
        if p["protocol"] not in PROTOCOLS:
            errors.append(apierrors.not_supported(join(ppath, "protocol"), p["protocol"], PROTOCOLS))
        errors += _target_port_errors(join(ppath, "targetPort"), p.get("targetPort"))
        pair = (p.get("port"), p["protocol"])
        if pair in pairs:
            errors.append(apierrors.duplicate(ppath, {"port": pair[0], "protocol": pair[1]}))
        pairs.add(pair)
    return errors


def _target_port_errors(field: str, value: Any) -> list[FieldError]:
    """ValidatePortNumOrName: a port number or an IANA_SVC_NAME (absent: defaulted to `port`)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [apierrors.invalid(field, value, m) for m in is_valid_port_name(value)]
    return _port_number_errors(field, value)


# ----------------------------------------------------------------- warnings
def warnings(kind: str, obj: dict) -> list[str]:
    """GetWarningsForPod's port warnings: the same containerPort/protocol declared twice in the
    pod (any containers) is accepted with a warning, not refused."""
    path, spec = pod_spec(kind, obj)
    if spec is None:
        return []
    out: list[str] = []
    seen: dict[str, list[tuple[str, dict]]] = {}
    for lst in CONTAINER_LISTS:
        for i, c in enumerate(_dicts(spec.get(lst))):
            for j, p in enumerate(_effective_ports(c.get("ports"), False)):
                here = f"{join(join(path, lst), i)}.ports[{j}]"
                key = f"{p.get('containerPort')}/{p['protocol']}"
                for there, other in seen.get(key, []):
                    out += _port_overlap(here, p, there, other)
                seen.setdefault(key, []).append((here, p))
    return out


def _port_overlap(here: str, p: dict, there: str, other: dict) -> list[str]:
    ip, oip = p.get("hostIP", ""), other.get("hostIP", "")
    hp, ohp = p.get("hostPort", 0), other.get("hostPort", 0)
    if ip == oip and hp == ohp:
        return [f"{here}: duplicate port definition with {there}"]
    if not hp or not ohp:
        return [f"{here}: overlapping port definition with {there}"]
    if hp == ohp and (ip == "") != (oip == ""):
        return [f"{here}: dangerously ambiguous port definition with {there}"]
    return []
