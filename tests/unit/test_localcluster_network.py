"""A local cluster's address ranges must not swallow the host's own network: its blackhole routes
would cut off a nameserver inside them (DNS gone for the whole machine while the cluster runs)."""
from __future__ import annotations

import subprocess

import pytest

from localcluster import network

ADDR = """1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
2: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever
7: tjc15br    inet 10.215.0.1/24 scope global tjc15br\\       valid_lft forever
"""
ROUTES = """default via 192.0.2.1 dev eth0
10.215.0.0/24 dev tjc15br proto kernel scope link src 10.215.0.1
blackhole 10.215.0.0/16
10.235.0.0/24 via 10.215.0.13 dev tjc15br
blackhole 10.255.0.0/16
10.213.4.0/24 via 192.0.2.1 dev eth0
192.0.2.0/24 dev eth0 proto kernel scope link src 192.0.2.2
"""


@pytest.fixture
def host(monkeypatch, tmp_path):
    """The machine of 2026-12-03: nameserver 10.255.255.53, cluster 15 up; and a route into 10.213/16."""
    def sh(*args, check=True):
        out = {"addr": ADDR, "route": ROUTES}[args[3] if args[1] == "-o" else args[2]]
        return subprocess.CompletedProcess(list(args), 0, out, "")

    monkeypatch.setattr(network, "sh", sh)
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("# written by the image\nnameserver 10.255.255.53\nnameserver 2001:db8::53\nsearch x\n")
    return resolv


def test_a_nameserver_inside_a_clusters_ranges_is_a_conflict(host):
    assert network.conflicts(network.Addressing(15), host) == ["nameserver 10.255.255.53"]


def test_the_hosts_own_routes_and_addresses_conflict_and_the_clusters_do_not(host):
    # 10.213.4.0/24 via eth0 lies in cluster 13's node range; cluster 15's own routes and bridge are its own
    assert network.conflicts(network.Addressing(13), host) == ["route via eth0 10.213.4.0/24"]
    assert network.conflicts(network.Addressing(14), host) == []
    assert network.conflicts(network.Addressing(3), host) == []


def test_the_bridge_refuses_ranges_that_hold_the_hosts_nameserver(host, monkeypatch):
    calls = []
    monkeypatch.setattr(network, "conflicts", lambda a: ["nameserver 10.255.255.53"] if a.index == 15 else [])
    monkeypatch.setattr(network, "sh", lambda *args, check=True: calls.append(args))
    with pytest.raises(RuntimeError, match=r"cluster 15: .*10\.255\.0\.0/16.*nameserver 10\.255\.255\.53.*--index"):
        network.up_bridge(network.Addressing(15))
    assert calls == []  # no blackhole route was added


def test_taking_a_cluster_down_removes_its_routes_and_spares_the_hosts(monkeypatch):
    routes = ("default via 192.0.2.1 dev eth0\n10.233.1.0/24 via 10.213.0.12 dev tjc13br\n"
              "10.233.4.0/24 via 192.0.2.1 dev eth0\n")
    calls = []

    def sh(*args, check=True):
        calls.append(args)
        return subprocess.CompletedProcess(list(args), 0, routes if args[1:3] == ("route", "show") else "", "")

    monkeypatch.setattr(network, "sh", sh)
    monkeypatch.setattr(network, "namespaces", lambda: [])
    network.down_all(network.Addressing(13))
    deleted = [c[3] for c in calls if c[1:3] == ("route", "del") and c[3] != "blackhole"]
    assert deleted == ["10.233.1.0/24"]
