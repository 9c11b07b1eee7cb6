"""Dead-peer detection on TCP links: ZMTP heartbeats, so a peer that vanished without closing its
connections (its node lost power, its network namespace was torn down) is noticed in seconds.

Without them a connecting socket keeps a half-open TCP connection to the old address for as long
as the kernel does (a SUB never sends, so never notices at all) and never re-resolves the peer's
DNS name: actors would follow a learner that no longer exists while its replacement, on another
node under the same name, publishes to no one. With them the socket drops the connection after
HEARTBEAT_TIMEOUT_MS without traffic, reconnects, and libzmq resolves the name again.

The PINGs are answered by libzmq's I/O thread, not by Python: a learner busy in a long update
(holding the GIL) still answers, so the timeout can be short. Torch-free (the buffer imports it).
"""
from __future__ import annotations

import zmq

HEARTBEAT_IVL_MS = 1000  # a PING after a second without traffic
HEARTBEAT_TIMEOUT_MS = 10_000  # no traffic for this long after a PING: the connection is closed
HEARTBEAT_TTL_MS = 10_000  # asks the peer to drop us too after this long without our traffic
RECONNECT_IVL_MAX_MS = 2000  # reconnect attempts back off from 100 ms up to this


def watch_peers(sock: zmq.Socket, timeout_ms: int = HEARTBEAT_TIMEOUT_MS) -> None:
    """Heartbeats on a TCP socket (bound or connecting; IPC peers die with their host)."""
    sock.setsockopt(zmq.HEARTBEAT_IVL, min(HEARTBEAT_IVL_MS, max(100, timeout_ms // 4)))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, timeout_ms)
    sock.setsockopt(zmq.HEARTBEAT_TTL, min(HEARTBEAT_TTL_MS, timeout_ms))
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
