"""Dead-peer detection (runtime/liveness.py): a peer that stops answering without closing its
connection (SIGSTOP: as a node that lost power, nothing is sent) is dropped by a socket with
heartbeats, and never by one without."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from tianji.runtime.liveness import watch_peers

PEER = """
import sys, time, zmq
s = zmq.Context().socket(zmq.PUB)
port = s.bind_to_random_port("tcp://127.0.0.1")
print(port, flush=True)
while True:
    time.sleep(1)
"""


@pytest.fixture
def frozen_peer():
    """A PUB socket in another process; yields (port, freeze)."""
    p = subprocess.Popen([sys.executable, "-c", PEER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())
        yield port, lambda: os.kill(p.pid, signal.SIGSTOP)
    finally:
        os.kill(p.pid, signal.SIGCONT)
        p.kill()
        p.wait()


def _events_until(mon: zmq.Socket, wanted: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if mon.poll(100) and recv_monitor_message(mon)["event"] == wanted:
            return True
    return False


def _connected_sub(port: int, heartbeats: bool) -> tuple[zmq.Socket, zmq.Socket]:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    if heartbeats:
        watch_peers(sub, timeout_ms=1000)
    mon = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
    sub.connect(f"tcp://127.0.0.1:{port}")
    assert _events_until(mon, zmq.EVENT_HANDSHAKE_SUCCEEDED, 10), "never connected"
    return sub, mon


def test_a_peer_that_stops_answering_is_dropped(frozen_peer):
    port, freeze = frozen_peer
    sub, mon = _connected_sub(port, heartbeats=True)
    freeze()
    assert _events_until(mon, zmq.EVENT_DISCONNECTED, 8), "the silent peer was never dropped"
    sub.close()


def test_without_heartbeats_the_silent_peer_is_kept(frozen_peer):
    """The control: the same freeze goes unnoticed by a socket without heartbeats."""
    port, freeze = frozen_peer
    sub, mon = _connected_sub(port, heartbeats=False)
    freeze()
    assert not _events_until(mon, zmq.EVENT_DISCONNECTED, 4)
    sub.close()
