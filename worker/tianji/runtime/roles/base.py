"""What every role process shares: sockets, validated send/receive, reports, stop signal.

A role is a loop (`step()`) that must never block on another role: every
receive is a non-blocking poll with a short timeout, every send is
NOBLOCK and a full peer queue is counted, not waited on.

Who sent a message is what the transport proved (runtime/security.py): `receive` refuses a
header whose "from" the sender's key does not cover (reason "sender") and a role that may not
send on that socket (reason "role"); a connecting socket pins its peer's key. Handlers call
`accept(msg)` once a message passed every check: a sequence number it has seen from that sender
(a replay) is refused there (runtime/replayguard.py).
"""
from __future__ import annotations

import json
import logging
import os
import signal
import time
import uuid
from collections import deque
from collections.abc import Iterable
from typing import Any, Optional

import zmq

from tianji.control.contracts.addressing import Addresses
from tianji.control.contracts.launch import ENV_TERMINATION_LOG, TERMINATION_MESSAGE_MAX
from tianji.control.contracts.rolereport import WINDOW, build_report, compact_json
from tianji.control.spec import TianJiJob
from tianji.observability.metrics import RoleMetrics
from tianji.runtime import security, wire
from tianji.runtime.liveness import watch_peers
from tianji.runtime.replayguard import SeqGuard, next_seq
from tianji.runtime.trace import Trace
from tianji.runtime.wire import Limits, Message, WireError, decode, encode

log = logging.getLogger("tianji")

REPORT_INTERVAL_S = 0.5


