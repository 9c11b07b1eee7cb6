"""CurveZMQ for every socket of a job: one key pair per job, ZAP refuses every other key.

`tianji run` generates the key pair into `<run dir>/curve.json` (mode 0600); on Kubernetes
the operator creates it as a Secret mounted only into that job's pods. Every process of
the job reads it from the file named by TIANJI_CURVE_KEYS (tianji.control.launch):

- a binding socket is a CURVE server with the job's key, and a ZAP handler in the same
  process lets a client in only if it presents the job's public key;
- a connecting socket is a CURVE client with the job's key pair and expects the job's
  key from the server: a foreign publisher bound on the parameter path (or any endpoint)
  fails the handshake, so actors never see its messages.

So only the job's own processes (holders of the secret key) can talk to it, and the
traffic is encrypted. `spec.network.encryption: none` turns all of this off.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import zmq

from tianji.control.launch import ENV_CURVE_KEYS


class KeyError_(ValueError):
    pass


@dataclass(frozen=True)
class Keys:
    public: bytes  # z85, 40 bytes
    secret: bytes

    def to_json(self) -> str:
        return json.dumps({"public": self.public.decode(), "secret": self.secret.decode()})


def new_keys() -> Keys:
    public, secret = zmq.curve_keypair()
    return Keys(public, secret)


def write_keys(path: str | Path, keys: Optional[Keys] = None) -> Keys:
    """Write a key pair (new unless given) to `path`, mode 0600, refusing to overwrite."""
    keys = keys or new_keys()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(keys.to_json())
    return keys


def read_keys(path: str | Path) -> Keys:
    try:
        doc = json.loads(Path(path).read_text())
        keys = Keys(doc["public"].encode("ascii"), doc["secret"].encode("ascii"))
        if len(keys.public) != 40 or len(keys.secret) != 40 or zmq.curve_public(keys.secret) != keys.public:
            raise ValueError("not a matching CURVE key pair")
        return keys
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise KeyError_(f"{path}: cannot read the job's CURVE keys ({e})") from None


class _OnlyJobKey:
    def __init__(self, public: bytes):
        self.public = public

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.public


class Curve:
    """The job's keys applied to sockets of one zmq.Context (and its ZAP handler)."""

    def __init__(self, ctx: zmq.Context, keys: Keys):
        self.ctx, self.keys = ctx, keys
        self.auth = None

    def _start_auth(self) -> None:
        if self.auth is None:
            from zmq.auth.thread import ThreadAuthenticator

            self.auth = ThreadAuthenticator(self.ctx)
            self.auth.start()
            self.auth.configure_curve_callback("*", credentials_provider=_OnlyJobKey(self.keys.public))

    def server(self, sock: zmq.Socket) -> None:
        self._start_auth()
        sock.curve_secretkey = self.keys.secret
        sock.curve_publickey = self.keys.public
        sock.curve_server = True

    def client(self, sock: zmq.Socket) -> None:
        sock.curve_secretkey = self.keys.secret
        sock.curve_publickey = self.keys.public
        sock.curve_serverkey = self.keys.public

    def close(self) -> None:
        if self.auth is not None:
            self.auth.stop()
            self.auth = None


def from_env(ctx: zmq.Context, required: bool) -> Optional[Curve]:
    """The job's Curve from TIANJI_CURVE_KEYS; a job that asks for encryption without keys fails."""
    path = os.environ.get(ENV_CURVE_KEYS)
    if not path:
        if required:
            raise KeyError_(f"spec.network.encryption is curve but {ENV_CURVE_KEYS} is not set")
        return None
    return Curve(ctx, read_keys(path))
