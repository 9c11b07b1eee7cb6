"""ZeroMQ over a named interface (`spec.network.interface`, e.g. ib0 for IPoIB).

Under host networking a pod's address (and the DNS record peers look up) is the node's
InternalIP, usually on the Ethernet management network. With `network.interface` set,
every worker binds its data sockets on the IPv4 address of that interface instead,
resolved when it starts (`interface_ipv4`), and says so on its metrics port
(`GET /fabric` -> {"address": "10.1.0.5"}). A peer that connects to it asks there first,
through the pod's DNS name, and then connects to the fabric address: the same bootstrap
NCCL does (a rendezvous on the management network, data on the fabric). Transport is
still ZeroMQ over TCP (IPoIB), not RDMA verbs.

What comes back from a peer is validated (size, JSON, one unicast IPv4 address), never
trusted as more.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import json
import socket
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Callable

FABRIC_PATH = "/fabric"
MAX_REPLY = 256  # bytes: {"address": "255.255.255.255"} fits many times over
SIOCGIFADDR = 0x8915  # linux/sockios.h
IFNAMSIZ = 16


class FabricError(RuntimeError):
    """The interface or a peer's fabric address cannot be had."""


def interface_ipv4(name: str) -> str:
    """The IPv4 address of interface `name` on this host (SIOCGIFADDR); FabricError naming the
    interface when it does not exist or has no IPv4 address."""
    names = [n for _, n in socket.if_nameindex()]
    if name not in names:
        raise FabricError(
            f"network.interface {name!r}: no such interface on this host (it has {', '.join(names) or 'none'})"
        )
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            req = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[: IFNAMSIZ - 1]))
        except OSError as e:
            if e.errno == errno.EADDRNOTAVAIL:
                raise FabricError(
                    f"network.interface {name!r} has no IPv4 address (is it up and configured, "
                    "e.g. IPoIB with an address?)"
                ) from None
            raise FabricError(f"network.interface {name!r}: {e}") from None
    return socket.inet_ntoa(req[20:24])  # struct ifreq: name[16], sockaddr_in (family, port, addr)


def fabric_reply(address: str) -> bytes:
    return json.dumps({"address": address}).encode()


def parse_fabric_reply(body: bytes) -> str:
    """The address in a peer's /fabric reply; ValueError unless it is one unicast IPv4 address."""
    if len(body) > MAX_REPLY:
        raise ValueError(f"fabric reply of {len(body)} bytes (at most {MAX_REPLY})")
    try:
        doc = json.loads(body)
        ip = ipaddress.IPv4Address(doc["address"])
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"not a fabric reply: {e}") from None
    if ip.is_unspecified or ip.is_multicast or ip.is_reserved or ip == ipaddress.IPv4Address("255.255.255.255"):
        raise ValueError(f"fabric reply names {ip}, not a host's address")
    return str(ip)


def _get(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (http only, built below)
        return resp.read(MAX_REPLY + 1)


def fetch_fabric_address(
    host: str,
    port: int,
    wait_s: float = 300.0,
    *,
    get: Callable[[str, float], bytes] = _get,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Ask the peer at host:port (its metrics port) for its fabric address, retrying while it
    starts (up to `wait_s`); FabricError naming the peer after that, or at once on a bad reply."""
    url = f"http://{host}:{port}{FABRIC_PATH}"
    deadline = clock() + wait_s
    last = ""
    while True:
        try:
            body = get(url, 2.0)
        except (OSError, urllib.error.URLError) as e:  # not up yet, DNS record not there yet
            last = str(e)
        else:
            try:
                return parse_fabric_reply(body)
            except ValueError as e:
                raise FabricError(f"{url}: {e}") from None
        if clock() >= deadline:
            raise FabricError(f"{url}: no fabric address after {wait_s:.0f} s ({last})")
        sleep(1.0)
