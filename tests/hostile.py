"""Hostile messages for a live cartpole-ppo run (examples/cartpole-ppo.yaml): well-formed ones that
break the job's rules, one per class, each with the reason the receiver must count, and a fuzzer
that mutates valid messages. Used by tests/engine/test_hostile.py."""
from __future__ import annotations

import math
import random

import msgpack
import numpy as np
import zmq

from helpers import as_job_client, ipc
from tianji.runtime.replayguard import now_us
from tianji.runtime.wire import encode

JOB = "cartpole-ppo"
T, N, OBS, ACTIONS = 32, 4, (4,), 2
B = 8  # envs per learner batch: batchSize 256 // (numEnvs 4 x fragmentLength 32) = 2 fragments


def fragment(n: int = N, t: int = T) -> dict:
    rng = np.random.default_rng(0)
    dones = np.zeros((t, n), bool)
    return {"obs": rng.standard_normal((t, n, *OBS)).astype(np.float32),
            "actions": rng.integers(0, ACTIONS, (t, n)).astype(np.int64),
            "logp": np.full((t, n), -0.69, np.float32), "rewards": np.ones((t, n), np.float32),
            "dones": dones, "terminated": dones.copy(), "valid": np.ones((t, n), bool),
            "last_obs": rng.standard_normal((n, *OBS)).astype(np.float32)}


def batch() -> dict:
    a = fragment(B)
    a["versions"] = np.zeros(B, np.int64)
    return a


def header(kind: str, **over) -> dict:
    h = {"k": kind, "v": 1, "job": JOB, "from": "actor-0-0", "seq": 0, "pv": 0, "arr": [], "meta": {}}
    h.update(over)
    return h


def fresh_seq() -> int:
    """A sequence number ahead of every real one (a day): a receiver refuses a replay before it
    validates, so a hostile message must look new to reach the check it is meant to fail. (None of
    these is ever accepted, so none moves its sender's numbering.)"""
    return now_us() + 86_400 * 10 ** 6


def frag_msg(arrays=None, pv: int = 0, sender: str = "actor-0-0", meta=None) -> list:
    return encode("fragment", JOB, sender, fresh_seq(), pv, fragment() if arrays is None else arrays,
                  meta or {"frames": T * N})


def batch_msg(arrays=None, sender: str = "buffer-0-0", meta=None) -> list:
    return encode("batch", JOB, sender, fresh_seq(), 0, batch() if arrays is None else arrays,
                  {"buffer": 0} if meta is None else meta)


def with_(base: dict, **changes) -> dict:
    a = dict(base)
    for k, v in changes.items():
        if v is None:
            a.pop(k)
        else:
            a[k] = v
    return a


def nan_at(a: np.ndarray, value=np.nan) -> np.ndarray:
    a = a.copy()
    a.reshape(-1)[0] = value
    return a


def classes() -> list[tuple[str, str, list, str]]:
    """(name, target socket, frames, expected reject reason); targets: fragments, credits, batches."""
    f, b = fragment(), batch()
    bad_bool = f["dones"].copy().view(np.uint8)
    bad_bool[0, 0] = 2
    return [
        # crashes (the header's values, not its form)
        ("kind_is_list", "fragments", [msgpack.packb(header([1]))], "kind"),
        ("kind_is_map", "batches", [msgpack.packb(header({"a": 1}))], "kind"),
        ("pv_2_64_minus_1", "fragments", [msgpack.packb(header("fragment", pv=2**64 - 1))], "header"),
        ("seq_negative", "fragments", [msgpack.packb(header("fragment", seq=-1))], "header"),
        ("framestack_T_huge_for_cartpole", "fragments",
         frag_msg(with_(f, obs=None, frames=np.zeros((1000, N, 1, 1), np.float32),
                        key=np.ones((1000, N), bool), keystacks=np.zeros((0, 1, 1, 1), np.float32))), "fields"),
        ("fragment_many_envs", "fragments", frag_msg(fragment(n=64)), "shape"),
        ("fragment_long_T", "fragments", frag_msg(fragment(t=64)), "shape"),
        ("batch_actions_shape", "batches", batch_msg(with_(b, actions=np.zeros((T, 3), np.int64))), "shape"),
        ("batch_action_out_of_range", "batches", batch_msg(with_(b, actions=nan_at(b["actions"], 7))), "value"),
        ("batch_action_negative", "batches", batch_msg(with_(b, actions=nan_at(b["actions"], -1))), "value"),
        ("batch_obs_nan", "batches", batch_msg(with_(b, obs=nan_at(b["obs"]))), "value"),
        ("batch_version_negative", "batches", batch_msg(with_(b, versions=nan_at(b["versions"], -5))), "version"),
        ("batch_extra_array", "batches", batch_msg(with_(b, extra=np.zeros(3, np.float32))), "fields"),
        ("batch_wrong_dtype", "batches", batch_msg(with_(b, rewards=b["rewards"].astype(np.float64))), "dtype"),
        ("batch_unknown_buffer", "batches", batch_msg(meta={"buffer": 9}), "meta"),
        ("batch_buffer_is_list", "batches", batch_msg(meta={"buffer": [0]}), "meta"),
        ("batch_negative_feedback", "batches", batch_msg(meta={"buffer": 0, "received": -5}), "meta"),
        ("batch_float_feedback", "batches", batch_msg(meta={"buffer": 0, "dropped": 1e300}), "meta"),
        ("batch_forged_sender", "batches", batch_msg(sender="evil"), "sender"),
        # poisoning
        ("fragment_obs_nan", "fragments", frag_msg(with_(f, obs=nan_at(f["obs"]))), "value"),
        ("fragment_obs_inf", "fragments", frag_msg(with_(f, obs=nan_at(f["obs"], np.inf))), "value"),
        ("fragment_last_obs_nan", "fragments", frag_msg(with_(f, last_obs=nan_at(f["last_obs"]))), "value"),
        ("fragment_logp_nan", "fragments", frag_msg(with_(f, logp=nan_at(f["logp"]))), "value"),
        ("fragment_logp_positive", "fragments", frag_msg(with_(f, logp=nan_at(f["logp"], 3.0))), "value"),
        ("fragment_reward_inf", "fragments", frag_msg(with_(f, rewards=nan_at(f["rewards"], -np.inf))), "value"),
        ("fragment_bool_not_0_1", "fragments", frag_msg(with_(f, dones=bad_bool.view(bool))), "value"),
        ("fragment_action_out_of_range", "fragments", frag_msg(with_(f, actions=nan_at(f["actions"], 2))), "value"),
        ("fragment_version_1e12", "fragments", frag_msg(pv=10**12), "version"),
        ("credit_from_stranger", "credits",
         encode("credit", JOB, "evil", 0, 10**12, None, {"grant": 1}), "sender"),
        ("credit_huge_grant", "credits", encode("credit", JOB, "learner-0-0", 0, 0, None, {"grant": 10**9}), "meta"),
        ("credit_with_arrays", "credits",
         encode("credit", JOB, "learner-0-0", 0, 0, {"x": np.zeros(4, np.float32)}, {"grant": 1}), "size"),
    ]


