"""The operator's pure-Python CurveZMQ key pairs are the ones ZeroMQ computes, and they work."""
import zmq

from tianji.control.contracts.curvekeys import keypair, z85


def test_z85_and_public_key_match_zeromq():
    assert z85(bytes.fromhex("864FD26FB559F75B")) == "HelloWorld"  # the Z85 spec's example
    for _ in range(5):
        public, secret = keypair()
        assert len(public) == len(secret) == 40
        assert zmq.curve_public(secret.encode()) == public.encode()
