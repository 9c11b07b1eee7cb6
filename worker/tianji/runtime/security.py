"""CurveZMQ identities: every process of a job proves which process it is, on every socket.

A job's processes do not share one key. Each holds a *keyring*:

    {"identity": "actor-0-1", "public": z85, "secret": z85, "peers": {"learner-0-0": z85, ...}}

- Locally (`tianji run`) every process has a key pair of its own, and the launcher one. A
  worker's keyring reaches it as an inherited descriptor (TIANJI_CURVE_KEYS_FD: an anonymous
  in-memory file, `keyring_fd`) that it reads once and closes (`from_env`): it is never a path
  another process can open, and nothing secret is written to disk. Only public keys are
  (`write_public_keys`, for people and tools; workers take their peers from their keyring).
- Pods read a keyring file (TIANJI_CURVE_KEYS). A learner, buffer or evaluator pod's is its
  role's Secret, mounted read-only, with the role as its `identity` (every pod of that role holds
  it). An actor pod's is its own: its init container (`tianji actor-key`, `issue_actor_keyring`)
  derives "actor-G-I"'s key pair from the job's actor seed into a memory-backed volume, and the
  seed is mounted into that init container only. Learner and buffer keyrings carry the seed
  (`actor_seed`), so they know every actor's public key (`actor_keys`) without a list to keep
  in step with the StatefulSets' replicas.
- A key *covers* the senders it may speak as: its own name, or, for a role key, every
  "role-G-I" (`covers`); `exclusive` says whether a sender's name has a key of its own.
- `peers` holds the public keys of every identity of the job (public keys are not secret).
- A binding socket is a CURVE server; its ZAP handler lets a client in only with a key in
  `peers` and gives each message the key's identity as its ZeroMQ "User-Id". Receivers
  (roles/base.py) take the sender from there, never from the header: a header's "from"
  that the key does not cover is refused (reason "sender"), and so is a role that may not
  send on that socket (reason "role"). A refused handshake is counted and logged with the
  key it presented (`refused`).
- A connecting socket pins the key of the identity it means to reach (`client(sock, peer)`):
  a process re-binding the parameter path (or any endpoint) without that identity's secret
  key fails the handshake, so its messages never arrive.

`spec.network.encryption: none` turns all of this off (headers are then trusted).
"""
from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import zmq

from tianji.control.contracts.curvekeys import ACTOR_ORDINALS, derived_secret, parse_seed, z85
from tianji.control.contracts.launch import ENV_CURVE_KEYS, ENV_CURVE_KEYS_FD

log = logging.getLogger("tianji")
LAUNCHER = "launcher"  # the local launcher's identity (it receives reports)
USER_ID = "User-Id"  # ZeroMQ message property set by the ZAP handler


class KeyError_(ValueError):
    pass


def role_of(name: str) -> str:
    return name.split("-", 1)[0]


def exclusive(ring: Optional[Keyring], sender: str) -> bool:
    """Does `sender` have a key of its own in the job (a process key), not only its role's? Every
    actor does where actor keys are derived from a seed (pods: `actor_keys`)."""
    if ring is None:
        return False
    return sender in ring.peers or (ring.actor_seed is not None and role_of(sender) == "actor")


def covers(identity: Optional[str], sender: str) -> bool:
    """May a holder of `identity`'s key speak as `sender`? Its own name, or any instance of its role."""
    if not identity:
        return False
    return sender == identity or ("-" not in identity and sender.startswith(identity + "-"))


@dataclass(frozen=True)
class Keys:
    public: bytes  # z85, 40 bytes
    secret: bytes


def new_keys() -> Keys:
    public, secret = zmq.curve_keypair()
    return Keys(public, secret)


@dataclass(frozen=True)
class Keyring:
    identity: str
    keys: Keys
    peers: dict = field(default_factory=dict)  # identity -> public key (z85 bytes), its own included
    actor_seed: Optional[bytes] = None  # pods' learners and buffers: every actor's key derives from it

    def public_of(self, peer: str) -> bytes:
        """The key a connection to `peer` must meet: the process's own, else its role's."""
        key = self.peers.get(peer) or self.peers.get(role_of(peer))
        if key is None:
            raise KeyError_(f"no public key for {peer!r} in {self.identity}'s keyring")
        return key

    def to_json(self) -> str:
        doc = {"identity": self.identity, "public": self.keys.public.decode(), "secret": self.keys.secret.decode(),
               "peers": {k: v.decode() for k, v in sorted(self.peers.items())}}
        if self.actor_seed is not None:
            doc["actorSeed"] = self.actor_seed.hex()
        return json.dumps(doc)


def actor_keys(seed: bytes, name: str) -> Keys:
    """Actor `name`'s key pair on Kubernetes, derived from the job's actor seed."""
    secret = z85(derived_secret(seed, name)).encode()
    return Keys(zmq.curve_public(secret), secret)


