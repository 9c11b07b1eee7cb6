"""An actor pod's key on real nodes, used from where user env code runs: inside the actor's own
container. Each actor pod holds a key pair of its own, which its init container derived from
the job's actor seed (docs/security.md). Code in actor-0-0's container (`kubectl exec`, the
worker's uid, behind the job's enforced NetworkPolicy, which admits it to the buffer) reads the
keyring its worker holds and speaks to the buffer as its neighbour: refused as any other actor;
a stranger's key fails the handshake; an actor added by `kubectl scale` is admitted with its own
key, without a restart."""
from __future__ import annotations

import base64
import json
import time

import pytest

from cluster_jobs import FOREVER, JOB, diagnostics, on_real_nodes, running
from cluster_jobs import worker_metrics as metrics_of
from clusterkit import wait_for
from hostile import frag_msg
from tianji.control.contracts.launch import CURVE_DIR, CURVE_FILE

FORGED = 20

# Run by the pod's python: prints what the keyring holds, then pushes the messages on stdin to
# the buffer with the pod's own key (or a stranger's), and waits for them to leave.
INSIDE = f"""
import base64, json, sys, zmq
from tianji.runtime import security
ring = security.read_keyring("{CURVE_DIR}/{CURVE_FILE}")
print(json.dumps({{"identity": ring.identity, "seed": ring.actor_seed is not None, "peers": sorted(ring.peers)}}))
req = json.load(sys.stdin)
if req["to"]:
    keys = ring.keys if req["own"] else security.new_keys()
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, 3000)
    s.curve_secretkey, s.curve_publickey = keys.secret, keys.public
    s.curve_serverkey = ring.public_of("buffer-0-0")
    s.connect(req["to"])
    for m in req["messages"]:
        s.send_multipart([base64.b64decode(f) for f in m])
    s.close()
    ctx.term()
"""


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


def inside(c, actor: dict, to: str = "", own: bool = True, messages: list | None = None) -> dict:
    """INSIDE run in the actor's worker container; what its keyring holds."""
    req = {"to": to, "own": own, "messages": [[base64.b64encode(bytes(memoryview(f))).decode() for f in m]
                                              for m in messages or []]}
    res = c.kubectl("exec", "-i", "-n", actor["metadata"]["namespace"], actor["metadata"]["name"], "-c", "worker",
                    "--", "python", "-c", INSIDE, input=json.dumps(req), check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[0])


def fragments_address(buffer: dict) -> str:
    port = next(p["containerPort"] for p in buffer["spec"]["containers"][0]["ports"] if p["name"] == "fragments")
    return f"tcp://{buffer['status']['podIP']}:{port}"


@pytest.mark.timeout(600)
def test_an_actor_pods_key_speaks_only_as_that_actor(real, real_operator, ns):
    c = real
    c.kubectl("apply", "-n", ns, "-f", "-", input=on_real_nodes(c, FOREVER))
    wait_for(lambda: len(running(c, ns, "actor")) == 2 and running(c, ns, "buffer"), 240,
             "2 actor pods and the buffer running", on_timeout=lambda: diagnostics(c, ns))
    (buffer,) = running(c, ns, "buffer").values()
    wait_for(lambda: all(frames(p) > 0 for p in running(c, ns, "actor").values()) and series(buffer, "tianji_"),
             120, "both actors stepping, the buffer answering", on_timeout=lambda: diagnostics(c, ns))
    actor = running(c, ns, "actor")[f"{JOB}-actor-0-0"]
    to = fragments_address(buffer)
    before = rejected(buffer, "sender")
    # actor-0-0's key, speaking as its neighbour
    ring = inside(c, actor, to, own=True, messages=[frag_msg(sender="actor-0-1") for _ in range(FORGED)])
    assert ring["identity"] == "actor-0-0" and not ring["seed"]  # its own key, never the seed
    assert set(ring["peers"]) == {"actor-0-0", "learner", "buffer", "evaluator"}  # public keys only
    wait_for(lambda: rejected(buffer, "sender") >= before + FORGED, 30,
             f"{FORGED} fragments refused as spoken with another actor's key")
    inside(c, actor, to, own=False, messages=[frag_msg(sender="actor-0-1")])  # a stranger's key
    wait_for(lambda: rejected(buffer, "handshake") >= 1, 30, "the stranger's handshake refused")
    handshakes = rejected(buffer, "handshake")
    # A third actor, a key the buffer has never seen: derived on both sides, admitted at once.
    c.kubectl("scale", f"tjj/{JOB}", "-n", ns, "--replicas=3")
    wait_for(lambda: len(running(c, ns, "actor")) == 3, 180, "3 actor pods running",
             on_timeout=lambda: diagnostics(c, ns))
    third = running(c, ns, "actor")[f"{JOB}-actor-0-2"]
    assert inside(c, third)["identity"] == "actor-0-2"
    wait_for(lambda: frames(third) > 0, 120, "actor-0-2 stepping", on_timeout=lambda: diagnostics(c, ns))
    time.sleep(5)  # its fragments reach the buffer: a refused key would show as handshakes
    assert rejected(buffer, "handshake") == handshakes and rejected(buffer, "sender") == before + FORGED
    c.kubectl("delete", "tjj", JOB, "-n", ns, "--wait=false")
