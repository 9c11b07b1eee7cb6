"""spec.network.interface: data sockets on a named interface's IPv4 address, peers told where
through /fabric (tianji.control.contracts.fabric). Exercised on the loopback interface `lo`."""
from __future__ import annotations

import logging
import socket
import urllib.error

import pytest
import yaml
import zmq
from prometheus_client import CollectorRegistry

from tianji.cli import build_parser
from tianji.control.contracts.addressing import Addresses, metrics_port
from tianji.control.contracts.fabric import FabricError, fetch_fabric_address, interface_ipv4, parse_fabric_reply
from tianji.control.contracts.launch import worker_launch
from tianji.control.spec import SpecError, parse_job
from tianji.observability.metrics import serve_registry


def _job(network: dict, name: str = "cp"):
    return parse_job({"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob", "metadata": {"name": name},
                      "spec": {"network": network}})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_interface_address_or_an_error_naming_the_interface():
    assert interface_ipv4("lo") == "127.0.0.1"
    with pytest.raises(FabricError, match=r"'tjbogus0': no such interface on this host \(it has .*lo"):
        interface_ipv4("tjbogus0")


def test_the_spec_takes_an_interface_only_with_host_networking():
    assert _job({"hostNetwork": True, "interface": "ib0"}).spec.network.interface == "ib0"
    with pytest.raises(SpecError, match="interface needs hostNetwork: true"):
        _job({"interface": "ib0"})
    with pytest.raises(SpecError, match="not a network interface name"):
        _job({"hostNetwork": True, "interface": "ib0; rm -rf /"})
    env = worker_launch(_job({"hostNetwork": True, "interface": "ib0"}), "learner", 0, 0, engine="pod",
                        job_file="/etc/tianji/job.yaml").env
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "ib0"


@pytest.mark.parametrize("body", [b"x" * 300, b"not json", b'{"address": "::1"}', b'{"address": "0.0.0.0"}',
                                  b'{"address": "224.0.0.1"}', b'{"addr": "10.0.0.1"}', b'["10.0.0.1"]'])
def test_a_peer_reply_other_than_one_host_address_is_refused(body):
    with pytest.raises(ValueError):
        parse_fabric_reply(body)
    with pytest.raises(FabricError, match="http://peer:9090/fabric"):
        fetch_fabric_address("peer", 9090, get=lambda url, t: body)


def test_fetch_waits_for_a_starting_peer_then_gives_up_naming_it():
    now = [0.0]
    replies = iter([urllib.error.URLError("refused"), OSError("no route"), b'{"address": "10.1.0.5"}'])

    def get(url, timeout):
        r = next(replies)
        if isinstance(r, Exception):
            raise r
        return r

    def sleep(s):
        now[0] += s

    assert fetch_fabric_address("peer", 9090, get=get, sleep=sleep, clock=lambda: now[0]) == "10.1.0.5"
    with pytest.raises(FabricError, match=r"http://peer:9090/fabric: no fabric address after 5 s \(down\)"):
        fetch_fabric_address("peer", 9090, 5, get=lambda u, t: (_ for _ in ()).throw(OSError("down")),
                             sleep=sleep, clock=lambda: now[0])


def test_peers_connect_to_the_fabric_address_over_lo(monkeypatch):
    """A learner's batches socket bound on lo's address; a buffer finds it through the learner's
    /fabric (reached by the pod's DNS name, here resolved by a stand-in for cluster DNS) and
    sends it a message."""
    ip = interface_ipv4("lo")
    base, metrics = _free_port(), _free_port() - 100
    learner_metrics = metrics_port(metrics, "learner", 0, 0, 1)
    server = serve_registry(CollectorRegistry(), learner_metrics, "127.0.0.1", fabric=ip)
    real = socket.getaddrinfo
    dns = {"cp-learner-0-0.cp.rl.svc"}  # the headless Service's record of the learner pod
    monkeypatch.setattr(socket, "getaddrinfo",
                        lambda host, *a, **k: real("127.0.0.1" if host in dns else host, *a, **k))
    owner = Addresses("cp", base, None, "rl", ip, 1)
    peer = Addresses("cp", base, None, "rl", "10.9.9.9", 1, fabric_metrics_port=metrics)
    ctx = zmq.Context.instance()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    try:
        assert owner.bind("batches", 0, 0) == f"tcp://127.0.0.1:{base + 2}"
        pull.bind(owner.bind("batches", 0, 0))
        endpoint = peer.connect("batches", 0, 0)
        assert endpoint == f"tcp://127.0.0.1:{base + 2}"  # the fabric address, not the DNS name
        push.connect(endpoint)
        push.send(b"batch")
        assert pull.poll(5000) and pull.recv() == b"batch"
        plain = Addresses("cp", base, None, "rl", ip, 1)  # no interface: the DNS name, as before
        assert plain.connect("batches", 0, 0) == f"tcp://cp-learner-0-0.cp.rl.svc:{base + 2}"
    finally:
        push.close(0)
        pull.close(0)
        server.shutdown()


def test_a_worker_whose_interface_is_missing_stops_with_its_name(tmp_path, caplog):
    job = _job({"hostNetwork": True, "interface": "tjbogus0"})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job.to_manifest()))
    a = build_parser().parse_args(["worker", "--role", "learner", "--group", "0", "--index", "0", "--job", str(path)])
    with caplog.at_level(logging.ERROR, logger="tianji"):
        assert a.fn(a) == 1
    assert "network.interface 'tjbogus0': no such interface" in caplog.text
