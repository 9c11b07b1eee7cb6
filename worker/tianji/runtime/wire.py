"""Wire format: one msgpack header frame + one raw frame per array. No pickle.

    frame 0 : msgpack map {"k": kind, "v": schema, "job": str, "from": str,
              "seq": int, "pv": policy_version, "arr": [[name, dtype, shape], ...],
              "meta": {str: scalar | list | map}}
    frame i : the raw bytes of array i-1 (C order), sent with copy=False

A receiver trusts nothing: `decode` checks the frame count, that the header is
a msgpack map of the known schema (msgpack has no code-execution types; ext
types are refused), the kind, the job, each dtype against an allow-list, and
that prod(shape) * itemsize == len(frame) within size caps, that seq and
policy_version are non-negative integers below 2**62, that the header has no
field beyond these, and that meta holds at most MAX_META_ITEMS keys and items. Any failure raises
WireError(reason); callers drop the message and count the reason (and count any
other exception as a reject too: see roles/base.py). What the arrays must hold
for a given job is checked by runtime/validate.py.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import zmq

SCHEMA_VERSION = 1
KINDS = frozenset({"fragment", "batch", "params", "credit", "report"})
DTYPES = frozenset({"uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "bool"})
MAX_HEADER_BYTES = 64 * 1024
MAX_ARRAYS = 256
MAX_NDIM = 8
MAX_META_DEPTH = 4
MAX_META_ITEMS = 2048  # keys and list items of a meta map, nested ones included (a report has ~420)
MAX_INT = 1 << 62  # seq and policy_version: non-negative and far inside int64
# numpy dtype objects by wire name and back: `ndarray.dtype.name` costs ~3 µs per call,
# a dict lookup ~0.1 µs. Native byte order only (a '>f4' array is not 'float32' here).
_DT = {n: np.dtype(n) for n in DTYPES}
_NAME = {dt: n for n, dt in _DT.items()}
_SNDMORE = zmq.SNDMORE
_Frame = zmq.Frame
_SCALARS = frozenset({type(None), bool, int, float, str})
_ndarray = np.ndarray
# one Packer for the process (msgpack.packb builds one per call: ~0.4 µs of the ~1 µs it costs).
# Shared safely: the header holds builtin types only, so `pack` runs to its end under the GIL
# (and the roles send from one thread; the metrics thread sends nothing).
_pack = msgpack.Packer(use_bin_type=True).pack
_unpackb = msgpack.unpackb


class WireError(ValueError):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass
class Message:
    kind: str
    sender: str = ""
    seq: int = 0
    policy_version: int = 0
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    nbytes: int = 0


@dataclass(frozen=True)
class Limits:
    max_frame_bytes: int = 256 * 1024 * 1024
    max_total_bytes: int = 512 * 1024 * 1024
    kinds: frozenset = KINDS


def encode(kind: str, job: str, sender: str, seq: int, policy_version: int,
           arrays: Mapping[str, np.ndarray] | None = None, meta: Mapping[str, Any] | None = None) -> list:
    """Frames for `send` (zero-copy); arrays are not copied if already C-contiguous."""
    if kind not in KINDS:
        raise ValueError(f"unknown message kind {kind!r}")
    specs, bufs = [], []
    if arrays:
        for name, a in arrays.items():
            if type(a) is not _ndarray or not a.ndim or not a.flags.c_contiguous:
                a = np.ascontiguousarray(a)  # (a 0-d array becomes shape (1,), as it always has)
            dt = _NAME.get(a.dtype)
            if dt is None:
                raise ValueError(f"array {name!r}: dtype {a.dtype} is not allowed on the wire")
            specs.append((name, dt, a.shape))
            bufs.append(memoryview(a).cast("B") if a.size else b"")
    header = _pack({"k": kind, "v": SCHEMA_VERSION, "job": job, "from": sender, "seq": int(seq),
                    "pv": int(policy_version), "arr": specs, "meta": dict(meta) if meta else {}})
    return [header, *bufs]


def _refuse_ext(code: int, data: bytes) -> Any:
    raise WireError("header", f"msgpack ext type {code} refused")


def _check_meta(v: Any, depth: int = 0) -> int:
    """Checks a nested meta value; returns its keys and list items (bounded by MAX_META_ITEMS)."""
    if depth > MAX_META_DEPTH:
        raise WireError("meta", "nested too deep")
    if v is None or isinstance(v, (bool, int, float, str)):
        return 0
    if isinstance(v, list):
        n = len(v)
        for x in v:
            n += _check_meta(x, depth + 1)
            if n > MAX_META_ITEMS:
                raise WireError("meta", f"more than {MAX_META_ITEMS} items")
        return n
    if isinstance(v, dict):
        n = len(v)
        for k, x in v.items():
            if not isinstance(k, str):
                raise WireError("meta", "non-string key")
            n += _check_meta(x, depth + 1)
            if n > MAX_META_ITEMS:
                raise WireError("meta", f"more than {MAX_META_ITEMS} items")
        return n
    raise WireError("meta", f"type {type(v).__name__} not allowed")


def _buffer(frame: Any) -> memoryview:
    """The bytes of a frame without copying: a zmq.Frame (copy=False), bytes or a memoryview."""
    buf = getattr(frame, "buffer", frame)
    return memoryview(buf).cast("B") if type(buf) is not memoryview or buf.format != "B" else buf


_HEADER_KEYS = frozenset({"k", "v", "job", "from", "seq", "pv", "arr", "meta"})


def decode(frames: Sequence[Any], job: str | None = None, limits: Limits = Limits()) -> Message:
    """Validate and decode one multipart message. Raises WireError(reason) on anything off.

    Arrays are views of the received frames (zmq.Frame buffers with copy=False): each view holds
    its frame, so libzmq cannot reuse the memory while an array lives; a receiver that keeps data
    past the message copies it once, where it stores it (the buffer's ring, the replay)."""
    if not frames:
        raise WireError("frames", "empty message")
    head = frames[0]
    if type(head) is not _Frame:  # msgpack reads a zmq.Frame's buffer as it is
        head = _buffer(head)
    if len(head) > MAX_HEADER_BYTES:
        raise WireError("size", f"header of {len(head)} bytes")
    try:
        h = _unpackb(head, raw=False, strict_map_key=True, ext_hook=_refuse_ext,
                     max_bin_len=MAX_HEADER_BYTES, max_str_len=MAX_HEADER_BYTES)
    except WireError:
        raise
    except Exception as e:  # msgpack raises several types for garbage
        b = _buffer(head)  # a pickle stream (b"\x80" ... b".") is no msgpack map: named here
        if b[:1] == b"\x80" and b[-1:] == b".":
            raise WireError("pickle", "pickle stream refused") from None
        raise WireError("header", f"not a msgpack header ({type(e).__name__})") from None
    if type(h) is not dict:
        raise WireError("header", "header is not a map")
    if not _HEADER_KEYS.issuperset(h):  # (also every non-string key)
        raise WireError("header", f"unknown header fields {sorted(map(repr, set(h) - _HEADER_KEYS))[:4]}")
    v = h.get("v")
    if type(v) is not int or v != SCHEMA_VERSION:
        raise WireError("schema", f"schema version {v!r}, expected {SCHEMA_VERSION}")
    kind = h.get("k")
    if type(kind) is not str or kind not in limits.kinds:
        raise WireError("kind", f"kind {kind!r}")
    if job is not None and h.get("job") != job:  # `job` is a str: equal only to the same str
        raise WireError("job", f"job {h.get('job')!r}")
    sender, seq, pv = h.get("from", ""), h.get("seq", 0), h.get("pv", 0)
    if type(seq) is not int or type(pv) is not int or type(sender) is not str:  # (bool is refused)
        if type(sender) is not str or not isinstance(seq, int) or not isinstance(pv, int):
            raise WireError("header", "bad sender/seq/pv types")
        raise WireError("header", "sender/seq/pv out of range")
    if not (0 <= seq < MAX_INT and 0 <= pv < MAX_INT) or len(sender) > 256:
        raise WireError("header", "sender/seq/pv out of range")
    meta = h.get("meta", {})
    if type(meta) is not dict:
        raise WireError("meta", "meta is not a map")
    items = len(meta)
    if items > MAX_META_ITEMS:
        raise WireError("meta", f"more than {MAX_META_ITEMS} items")
    for k, x in meta.items():  # flat scalars (the usual meta) need no recursion
        if type(k) is not str:
            raise WireError("meta", "non-string key")
        if type(x) not in _SCALARS:
            items += _check_meta(x, 1)
            if items > MAX_META_ITEMS:
                raise WireError("meta", f"more than {MAX_META_ITEMS} items")
    specs = h.get("arr", [])
    if type(specs) is not list or len(specs) > MAX_ARRAYS:
        raise WireError("header", "bad array list")
    if len(frames) != len(specs) + 1:
        raise WireError("frames", f"{len(frames) - 1} array frames for {len(specs)} arrays")
    arrays: dict[str, np.ndarray] = {}
    total = 0
    max_frame = limits.max_frame_bytes
    for i, spec in enumerate(specs, 1):
        if not (type(spec) is list and len(spec) == 3 and type(spec[0]) is str
                and type(spec[1]) is str and type(spec[2]) is list):
            raise WireError("header", "bad array spec")
        name, dtype, shape = spec
        dt = _DT.get(dtype)
        if dt is None:
            raise WireError("dtype", f"{name}: dtype {dtype!r}")
        if len(shape) > MAX_NDIM:
            raise WireError("shape", f"{name}: shape {shape!r}")
        for d in shape:
            if type(d) is not int or not 0 <= d < MAX_INT:  # bool is refused too
                raise WireError("shape", f"{name}: shape {shape!r}")
        count = math.prod(shape)
        if count > max_frame:
            raise WireError("size", f"{name}: shape {shape!r}")
        want = count * dt.itemsize
        if want > max_frame:
            raise WireError("size", f"{name}: {want} bytes > {max_frame}")
        buf = frames[i]
        if type(buf) is not _Frame:  # a zmq.Frame is a byte buffer already (len = bytes)
            buf = _buffer(buf)
        if len(buf) != want:
            raise WireError("shape", f"{name}: frame has {len(buf)} bytes, shape x itemsize = {want}")
        total += want
        if total > limits.max_total_bytes:
            raise WireError("size", f"message over {limits.max_total_bytes} bytes")
        if name in arrays:
            raise WireError("header", f"duplicate array {name!r}")
        # a view of the frame, no copy; the array holds the frame (its `base`), so libzmq cannot
        # free or reuse the memory while the array lives
        arrays[name] = np.ndarray(shape, dt, buf)
    return Message(kind, sender, seq, pv, arrays, meta, total + len(head))  # (positional: faster)


def send(sock: Any, frames: Sequence[Any], flags: int = 0) -> None:
    """Send `encode`'s frames zero-copy (pyzmq copies parts under its copy_threshold anyway).
    One `send` per part: `send_multipart` re-checks every part's type in Python first, which
    costs more than the send of a small part. Raises zmq.Again (nothing sent) under NOBLOCK
    when the peer's queue is full: ZeroMQ queues the parts after the first atomically."""
    last = len(frames) - 1
    if last == 0:
        sock.send(frames[0], flags)
        return
    more = flags | _SNDMORE
    sock.send(frames[0], more)  # the header: a few hundred bytes, copied
    for i in range(1, last):
        sock.send(frames[i], more, copy=False)
    sock.send(frames[last], flags, copy=False)


def recv(sock: Any, flags: int = 0) -> list:
    """One multipart message as zmq.Frames (copy=False: no copy of the payload), for `decode`.
    A message with more parts than any valid one is drained to its end and returned cut at
    MAX_ARRAYS + 2 parts (decode refuses it), so a peer cannot make a receiver hold them all."""
    f = sock.recv(flags, copy=False)
    frames = [f]
    while f.more:
        f = sock.recv(flags, copy=False)
        if len(frames) <= MAX_ARRAYS + 1:
            frames.append(f)
    return frames