class Role:
    name = "role"

    def __init__(self, job: TianJiJob, group: int, index: int, addrs: Addresses,
                 report: Optional[str] = None, run_dir: Optional[str] = None):
        self.job, self.spec = job, job.spec
        self.group, self.index, self.addrs, self.run_dir = group, index, addrs, run_dir
        self.sender = f"{self.name}-{group}-{index}"
        self.ctx = zmq.Context()
        # CurveZMQ with this process's keyring (runtime/security.py). `tianji run` always provides
        # one, so a local worker without it refuses to start; pods read their role's key Secret or,
        # actors, their own derived key (operator: builders.curve_secrets); a pod without keys warns
        # and relies on the NetworkPolicy.
        want = job.spec.network.encryption == "curve"
        self.curve = security.from_env(self.ctx, required=want and addrs.run_dir is not None,  # local: ipc
                                       group=group)
        if want and self.curve is None:
            log.warning("%s: spec.network.encryption is curve but no keys are mounted; sockets are NOT "
                        "authenticated (only the NetworkPolicy restricts peers)", self.sender)
        self.metrics = RoleMetrics(job.name, self.name, group, index)
        self.trace = Trace(self.sender)  # off unless TIANJI_TRACE names a directory (runtime/trace.py)
        self.stopping = False
        self.seq = 0
        self.seqs = SeqGuard()  # the last sequence number accepted from each sender
        self._pinned: dict = {}  # connecting socket -> the peer whose key it pinned
        self._covered: dict = {}  # (identity, sender) -> security.covers (a cache: it runs per message)
        self._refused_seen = 0  # CURVE handshakes refused, already counted
        self.limits = Limits()
        self._report_sock = None
        if report:
            self._report_sock = self.socket(zmq.PUSH, report, bind=False, hwm=16, peer=security.LAUNCHER)
        self._last_report = 0.0
        self.incarnation = uuid.uuid4().hex[:12]  # this process; a restart is a new incarnation
        self.started_at = time.time()
        self._report_seq = 0
        self._recent: deque = deque(maxlen=WINDOW)  # (finish time, return, length) of the last episodes
        self._report_json = b"{}"  # the newest report, served on /report (swapped whole: thread-safe)
        self.started = time.monotonic()
        self.status = "starting"
        self.exit_code = 0

    # ------------------------------------------------------------ sockets
    def socket(self, kind: int, addr: str, bind: bool, hwm: int = 8, max_msg: Optional[int] = None,
               peer: Optional[str] = None) -> zmq.Socket:
        """`max_msg`: ZeroMQ drops (and disconnects) a peer whose message part is larger, before
        allocating it; what passes is still checked by decode's own (counted) size limits.
        `peer`: the identity a connecting socket talks to (its key is pinned: runtime/security.py)."""
        s = self.ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        if max_msg is not None:
            s.setsockopt(zmq.MAXMSGSIZE, int(max_msg))
        if not bind:
            if peer is None:
                raise ValueError(f"{self.sender}: a connecting socket names its peer")
            self._pinned[s] = peer
        if self.curve is not None:
            if bind:
                self.curve.server(s)
            else:
                self.curve.client(s, peer)
        if kind in (zmq.PUSH, zmq.PUB):
            s.setsockopt(zmq.SNDHWM, hwm)
        else:
            s.setsockopt(zmq.RCVHWM, hwm)
        if kind == zmq.SUB:
            s.setsockopt(zmq.SUBSCRIBE, b"")
        if addr.startswith("tcp://"):
            watch_peers(s)  # a peer whose node vanished is dropped and its name resolved again
        if bind:
            if addr.startswith("ipc://"):
                path = addr[len("ipc://"):]
                os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
                if os.path.exists(path):  # left by a previous incarnation of this role
                    os.unlink(path)
            s.bind(addr)
            if addr.startswith("ipc://"):  # connectable by the run's roles' group (local/isolation.py)
                os.chmod(path, 0o660)
        else:
            s.connect(addr)
        return s

    def send(self, sock: zmq.Socket, kind: str, arrays: Optional[dict] = None, meta: Optional[dict] = None,
             policy_version: int = 0) -> bool:
        """Non-blocking send; False (nothing sent) if the peer's queue is full."""
        seq = next_seq(self.seq)
        frames = encode(kind, self.job.name, self.sender, seq, policy_version, arrays, meta)
        try:
            wire.send(sock, frames, zmq.NOBLOCK)
        except zmq.Again:
            return False
        self.seq = seq
        if kind != "report":
            self.metrics.inc("bytes_sent_total", sum(len(f) for f in frames))
        return True

    def receive(self, sock: zmq.Socket, kinds: Iterable[str], senders: Iterable[str],
                limits: Optional[Limits] = None) -> Optional[Message]:
        """One validated message from one of the roles `senders`, or None if nothing is queued or
        the message was rejected. Any exception while decoding is a reject (reason "decode")."""
        try:
            frames = wire.recv(sock, zmq.NOBLOCK)
        except zmq.Again:
            return None
        try:
            msg = decode(frames, job=self.job.name, limits=limits or self.limits)
            if msg.kind not in kinds:
                raise WireError("kind", f"{msg.kind!r} not expected here")
            self._authenticate(msg, frames[0], sock, senders)
        except WireError as e:
            self.reject(e.reason, str(e))
            return None
        except Exception as e:  # noqa: BLE001 - whatever a peer sends must not end this process
            self.reject("decode", f"{type(e).__name__}: {e}")
            return None
        self.metrics.inc("bytes_received_total", msg.nbytes)
        return msg

    def _authenticate(self, msg: Message, head, sock: zmq.Socket, senders: Iterable[str]) -> None:
        """The header's sender must be covered by the key the transport authenticated (a bound
        socket: ZAP's User-Id; a connecting one: the peer it pinned), and be a role that may
        send here. Without CURVE (encryption: none) only the role is checked."""
        if self.curve is not None:
            identity = self._pinned.get(sock) or security.sender_identity(head)
            ok = self._covered.get((identity, msg.sender))
            if ok is None:
                ok = self._covered[(identity, msg.sender)] = security.covers(identity, msg.sender)
                if len(self._covered) > 4096:  # bounded: senders are few, forged names many
                    self._covered.clear()
            if not ok:
                raise WireError("sender", f"{msg.sender!r} sent with the key of {identity!r}")
        if security.role_of(msg.sender) not in senders:
            raise WireError("role", f"a {msg.kind} from {msg.sender!r}")

    def accept(self, msg: Message) -> None:
        """The last check before a message takes effect: raises WireError("replay") for a
        sequence number already seen from its sender (runtime/replayguard.py)."""
        self.seqs.accept(msg.sender, msg.seq,
                         exclusive=security.exclusive(self.curve.ring if self.curve else None, msg.sender))

    def handle(self, handler, msg: Message) -> None:
        """Run a message handler: a WireError is a reject with its reason, any other exception a
        reject with reason "handler" (logged with its traceback), never a crash."""
        try:
            handler(msg)
        except WireError as e:
            self.reject(e.reason, str(e))
        except Exception as e:  # noqa: BLE001
            log.exception("%s: handling a %s message failed", self.sender, msg.kind)
            self.reject("handler", f"{type(e).__name__}: {e}")

    def reject(self, reason: str, detail: str = "") -> None:
        self.metrics.inc("messages_rejected_total", reason=reason)
        n = self.metrics.reasons["messages_rejected_total"].get(reason, 0)
        if n <= 3 or n % 1000 == 0:
            log.warning("%s: rejected message (%s) %s [%d so far]", self.sender, reason, detail, int(n))

    # ------------------------------------------------------------ reports
    def add_episodes(self, episodes: Iterable[tuple[float, int]]) -> None:
        """Episodes that just finished, each (return, length in steps)."""
        now = time.time()
        self._recent.extend((now, float(r), int(n)) for r, n in episodes)

    def report_extra(self) -> dict[str, Any]:
        return {}

    def report(self, final: bool = False) -> dict:
        """This process's report (tianji.control.contracts.rolereport): cumulative counts of this incarnation."""
        self._report_seq += 1
        return build_report(job=self.job.name, role=self.name, group=self.group, index=self.index,
                            incarnation=self.incarnation, pid=os.getpid(), started=self.started_at,
                            seq=self._report_seq, time=time.time(), final=final,
                            snapshot=self.metrics.snapshot(),
                            episodes_total=int(self.metrics.counts.get("episodes_total", 0)),
                            recent=list(self._recent), extra=self.report_extra())

    def report_json(self) -> bytes:
        return self._report_json

    def maybe_report(self, force: bool = False, final: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_report < REPORT_INTERVAL_S:
            return
        self._last_report = now
        self._count_refused_handshakes()
        rep = self.report(final)
        self._report_json = json.dumps(rep, separators=(",", ":")).encode()
        if self._report_sock is not None:
            self.send(self._report_sock, "report", meta=rep,
                      policy_version=int(self.metrics.gauges.get("policy_version", 0)))
        if final:
            self._write_termination_log(rep)

    def _count_refused_handshakes(self) -> None:
        """CURVE handshakes the ZAP handler refused (its thread counts them) as rejects."""
        refused = self.curve.refused if self.curve is not None else 0
        if refused > self._refused_seen:
            self.metrics.inc("messages_rejected_total", refused - self._refused_seen, reason="handshake")
            self._refused_seen = refused

    def _write_termination_log(self, rep: dict) -> None:
        """Pods: the final counts go where the kubelet copies them into the pod status."""
        path = os.environ.get(ENV_TERMINATION_LOG)
        if not path:
            return
        try:
            with open(path, "wb") as f:
                f.write(compact_json(rep, TERMINATION_MESSAGE_MAX))
        except OSError as e:  # not a pod (or a read-only one): nothing else depends on it
            log.warning("%s: cannot write the final report to %s: %s", self.sender, path, e)

    # ------------------------------------------------------------ lifecycle
    def setup(self) -> None: ...

    def step(self) -> None:
        raise NotImplementedError

    def teardown(self) -> None: ...

    def _on_signal(self, signum, frame) -> None:
        self.stopping = True

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.setup()
        self.status = "running"
        try:
            while not self.stopping:
                self.step()
                self.maybe_report()
        finally:
            self.status = "stopped"
            try:
                self.teardown()
            finally:
                self.maybe_report(force=True, final=True)
                if self._report_sock is not None:  # the final report may still be queued: give it 1 s
                    self._report_sock.close(linger=1000)
                if self.curve is not None:
                    self.curve.close()
                self.trace.close()
                self.ctx.destroy(linger=0)
        return self.exit_code