def sockets(ctx: zmq.Context, run_dir) -> dict[str, zmq.Socket]:
    out = {}
    for name, path, identity in (("fragments", "buffer-0-0-fragments", "actor-0-0"),
                                 ("credits", "buffer-0-0-credits", "learner-0-0"),
                                 ("batches", "learner-0-0-batches", "buffer-0-0")):
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 2000)
        # an insider holding the key of the role that may send there: validation, not ZAP, must stop these
        as_job_client(s, run_dir, identity, path.rsplit("-", 1)[0])
        s.connect(ipc(run_dir, path))
        out[name] = s
    return out


# ---------------------------------------------------------------------------------------- fuzzing
def _mutate_array(rng: random.Random, a: np.ndarray) -> tuple[np.ndarray, str]:
    """A value mutation the receiver must refuse, with its reason."""
    a = np.array(a)
    choice = rng.randrange(4) if a.dtype.kind == "f" else rng.randrange(2, 4)
    flat = a.reshape(-1)
    i = rng.randrange(flat.size)
    if choice == 0:
        flat[i] = rng.choice([math.nan, math.inf, -math.inf])
        return a, "value"
    if choice == 1:
        return a.astype(np.float64 if a.dtype == np.float32 else np.float32), "dtype"
    if choice == 2 and a.shape[0] > 1:
        return a[:-1].copy(), "shape"
    return np.concatenate([a, a[:1]]), "shape"


def fuzz(rng: random.Random) -> tuple[str, list, str]:
    """A message mutated from a valid fragment or batch: (target, frames, expected reason)."""
    target = rng.choice(["fragments", "batches"])
    base = fragment() if target == "fragments" else batch()
    build = frag_msg if target == "fragments" else batch_msg
    kind = rng.randrange(10)
    if kind == 0:
        name = rng.choice(list(base))
        return target, build(with_(base, **{name: None})), "fields"
    if kind == 1:
        return target, build(with_(base, **{f"x{rng.randrange(9)}": np.zeros(2, np.float32)})), "fields"
    if kind == 2:
        frames = build(base)
        h = msgpack.unpackb(frames[0])
        key = rng.choice(["k", "pv", "seq", "from", "job", "v"])
        h[key] = rng.choice([[1], {"a": 1}, -1, 2**64 - 1, 1.5, None, b"x"])
        return target, [msgpack.packb(h, use_bin_type=True), *frames[1:]], {
            "k": "kind", "job": "job", "v": "schema"}.get(key, "header")
    if kind == 3:
        frames = build(base)
        i = rng.randrange(1, len(frames))
        frames[i] = bytes(frames[i])[: max(0, len(frames[i]) - rng.randrange(1, 16))]
        return target, frames, "shape"
    if kind == 4 and target == "fragments":
        return target, frag_msg(pv=rng.choice([10**6, 10**12, 2**61])), "version"
    if kind == 4:
        return target, batch_msg(sender=rng.choice(["evil", "buffer-0-1", "actor-0-0"])), "sender"
    name = rng.choice([k for k in base])
    if target == "batches" and name == "versions":
        v = np.array(base["versions"])
        v[rng.randrange(v.size)] = -rng.randrange(1, 10**6)
        return target, build(with_(base, versions=v)), "version"
    if name in ("dones", "terminated", "valid"):
        v = np.array(base[name]).view(np.uint8).copy()
        v.reshape(-1)[rng.randrange(v.size)] = rng.randrange(2, 256)
        return target, build(with_(base, **{name: v.view(bool)})), "value"
    if name == "actions":
        v = np.array(base[name])
        v.reshape(-1)[rng.randrange(v.size)] = rng.choice([-1, 2, 99, -2**40])
        return target, build(with_(base, actions=v)), "value"
    arr, reason = _mutate_array(rng, base[name])
    return target, build(with_(base, **{name: arr})), reason
