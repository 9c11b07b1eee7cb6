"""Link bandwidth and latency between two hosts over ZeroMQ tcp, for the planner's link terms.

    tianji profile --link-serve [HOST:]PORT               on one host (pod): echo until stopped
    tianji profile --link-measure HOST:PORT [--out FILE]  on the other: measure, write into FILE

Protocol (REQ -> REP, two frames each way, nothing unpickled): [TAG, payload] in,
[TAG, ascii length of the payload received] out. Latency λ = median round trip of 1-byte
requests / 2; bandwidth = size / (median round trip of `size`-byte requests − 2λ). The
measurement is plaintext (it carries only zeros): serve it only for the measurement.
The result keys (link_bytes_per_second, link_latency_s) are what `plan.Profile` reads:
across nodes with no spec.network.link, the planner uses them instead of ethernet-10g.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from typing import Optional

from tianji.runtime.atomicfile import atomic_write_json

TAG = b"tianji-link/1"
MAX_PAYLOAD = 64 << 20  # refuse larger requests (a peer could otherwise make the server buffer anything)
DEFAULT_SIZE = 4 << 20


def parse_endpoint(text: str, default_host: Optional[str] = None) -> tuple[str, int]:
    """'HOST:PORT' (or 'PORT' when default_host is given) -> (host, port); ValueError otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host = default_host or ""
    if not host or any(c.isspace() for c in host) or len(host) > 253:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"port must be 1..65535, got {port!r}")
    return host, int(port)


def serve_link(host: str, port: int, max_seconds: Optional[float] = None, max_requests: Optional[int] = None,
               ready=None) -> int:
    """Echo lengths on tcp://host:port until max_seconds / max_requests (or forever); requests served.
    A malformed request (frame count, tag, size) is answered with an error and does not stop it."""
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.REP)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_PAYLOAD + len(TAG) + 64)  # oversize peers are disconnected by zmq
    served = 0
    try:
        sock.bind(f"tcp://{host}:{port}")
        if ready is not None:
            ready.set()
        t0 = time.monotonic()
        while (max_requests is None or served < max_requests) and \
                (max_seconds is None or time.monotonic() - t0 < max_seconds):
            if not sock.poll(200):
                continue
            frames = sock.recv_multipart(copy=False)
            if len(frames) != 2 or frames[0].bytes != TAG:
                sock.send_multipart([TAG, b"error: expected [tag, payload]"])
                continue
            sock.send_multipart([TAG, str(len(frames[1])).encode()])
            served += 1
    finally:
        sock.close()
        ctx.term()
    return served


def measure_link(host: str, port: int, seconds: float = 2.0, size: int = DEFAULT_SIZE,
                 timeout_s: float = 10.0) -> dict:
    """Latency and bandwidth to a `serve_link` peer (module docstring); ValueError if it does not answer."""
    import zmq

    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"seconds must be > 0, got {seconds!r}")
    if not 1 <= size <= MAX_PAYLOAD:
        raise ValueError(f"size must be 1..{MAX_PAYLOAD}, got {size!r}")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))
    sock.setsockopt(zmq.SNDTIMEO, int(timeout_s * 1000))
    endpoint = f"tcp://{host}:{port}"
    payload_big, payload_small = bytes(size), b"\0"

    def round_trip(payload: bytes) -> float:
        t = time.perf_counter()
        sock.send_multipart([TAG, payload], copy=False)
        try:
            reply = sock.recv_multipart()
        except zmq.Again:
            raise ValueError(f"{endpoint}: no answer within {timeout_s:g} s (is `tianji profile --link-serve` "
                             "running there?)") from None
        dt = time.perf_counter() - t
        if len(reply) != 2 or reply[0] != TAG or reply[1] != str(len(payload)).encode():
            raise ValueError(f"{endpoint}: unexpected reply {[r[:64] for r in reply]!r}")
        return dt

    try:
        sock.connect(endpoint)
        round_trip(payload_small)  # connect and warm up
        small, big = [], []
        t_end = time.perf_counter() + seconds / 2
        while time.perf_counter() < t_end or len(small) < 20:
            small.append(round_trip(payload_small))
        rtt = statistics.median(small)
        t_end = time.perf_counter() + seconds / 2
        while time.perf_counter() < t_end or len(big) < 5:
            big.append(round_trip(payload_big))
    finally:
        sock.close()
        ctx.term()
    transfer = max(statistics.median(big) - rtt, 1e-9)
    return {"link_bytes_per_second": size / transfer, "link_latency_s": rtt / 2,
            "link": {"endpoint": endpoint, "payload_bytes": size, "small_round_trips": len(small),
                     "big_round_trips": len(big), "rtt_median_s": rtt, "big_rtt_median_s": statistics.median(big),
                     "transport": "zeromq tcp, plaintext", "measured_at": time.time()}}


def link_command(args: argparse.Namespace) -> int:
    """`tianji profile --link-serve / --link-measure`; the measurement merges into --out."""
    if args.link_serve and args.link_measure:
        print("tianji profile: give --link-serve or --link-measure, not both", file=sys.stderr)
        return 2
    try:
        if args.link_serve:
            host, port = parse_endpoint(args.link_serve, default_host="0.0.0.0")
            limit = getattr(args, "link_serve_seconds", None)
            if limit is not None and not limit > 0:
                raise ValueError("--link-serve-seconds must be > 0")
            print(f"tianji profile: serving link measurements on tcp://{host}:{port}", file=sys.stderr)
            served = serve_link(host, port, max_seconds=limit)
            print(f"tianji profile: served {served} requests", file=sys.stderr)
            return 0
        host, port = parse_endpoint(args.link_measure)
        res = measure_link(host, port, float(getattr(args, "seconds", None) or 3.0),
                           int(getattr(args, "link_bytes", None) or 4 << 20))
    except ValueError as e:
        print(f"tianji profile: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    out = getattr(args, "out", None)
    if not out:
        print(json.dumps(res, indent=2))
        return 0
    try:
        with open(out) as f:
            doc = json.load(f)
    except FileNotFoundError:
        doc = {}
    except json.JSONDecodeError as e:
        print(f"tianji profile: {out}: not valid JSON ({e}); not overwritten", file=sys.stderr)
        return 2
    if not isinstance(doc, dict):
        print(f"tianji profile: {out}: not a JSON object; not overwritten", file=sys.stderr)
        return 2
    doc.update(res)
    atomic_write_json(out, doc)
    print(f"tianji profile: link {res['link_bytes_per_second'] * 8 / 1e9:,.2f} Gbit/s, "
          f"{res['link_latency_s'] * 1e6:,.0f} µs one-way; wrote {out}", file=sys.stderr)
    return 0
