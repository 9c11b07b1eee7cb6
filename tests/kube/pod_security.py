"""Pod Security Standards (https://kubernetes.io/docs/concepts/security/pod-security-standards/),
the Baseline and Restricted profiles' rules as k8s.io/pod-security-admission checks them, worded as
its messages: `violations(pod_spec, "restricted")` -> ["host namespaces (hostNetwork=true)", ...].

The emulator enforces them on pods created in a namespace labelled
`pod-security.kubernetes.io/enforce`, with the apiserver's 403 message; the builder tests
check every generated pod against "restricted"."""
from __future__ import annotations

from typing import Optional

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
LEVELS = ("privileged", "baseline", "restricted")

BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
_VOLUME_KEYS = {"name"}


def _containers(spec: dict) -> list[dict]:
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or []),
            *(spec.get("ephemeralContainers") or [])]


def _names(cs: list[dict]) -> str:
    return ", ".join(f'"{c.get("name")}"' for c in cs)


def _plural(cs: list[dict], one: str, many: str) -> str:
    return f"{one if len(cs) == 1 else many} {_names(cs)}"


def baseline(spec: dict) -> list[str]:
    out = []
    cs = _containers(spec)
    host = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    if host:
        out.append(f"host namespaces ({', '.join(host)})")
    priv = [c for c in cs if (c.get("securityContext") or {}).get("privileged")]
    if priv:
        out.append(f"privileged ({_plural(priv, 'container', 'containers')} must not set "
                   "securityContext.privileged=true)")
    bad_caps = sorted({cap for c in cs for cap in ((c.get("securityContext") or {}).get("capabilities") or {})
                       .get("add") or [] if cap not in BASELINE_CAPABILITIES})
    if bad_caps:
        who = [c for c in cs if set(((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or [])
               - BASELINE_CAPABILITIES]
        out.append(f"non-default capabilities ({_plural(who, 'container', 'containers')} must not include "
                   + ", ".join(f'"{x}"' for x in bad_caps) + " in securityContext.capabilities.add)")
    host_path = [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]
    if host_path:
        out.append(f"hostPath volumes ({_plural([{'name': n} for n in host_path], 'volume', 'volumes')})")
    ports = sorted({p["hostPort"] for c in cs for p in c.get("ports") or [] if p.get("hostPort")})
    if ports:
        out.append(f"hostPort (uses hostPorts {', '.join(map(str, ports))})")
    profiles = [((spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type")] + [
        ((c.get("securityContext") or {}).get("seccompProfile") or {}).get("type") for c in cs]
    if "Unconfined" in profiles:
        out.append('seccompProfile (must not set securityContext.seccompProfile.type to "Unconfined")')
    sysctls = [s["name"] for s in (spec.get("securityContext") or {}).get("sysctls") or []
               if s.get("name") not in SAFE_SYSCTLS]
    if sysctls:
        out.append(f"forbidden sysctls ({', '.join(sysctls)})")
    proc = [c for c in cs if (c.get("securityContext") or {}).get("procMount") not in (None, "Default")]
    if proc:
        out.append(f"procMount ({_plural(proc, 'container', 'containers')} must not set "
                   "securityContext.procMount)")
    return out


def restricted(spec: dict) -> list[str]:
    out = baseline(spec)
    cs = _containers(spec)
    psc = spec.get("securityContext") or {}
    vols = [v for v in spec.get("volumes") or [] if not (set(v) - _VOLUME_KEYS) <= RESTRICTED_VOLUMES]
    if vols:
        out.append(f"restricted volume types ({_plural(vols, 'volume', 'volumes')} "
                   f"use{'s' if len(vols) == 1 else ''} restricted volume type"
                   f"{'' if len(vols) == 1 else 's'})")
    esc = [c for c in cs if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False]
    if esc:
        out.append(f"allowPrivilegeEscalation != false ({_plural(esc, 'container', 'containers')} must set "
                   "securityContext.allowPrivilegeEscalation=false)")
    drop = [c for c in cs if "ALL" not in (((c.get("securityContext") or {}).get("capabilities") or {})
                                           .get("drop") or [])]
    added = [c for c in cs if set(((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or [])
             - {"NET_BIND_SERVICE"}]
    if drop or added:
        parts = []
        if drop:
            parts.append(f'{_plural(drop, "container", "containers")} must set '
                         'securityContext.capabilities.drop=["ALL"]')
        if added:
            caps = sorted({x for c in added for x in c["securityContext"]["capabilities"]["add"]}
                          - {"NET_BIND_SERVICE"})
            parts.append(f'{_plural(added, "container", "containers")} must not include '
                         + ", ".join(f'"{x}"' for x in caps) + " in securityContext.capabilities.add")
        out.append(f"unrestricted capabilities ({'; '.join(parts)})")

    def unset(key: str, good) -> list[dict]:
        pod_ok = good(psc.get(key))
        return [c for c in cs if not (good((c.get("securityContext") or {}).get(key))
                                      or (pod_ok and (c.get("securityContext") or {}).get(key) is None))]

    nonroot = unset("runAsNonRoot", lambda v: v is True)
    if nonroot:
        out.append(f"runAsNonRoot != true (pod or {_plural(nonroot, 'container', 'containers')} must set "
                   "securityContext.runAsNonRoot=true)")
    root = [c for c in cs if (c.get("securityContext") or {}).get("runAsUser") == 0]
    if psc.get("runAsUser") == 0 or root:
        out.append("runAsUser=0 (" + ("pod" if psc.get("runAsUser") == 0 else _plural(root, "container",
                                                                                          "containers"))
                   + " must not set runAsUser=0)")
    seccomp = unset("seccompProfile", lambda v: (v or {}).get("type") in ("RuntimeDefault", "Localhost"))
    if seccomp:
        out.append(f"seccompProfile (pod or {_plural(seccomp, 'container', 'containers')} must set "
                   'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")')
    return out


def violations(spec: dict, level: str = "restricted") -> list[str]:
    if level == "privileged":
        return []
    return restricted(spec) if level == "restricted" else baseline(spec)


def forbidden_message(name: str, level: str, problems: list[str]) -> str:
    """The apiserver's 403 text for a pod refused by Pod Security admission."""
    return f'pods "{name}" is forbidden: violates PodSecurity "{level}:latest": ' + ", ".join(problems)


def enforced_level(namespace: Optional[dict]) -> str:
    level = ((namespace or {}).get("metadata", {}).get("labels") or {}).get(ENFORCE_LABEL, "privileged")
    return level if level in LEVELS else "restricted"
