"""`tianji profile --link-serve / --link-measure`: link bandwidth and latency over ZeroMQ tcp (127.0.0.1)."""
from __future__ import annotations

import json
import math
import socket
import threading

import pytest
import zmq

from tianji.cli import main
from tianji.control.planner import costmodel
from tianji.control.planner.plan import Profile, load_profile
from tianji.runtime.profiling.linkprobe import TAG, measure_link, parse_endpoint, serve_link


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server(port: int, seconds: float = 120.0) -> threading.Thread:
    ready = threading.Event()
    th = threading.Thread(target=serve_link, args=("127.0.0.1", port, seconds), kwargs={"ready": ready}, daemon=True)
    th.start()
    assert ready.wait(10)
    return th


def test_measure_over_loopback_and_into_the_profile_file(tmp_path):
    port = _free_port()
    _server(port)
    res = measure_link("127.0.0.1", port, seconds=0.4, size=1 << 20)
    assert math.isfinite(res["link_bytes_per_second"]) and res["link_bytes_per_second"] > 1e6  # > 8 Mbit/s
    assert 0 <= res["link_latency_s"] < 0.1
    assert res["link"]["big_round_trips"] >= 5 and res["link"]["small_round_trips"] >= 20
    # The CLI merges it into an existing profile; the planner then uses it across nodes.
    prof = {"actor_fps_per_core": 1000.0, "learner_sps_per_core": 1000.0, "message_seconds": 1e-4,
            "fragment_samples": 64, "bytes_per_sample": 32.0, "detail": {"kept": True}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    assert main(["profile", "--link-measure", f"127.0.0.1:{port}", "--seconds", "0.3", "--link-bytes",
                 str(1 << 18), "--out", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert doc["detail"] == {"kept": True} and doc["link"]["endpoint"] == f"tcp://127.0.0.1:{port}"
    p = load_profile(path)
    assert p.measured_link() == (doc["link_bytes_per_second"], doc["link_latency_s"])
    link = costmodel.link_for(None, 2, p.ipc_bytes_per_second, p.measured_link())
    assert link.name == "measured" and link.bytes_per_s == doc["link_bytes_per_second"]
    assert costmodel.link_for(None, 1, None, p.measured_link()).name == "loopback"  # one node: no link


def test_server_answers_malformed_requests_and_keeps_serving():
    port = _free_port()
    _server(port)
    ctx = zmq.Context()
    s = ctx.socket(zmq.REQ)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, 5000)
    s.connect(f"tcp://127.0.0.1:{port}")
    try:
        for bad in ([b"other-tag", b"x"], [TAG, b"a", b"b"], [TAG]):
            s.send_multipart(bad)
            assert s.recv_multipart()[1].startswith(b"error")
        s.send_multipart([TAG, b"12345"])
        assert s.recv_multipart() == [TAG, b"5"]
    finally:
        s.close()
        ctx.term()


def test_no_server_is_a_clear_error(capsys):
    port = _free_port()
    with pytest.raises(ValueError, match="no answer"):
        measure_link("127.0.0.1", port, seconds=0.1, size=16, timeout_s=0.3)
    assert main(["profile", "--link-measure", "nohost"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [{"link_bytes_per_second": float("nan"), "link_latency_s": 1e-4},
                                 {"link_bytes_per_second": 1e9, "link_latency_s": -1.0},
                                 {"link_bytes_per_second": 1e9, "link_latency_s": 1e9},
                                 {"link_bytes_per_second": 1e9}])
def test_profile_refuses_bad_link_figures(bad):
    d = {"actor_fps_per_core": 1.0, "learner_sps_per_core": 1.0, "message_seconds": 0.0, "fragment_samples": 1,
         "bytes_per_sample": 1.0, **bad}
    with pytest.raises(ValueError, match="link"):
        Profile.from_json(d)


def test_parse_endpoint():
    assert parse_endpoint("10.0.0.2:7000") == ("10.0.0.2", 7000)
    assert parse_endpoint("7000", default_host="0.0.0.0") == ("0.0.0.0", 7000)
    for bad in ("7000", "h:0", "h:70000", "h:x", ":80"):
        with pytest.raises(ValueError):
            parse_endpoint(bad)


def test_cli_serve_and_measure(capsys):
    port = _free_port()
    th = threading.Thread(target=main, args=(["profile", "--link-serve", f"127.0.0.1:{port}",
                                              "--link-serve-seconds", "60"],), daemon=True)
    th.start()
    assert main(["profile", "--link-measure", f"127.0.0.1:{port}", "--seconds", "0.2", "--link-bytes", "65536"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["link_bytes_per_second"] > 0 and out["link"]["payload_bytes"] == 65536
    assert main(["profile", "--link-serve", "1", "--link-measure", "h:1"]) == 2
    assert main(["profile"]) == 2
