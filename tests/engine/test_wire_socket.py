"""wire.send / wire.recv over real sockets: zero-copy round trip, and a peer that sends more
parts than any valid message is drained, cut and refused, while the next message still decodes."""
import numpy as np
import pytest
import zmq

from tianji.runtime import wire
from tianji.runtime.wire import MAX_ARRAYS, WireError, decode, encode


@pytest.fixture
def pair():
    ctx = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    for s in (push, pull):
        s.setsockopt(zmq.LINGER, 0)
    pull.setsockopt(zmq.RCVTIMEO, 5000)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(f"tcp://127.0.0.1:{port}")
    yield push, pull
    push.close()
    pull.close()
    ctx.term()


def test_send_recv_round_trip_keeps_arrays(pair):
    push, pull = pair
    big = np.arange(300_000, dtype=np.float32).reshape(1000, 300)  # over pyzmq's copy threshold
    small = np.array([[1, 0], [0, 1]], dtype=bool)
    wire.send(push, encode("fragment", "job", "actor-0-0", 3, 2, {"obs": big, "done": small}, {"frames": 9}))
    msg = decode(wire.recv(pull), job="job")
    np.testing.assert_array_equal(msg.arrays["obs"], big)
    np.testing.assert_array_equal(msg.arrays["done"], small)
    assert msg.seq == 3 and msg.policy_version == 2 and msg.meta == {"frames": 9}


def test_too_many_parts_are_drained_and_refused(pair):
    push, pull = pair
    parts = encode("fragment", "job", "a", 0, 0, {"x": np.zeros(2, np.uint8)}) + [b"\0\0"] * (3 * MAX_ARRAYS)
    push.send_multipart(parts)
    wire.send(push, encode("fragment", "job", "a", 1, 0, {"x": np.ones(2, np.uint8)}))
    frames = wire.recv(pull)
    assert len(frames) == MAX_ARRAYS + 2  # kept no more than this, the rest was read and dropped
    with pytest.raises(WireError) as e:
        decode(frames, job="job")
    assert e.value.reason == "frames"
    nxt = decode(wire.recv(pull), job="job")  # the stream is in step: the next message is whole
    assert nxt.seq == 1 and nxt.arrays["x"].tolist() == [1, 1]


def test_send_noblock_on_a_full_queue_raises_again():
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.setsockopt(zmq.IMMEDIATE, 1)  # queue only to completed connections
    push.connect("tcp://127.0.0.1:9")  # nobody listens: no peer, so nothing can be queued
    with pytest.raises(zmq.Again):
        wire.send(push, encode("credit", "job", "a", 0, 0), zmq.NOBLOCK)
    push.close()
    ctx.term()


def test_received_headers_are_checked_in_place_as_zmq_frames(pair):
    """decode reads a received header from its zmq.Frame without a copy: a pickle stream, garbage,
    an oversized or a non-contiguous header (a 0-d or a Fortran-order array on the way in) are
    still told apart, and the next good message decodes."""
    import pickle

    push, pull = pair
    for parts, reason in (([pickle.dumps({"k": "fragment", "v": 1})], "pickle"),
                          ([b"\xc1garbage", b"x"], "header"),
                          ([b"\x80" + b"\0" * (wire.MAX_HEADER_BYTES + 1)], "size")):
        push.send_multipart(parts)
        frames = wire.recv(pull)
        assert type(frames[0]) is zmq.Frame
        with pytest.raises(WireError) as e:
            decode(frames, job="job")
        assert e.value.reason == reason
    fortran = np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3))
    wire.send(push, encode("fragment", "job", "a", 1, 0, {"f": fortran, "s": np.array(2.5)}))
    msg = decode(wire.recv(pull), job="job")
    np.testing.assert_array_equal(msg.arrays["f"], fortran)
    assert msg.arrays["s"].shape == (1,) and msg.arrays["s"][0] == 2.5
