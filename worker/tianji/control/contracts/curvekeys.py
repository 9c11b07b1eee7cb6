"""CurveZMQ key pairs without pyzmq (the operator image has none): X25519 (RFC 7748) and Z85.

`keypair()` returns (public, secret) as ZeroMQ's `zmq_curve_keypair` does: 40-character
Z85 strings of 32-byte keys, public = X25519(secret, 9). Used by the operator to create a
job's key Secret; workers read it with tianji.runtime.security.
"""

from __future__ import annotations

import hashlib
import hmac
import os

_P = 2**255 - 19
_A24 = 121665
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def _x25519(scalar: bytes, u: int) -> bytes:
    k = bytearray(scalar)
    k[0] &= 248
    k[31] &= 127
    k[31] |= 64
    n = int.from_bytes(k, "little")
    x1, x2, z2, x3, z3, swap = u, 1, 0, u, 1, 0
    for t in reversed(range(255)):
        bit = (n >> t) & 1
        swap ^= bit
        if swap:
            x2, x3, z2, z3 = x3, x2, z3, z2
        swap = bit
        a, b = (x2 + z2) % _P, (x2 - z2) % _P
        aa, bb = a * a % _P, b * b % _P
        e = (aa - bb) % _P
        c, d = (x3 + z3) % _P, (x3 - z3) % _P
        da, cb = d * a % _P, c * b % _P
        x3, z3 = (da + cb) ** 2 % _P, x1 * (da - cb) ** 2 % _P
        x2, z2 = aa * bb % _P, e * (aa + _A24 * e) % _P
    if swap:
        x2, z2 = x3, z3
    return (x2 * pow(z2, _P - 2, _P) % _P).to_bytes(32, "little")


def z85(data: bytes) -> str:
    if len(data) % 4:
        raise ValueError("Z85 needs a multiple of 4 bytes")
    out: list[str] = []
    for i in range(0, len(data), 4):
        v = int.from_bytes(data[i : i + 4], "big")
        chunk = []
        for _ in range(5):
            v, r = divmod(v, 85)
            chunk.append(_Z85[r])
        out.extend(reversed(chunk))
    return "".join(out)


def public_key(secret: bytes) -> bytes:
    return _x25519(secret, 9)


def keypair() -> tuple[str, str]:
    """(public, secret), Z85-encoded, from the OS's random source."""
    secret = os.urandom(32)
    return z85(public_key(secret)), z85(secret)


# Actor keys on Kubernetes: one key pair per actor pod, derived from the job's actor seed, so that a
# learner or buffer (which holds the seed) knows every actor's public key without a list to keep in
# step with the StatefulSets' replicas, and an actor pod (whose init container derives its own key
# and is the only container that mounts the seed) holds its own secret key and no other.
SEED_BYTES = 32
ACTOR_ORDINALS = 4096  # actors per group that can hold a key: spec.topology.actors' and maxActors' bound
_DERIVE = b"tianji actor curve key v1\0"


def actor_seed() -> str:
    """A job's actor seed: 32 random bytes, hex."""
    return os.urandom(SEED_BYTES).hex()


def parse_seed(text: object) -> bytes:
    if not isinstance(text, str) or len(text) != 2 * SEED_BYTES:
        raise ValueError(f"an actor seed is {2 * SEED_BYTES} hex digits")
    return bytes.fromhex(text)


def derived_secret(seed: bytes, name: str) -> bytes:
    """The 32-byte CURVE secret key of actor `name` ("actor-G-I"): HMAC-SHA256(seed, name)."""
    return hmac.new(seed, _DERIVE + name.encode(), hashlib.sha256).digest()
