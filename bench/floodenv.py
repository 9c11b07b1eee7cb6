"""Hostile env code for bench/flood.py: a Gymnasium wrapper that, inside actor-0-0 only, starts a
thread which finds the process's own CURVE keyring in its memory (as any code in the actor can)
and sends valid, fresh fragments to the buffer it feeds, as fast as one socket goes, for the whole
run. Two controls: `mode: spin`, a thread that only burns the CPU; `mode: junk`, the flood's
content at the actor's own rate (its fragments' arrays swapped for the flood's as it sends them:
an env that lies, at no extra volume). `off` does nothing (the clean runs carry the wrapper too)."""
from __future__ import annotations

import gc
import sys
import threading
import time

import gymnasium as gym
import numpy as np

_started = False


def _role() -> str:
    argv = sys.argv
    get = lambda flag: argv[argv.index(flag) + 1] if flag in argv else "?"  # noqa: E731
    return f"{get('--role')}-{get('--group')}-{get('--index')}"


def _find(cls_name: str, ready: str, timeout: float = 60.0):
    """The process's `cls_name` object once it has the attribute `ready` (built)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for o in gc.get_objects():
            if type(o).__name__ == cls_name and type(o).__module__.startswith("tianji.") and hasattr(o, ready):
                return o
        time.sleep(0.5)
    raise RuntimeError(f"no {cls_name} in this process")


def _fragment(n: int, t: int, obs: int, actions: int) -> dict:
    rng = np.random.default_rng(0)
    dones = np.zeros((t, n), bool)
    return {"obs": rng.standard_normal((t, n, obs)).astype(np.float32),
            "actions": rng.integers(0, actions, (t, n)).astype(np.int64),
            "logp": np.full((t, n), -0.69, np.float32), "rewards": np.ones((t, n), np.float32),
            "dones": dones, "terminated": dones.copy(), "valid": np.ones((t, n), bool),
            "last_obs": rng.standard_normal((n, obs)).astype(np.float32)}


def _flood(stats: dict) -> None:
    import zmq

    from tianji.runtime.replayguard import now_us
    from tianji.runtime.wire import encode

    actor = _find("Actor", "push")
    spec = actor.spec
    arrays = _fragment(spec.env.num_envs, spec.env.fragment_length, 4, 2)
    meta = {"frames": spec.env.num_envs * spec.env.fragment_length}
    sock = actor.ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 1000)
    if actor.curve is not None:
        actor.curve.client(sock, "buffer-0-0")
    sock.connect(actor.addrs.connect("fragments", 0, 0))
    seq = 0
    while True:
        seq = max(seq + 1, now_us())
        msg = encode("fragment", actor.job.name, actor.sender, seq, getattr(actor, "version", 0), arrays, meta)
        try:
            sock.send_multipart(msg, zmq.NOBLOCK)
            stats["sent"] += 1
        except zmq.Again:
            time.sleep(0.0005)


def _junk(stats: dict) -> None:
    """The flood's content in place of each fragment the actor sends, at its own rate."""
    actor = _find("Actor", "push")
    spec = actor.spec
    arrays = _fragment(spec.env.num_envs, spec.env.fragment_length, 4, 2)
    real = actor.send

    def send(sock, kind, arrs=None, meta=None, policy_version=0):
        if kind == "fragment":
            arrs = arrays
            stats["sent"] += 1
        return real(sock, kind, arrs, meta, policy_version)

    actor.send = send


def _spin(stats: dict) -> None:
    """The control: a thread that only burns the CPU (and the GIL), sending nothing."""
    while True:
        stats["sent"] += 1


class Flood(gym.Wrapper):
    """`mode`: flood (send fragments), spin (burn the CPU alike, send nothing), junk (the flood's
    content at the actor's rate) or off."""

    def __init__(self, env, mode: str = "flood"):
        super().__init__(env)
        global _started
        if mode != "off" and not _started and _role() == "actor-0-0":
            _started = True
            target = {"flood": _flood, "spin": _spin, "junk": _junk}[mode]
            threading.Thread(target=target, args=({"sent": 0},), daemon=True, name=mode).start()