def issue_actor_keyring(issuer_text: str, group: int, index: int, source: str = "the actor issuer") -> Keyring:
    """Actor pod (group, index)'s own keyring, from the issuer document the operator writes
    ({"actorSeed": hex, "peers": {role: z85}}): its derived key pair and the roles' public keys,
    not the seed."""
    try:
        doc = json.loads(issuer_text)
        seed = parse_seed(doc["actorSeed"])
        peers = {str(n): _key(k) for n, k in doc["peers"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise KeyError_(f"{source}: not an actor key issuer ({e})") from None
    if group < 0 or not 0 <= index < ACTOR_ORDINALS:
        raise KeyError_(f"actor ordinal {index} of group {group}: learners and buffers admit actor "
                        f"ordinals 0..{ACTOR_ORDINALS - 1}")
    name = f"actor-{group}-{index}"
    keys = actor_keys(seed, name)
    return Keyring(name, keys, {**peers, name: keys.public})


def issue(names: Iterable[str]) -> dict[str, Keyring]:
    """A fresh key pair for each identity, each keyring knowing every identity's public key."""
    pairs = {n: new_keys() for n in names}
    publics = {n: k.public for n, k in pairs.items()}
    return {n: Keyring(n, k, dict(publics)) for n, k in pairs.items()}


def write_keyring(path: str | Path, ring: Keyring, mode: int = 0o600) -> None:
    """Write one keyring, mode 0600 unless told, replacing an older one atomically (actor pods'
    init containers, tests)."""
    _write_file(Path(path), ring.to_json(), mode)


def write_public_keys(path: str | Path, rings: dict[str, Keyring]) -> None:
    """Every identity's public key (nothing secret): {"peers": {identity: z85}}."""
    peers = {n: r.keys.public.decode() for n, r in sorted(rings.items())}
    _write_file(Path(path), json.dumps({"peers": peers}), mode=0o644)


def _write_file(path: Path, text: str, mode: int = 0o600) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


PIPE_MAX = 16 << 10  # a keyring that fits any pipe's buffer (where there is no memfd)


def keyring_fd(ring: Keyring) -> int:
    """A descriptor holding `ring`, read from its start, for one child process to inherit: an
    anonymous in-memory file (memfd, close-on-exec: only a child given it with pass_fds, or forked
    with it, has it), or a pipe where memfd is missing. The caller closes it once the child has it."""
    data = ring.to_json().encode()
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("tianji-keyring", os.MFD_CLOEXEC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.lseek(fd, 0, os.SEEK_SET)
        except BaseException:
            os.close(fd)
            raise
        return fd
    if len(data) > PIPE_MAX:
        raise KeyError_(f"a keyring of {len(data)} bytes does not fit a pipe (no memfd on this system)")
    r, w = os.pipe()
    os.write(w, data)
    os.close(w)
    return r


def _key(v) -> bytes:
    k = v.encode("ascii")
    if len(k) != 40:
        raise ValueError("a key is 40 z85 characters")
    return k


def read_keyring(path: str | Path) -> Keyring:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise KeyError_(f"{path}: cannot read this process's CURVE keyring ({e})") from None
    return parse_keyring(text, str(path))


def read_keyring_fd(fd: int) -> Keyring:
    """The keyring in inherited descriptor `fd` (keyring_fd), which is closed once read."""
    try:
        with os.fdopen(fd, "rb") as f:
            text = f.read(1 << 20)
    except OSError as e:
        raise KeyError_(f"descriptor {fd}: cannot read this process's CURVE keyring ({e})") from None
    return parse_keyring(text, f"descriptor {fd}")


def parse_keyring(text, source: str) -> Keyring:
    try:
        doc = json.loads(text)
        keys = Keys(_key(doc["public"]), _key(doc["secret"]))
        if zmq.curve_public(keys.secret) != keys.public:
            raise ValueError("not a matching CURVE key pair")
        identity = doc["identity"]
        if not isinstance(identity, str) or not identity:
            raise ValueError("no identity")
        peers = {str(n): _key(k) for n, k in doc["peers"].items()}
        if peers.get(identity) != keys.public:
            raise ValueError("its own public key is not among its peers")
        seed = doc.get("actorSeed")
        return Keyring(identity, keys, peers, None if seed is None else parse_seed(seed))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise KeyError_(f"{source}: cannot read this process's CURVE keyring ({e})") from None


class _Identities:
    """ZAP credentials: a key of the job's keyring is let in (its identity becomes the User-Id),
    and, where the keyring has the actor seed, the derived key of an actor of `group`; any other
    is refused, counted and logged with the key it presented."""

    def __init__(self, ring: Keyring, group: Optional[int] = None):
        self.by_key = {k: n for n, k in ring.peers.items()}
        self.seed = ring.actor_seed if group is not None else None
        self.group, self.derived = group, 0  # actor ordinals 0..derived-1 are in by_key
        self.refused = 0
        self._lock = threading.Lock()

    def _derive_until(self, key: bytes) -> bool:
        """Derive the group's actor keys in doubling batches until `key` is among them (at most
        ACTOR_ORDINALS ordinals: an unknown key costs that once, then nothing)."""
        while key not in self.by_key and self.derived < ACTOR_ORDINALS:
            n = min(max(64, 2 * self.derived), ACTOR_ORDINALS)
            for i in range(self.derived, n):
                name = f"actor-{self.group}-{i}"
                self.by_key[actor_keys(self.seed, name).public] = name
            self.derived = n
        return key in self.by_key

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.by_key:
            return True
        with self._lock:
            if self.seed is not None and self._derive_until(key):
                return True
            self.refused += 1
            n = self.refused
        if n <= 3 or n % 100 == 0:
            log.warning("refused a CURVE handshake from key %s (not this job's) [%d so far]",
                        key.decode("ascii", "replace"), n)
        return False


def _authenticator(ctx: zmq.Context, ids: _Identities):
    from zmq.auth.thread import ThreadAuthenticator

    class _Auth(ThreadAuthenticator):
        def curve_user_id(self, client_public_key: bytes) -> str:
            return ids.by_key[zmq.utils.z85.encode(client_public_key)]

    auth = _Auth(ctx)
    auth.start()
    auth.configure_curve_callback("*", credentials_provider=ids)
    return auth


class Curve:
    """One keyring applied to the sockets of one zmq.Context (and its ZAP handler)."""

    def __init__(self, ctx: zmq.Context, ring: Keyring, group: Optional[int] = None):
        self.ctx, self.ring = ctx, ring
        self.ids = _Identities(ring, group)
        self.auth = None

    @property
    def identity(self) -> str:
        return self.ring.identity

    @property
    def refused(self) -> int:
        return self.ids.refused

    def server(self, sock: zmq.Socket) -> None:
        if self.auth is None:
            self.auth = _authenticator(self.ctx, self.ids)
        sock.curve_secretkey = self.ring.keys.secret
        sock.curve_publickey = self.ring.keys.public
        sock.curve_server = True

    def client(self, sock: zmq.Socket, peer: str) -> None:
        """Connect only to `peer` (a process name, or a role on Kubernetes): its key is pinned."""
        sock.curve_secretkey = self.ring.keys.secret
        sock.curve_publickey = self.ring.keys.public
        sock.curve_serverkey = self.ring.public_of(peer)

    def close(self) -> None:
        if self.auth is not None:
            self.auth.stop()
            self.auth = None


def sender_identity(frame) -> Optional[str]:
    """The identity ZAP authenticated for the connection a message came in on (None: none)."""
    try:
        return frame.get(USER_ID) or None
    except (zmq.ZMQError, AttributeError, TypeError):  # not a received zmq.Frame, or no ZAP
        return None


PR_SET_DUMPABLE = 4


def forbid_inspection() -> bool:
    """Make this process non-dumpable (prctl PR_SET_DUMPABLE 0): another process of the same user
    can then neither ptrace it nor open its /proc/PID/mem or /proc/PID/fd (they become root's),
    unless it holds CAP_SYS_PTRACE (root does). Inherited by fork, reset by exec: the launcher, the
    worker template and every worker set it before they hold a secret. False where it is not
    available (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def untraced() -> None:
    """Raise KeyError_ if a debugger is attached to this process: one that attached before
    `forbid_inspection` (a process started by exec is inspectable until then) would stay attached."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return
    tracer = next((line.split()[1] for line in status.splitlines() if line.startswith("TracerPid:")), "0")
    if tracer != "0":
        raise KeyError_(f"process {tracer} is tracing this one: it would read the secret key; not starting")


def from_env(ctx: zmq.Context, required: bool, group: Optional[int] = None) -> Optional[Curve]:
    """This process's Curve: from the descriptor TIANJI_CURVE_KEYS_FD names (local workers: read
    once, closed, and the variable removed), else the file TIANJI_CURVE_KEYS names (pods). A job
    that asks for encryption without keys fails. `group`: the process's group, whose actors it
    admits by their derived keys where its keyring has the actor seed."""
    if forbid_inspection():  # before this process holds its secret key
        untraced()
    fd = os.environ.pop(ENV_CURVE_KEYS_FD, None)
    if fd:
        try:
            n = int(fd)
        except ValueError:
            raise KeyError_(f"{ENV_CURVE_KEYS_FD}={fd!r} is not a descriptor number") from None
        return Curve(ctx, read_keyring_fd(n), group)
    path = os.environ.get(ENV_CURVE_KEYS)
    if not path:
        if required:
            raise KeyError_(f"spec.network.encryption is curve but neither {ENV_CURVE_KEYS_FD} nor "
                            f"{ENV_CURVE_KEYS} is set")
        return None
    return Curve(ctx, read_keyring(path), group)
