"""Wire format: round trip, and every kind of bad message is refused with its reason."""
import pickle

import msgpack
import numpy as np
import pytest

from tianji.runtime.wire import Limits, WireError, decode, encode


def frames_of(**arrays):
    return encode("fragment", "job", "actor-0-0", 7, 3, arrays, meta={"frames": 10})


def test_round_trip_keeps_arrays_and_header():
    obs = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    msg = decode(frames_of(obs=obs, valid=np.ones((2, 3), bool)), job="job")
    assert msg.kind == "fragment" and msg.sender == "actor-0-0" and msg.seq == 7 and msg.policy_version == 3
    np.testing.assert_array_equal(msg.arrays["obs"], obs)
    assert msg.arrays["valid"].dtype == bool and msg.meta == {"frames": 10}


def reason(frames, **kw):
    with pytest.raises(WireError) as e:
        decode(frames, job="job", **kw)
    return e.value.reason


def test_truncated_array_frame_is_rejected():
    f = frames_of(obs=np.zeros((4, 4), np.float32))
    f[1] = bytes(f[1])[:-4]
    assert reason(f) == "shape"


def test_missing_frame_is_rejected():
    f = frames_of(obs=np.zeros(4, np.float32), act=np.zeros(4, np.int64))
    assert reason(f[:-1]) == "frames"


def test_oversized_array_is_rejected_before_use():
    f = frames_of(obs=np.zeros(1024, np.float32))
    assert reason(f, limits=Limits(max_frame_bytes=1000)) == "size"


def test_pickled_message_is_rejected():
    assert reason([pickle.dumps({"k": "fragment", "v": 1})]) == "pickle"
    assert reason([pickle.dumps(np.zeros(3))]) in ("pickle", "header")


def test_garbage_and_non_map_headers_are_rejected():
    assert reason([b"\xff\x00garbage"]) == "header"
    assert reason([msgpack.packb([1, 2, 3])]) == "header"


def test_unknown_kind_schema_job_dtype():
    def hdr(**kw):
        h = {"k": "fragment", "v": 1, "job": "job", "from": "x", "seq": 0, "pv": 0, "arr": [], "meta": {}}
        h.update(kw)
        return [msgpack.packb(h)]

    assert reason(hdr(k="exec")) == "kind"
    assert reason(hdr(v=99)) == "schema"
    assert reason(hdr(job="other")) == "job"
    assert reason(hdr(arr=[["x", "object", [1]]]) + [b"\0" * 8]) == "dtype"
    assert reason(hdr(arr=[["x", "float32", [-1]]]) + [b""]) == "shape"
    assert reason(hdr(meta={"x": b"\x00" * 3, 1: 2})) in ("meta", "header")


def test_msgpack_ext_types_are_refused():
    h = msgpack.packb({"k": "fragment", "v": 1, "job": "job", "x": msgpack.ExtType(1, b"boom")})
    assert reason([h]) == "header"


def test_encode_refuses_object_arrays():
    with pytest.raises(ValueError):
        encode("fragment", "job", "a", 0, 0, {"x": np.array([object()])})
