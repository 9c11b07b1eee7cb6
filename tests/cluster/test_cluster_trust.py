"""An actor pod's key on the real control plane: each actor pod holds a key pair of its own, which
its init container derived from the job's actor seed (docs/security.md). The key the worker
container holds, used from outside the pod, is refused as any other actor; a stranger's key fails
the handshake; an actor added by `kubectl scale` is admitted with its own key, without a restart."""
from __future__ import annotations

import glob
import time

import pytest
import zmq

from cluster_jobs import JOB, diagnostics, example, pods
from cluster_jobs import worker_metrics as metrics_of
from clusterkit import wait_for
from hostile import frag_msg
from tianji.runtime import security

FOREVER = {"stop": {"meanReturn": None, "envFrames": None, "seconds": 600}}
FORGED = 20


def running(c, ns: str, role: str) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in pods(c, ns) if p["metadata"]["labels"].get("tianji.dev/role") == role
            and p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")}


def rejected(buffer: dict, reason: str) -> float:
    series = metrics_of(buffer, ("tianji_messages_rejected_total",))
    return sum(v for k, v in series.items() if f'reason="{reason}"' in k)


def series(pod: dict, prefix: str) -> dict[str, float]:
    """Its /metrics series under `prefix`; none while it does not answer yet (a worker starting)."""
    try:
        return metrics_of(pod, (prefix,))
    except OSError:
        return {}


def frames(pod: dict) -> float:
    return sum(series(pod, "tianji_env_frames_total").values())


def own_keyring(pod: dict) -> security.Keyring:
    """The keyring the pod's worker container reads: the file its init container wrote into the
    pod's memory-backed volume (on its node, under /dev/shm)."""
    (path,) = glob.glob(f"/dev/shm/tianji-kubelet-*/{pod['metadata']['uid'][:8]}-curve/curve.json")
    return security.read_keyring(path)


def push(ctx: zmq.Context, buffer: dict, keys: security.Keys, server_key: bytes) -> zmq.Socket:
    port = next(p["containerPort"] for p in buffer["spec"]["containers"][0]["ports"] if p["name"] == "fragments")
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, 0)
    s.curve_secretkey, s.curve_publickey, s.curve_serverkey = keys.secret, keys.public, server_key
    s.connect(f"tcp://{buffer['status']['podIP']}:{port}")
    return s


@pytest.mark.timeout(600)
def test_an_actor_pods_key_speaks_only_as_that_actor(cluster, operator, namespace):
    c, ns = cluster, namespace
    c.kubectl("apply", "-n", ns, "-f", "-", input=example(FOREVER))
    wait_for(lambda: len(running(c, ns, "actor")) == 2 and running(c, ns, "buffer"), 180,
             "2 actor pods and the buffer running", on_timeout=lambda: diagnostics(c, ns))
    (buffer,) = running(c, ns, "buffer").values()
    wait_for(lambda: all(frames(p) > 0 for p in running(c, ns, "actor").values()) and series(buffer, "tianji_"),
             120, "both actors stepping, the buffer answering", on_timeout=lambda: diagnostics(c, ns))
    ring = own_keyring(running(c, ns, "actor")[f"{JOB}-actor-0-0"])
    assert ring.identity == "actor-0-0" and ring.actor_seed is None
    assert set(ring.peers) == {"actor-0-0", "learner", "buffer", "evaluator"}  # public keys only
    ctx = zmq.Context()
    try:
        before = rejected(buffer, "sender")
        s = push(ctx, buffer, ring.keys, ring.public_of("buffer-0-0"))
        for _ in range(FORGED):  # actor-0-0's key, speaking as its neighbour
            s.send_multipart(frag_msg(sender="actor-0-1"))
        wait_for(lambda: rejected(buffer, "sender") >= before + FORGED, 30,
                 f"{FORGED} fragments refused as spoken with another actor's key")
        s.close()
        stranger = security.new_keys()
        s = push(ctx, buffer, stranger, ring.public_of("buffer-0-0"))
        s.send_multipart(frag_msg(sender="actor-0-1"))
        wait_for(lambda: rejected(buffer, "handshake") >= 1, 30, "the stranger's handshake refused")
        s.close()
    finally:
        ctx.destroy(linger=0)
    handshakes = rejected(buffer, "handshake")
    # A third actor, a key the buffer has never seen: derived on both sides, admitted at once.
    c.kubectl("scale", f"tjj/{JOB}", "-n", ns, "--replicas=3")
    wait_for(lambda: len(running(c, ns, "actor")) == 3, 180, "3 actor pods running",
             on_timeout=lambda: diagnostics(c, ns))
    third = running(c, ns, "actor")[f"{JOB}-actor-0-2"]
    assert own_keyring(third).identity == "actor-0-2"
    wait_for(lambda: frames(third) > 0, 120, "actor-0-2 stepping", on_timeout=lambda: diagnostics(c, ns))
    time.sleep(5)  # its fragments reach the buffer: a refused key would show as handshakes
    assert rejected(buffer, "handshake") == handshakes and rejected(buffer, "sender") == before + FORGED
    c.kubectl("delete", "tjj", JOB, "-n", ns, "--wait=false")
