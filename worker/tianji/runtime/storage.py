"""Sample storage inside a buffer: a FIFO rollout queue (on-policy) and a replay ring (off-policy).

Both take whole fragments ([T, N] steps from one actor, one behaviour
version) and hand out learner batches as dicts of numpy arrays.
"""
from __future__ import annotations

from collections import deque
from typing import Optional

import numpy as np

Fragment = dict  # name -> np.ndarray, plus "version": int


def fragment_samples(frag: Fragment) -> int:
    return int(np.count_nonzero(frag["valid"]))


def fragment_nbytes(frag: Fragment) -> int:
    return sum(v.nbytes for v in frag.values() if isinstance(v, np.ndarray))


class RolloutQueue:
    """Fragments for PPO, each consumed at most once, freshest first; bounded in fragments and
    (`max_bytes`) in bytes, the oldest dropped first.

    Serving the newest fragments (LIFO) keeps the policy lag of what the
    learner trains on as small as production allows; older fragments wait
    and are dropped once they exceed maxPolicyLag (or the bound).
    """

    def __init__(self, max_fragments: int, max_bytes: Optional[int] = None):
        if max_fragments < 1:
            raise ValueError("max_fragments must be >= 1")
        self.q: deque[Fragment] = deque()
        self.max_fragments = max_fragments
        self.max_bytes = max_bytes
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self.q)

    def samples(self) -> int:
        return sum(fragment_samples(f) for f in self.q)

    def put(self, frag: Fragment) -> int:
        """Append; returns the number of samples dropped (oldest first) to respect the bound."""
        self.q.append(frag)
        self.nbytes += fragment_nbytes(frag)
        dropped = 0
        while len(self.q) > self.max_fragments or (self.max_bytes is not None and self.nbytes > self.max_bytes
                                                   and len(self.q) > 1):
            old = self.q.popleft()
            self.nbytes -= fragment_nbytes(old)
            dropped += fragment_samples(old)
        return dropped

    def drop_stale(self, learner_version: int, max_lag: Optional[int]) -> int:
        """Drop fragments whose lag (learner_version - version) exceeds max_lag; returns samples dropped."""
        if max_lag is None:
            return 0
        keep, dropped = deque(), 0
        for f in self.q:
            if learner_version - f["version"] > max_lag:
                dropped += fragment_samples(f)
            else:
                keep.append(f)
        self.q = keep
        self.nbytes = sum(fragment_nbytes(f) for f in keep)
        return dropped

    def pop_batch(self, fragments: int) -> Optional[dict[str, np.ndarray]]:
        """Concatenate the newest `fragments` fragments along the env axis, or None if too few."""
        if fragments < 1 or len(self.q) < fragments:
            return None
        frags = [self.q.pop() for _ in range(fragments)]
        self.nbytes -= sum(fragment_nbytes(f) for f in frags)
        out = {}
        for k in frags[0]:
            if k == "version":
                continue
            axis = 0 if k == "last_obs" else 1
            out[k] = np.concatenate([f[k] for f in frags], axis=axis) if len(frags) > 1 else frags[0][k]
        out["versions"] = np.concatenate(
            [np.full(f["last_obs"].shape[0], f["version"], dtype=np.int64) for f in frags])
        return out


def nstep_transitions(frag: Fragment, n: int, gamma: float) -> dict[str, np.ndarray]:
    """Valid transitions of a fragment with n-step returns truncated at episode or fragment end.

        R_t = sum_{j<k} gamma^j r_{t+j},  next = o_{t+k},  discount = gamma^k (1 - terminated_{t+k-1})

    where k <= n stops at the first done and at the fragment's last step
    (o_T is `last_obs`). Reset steps (valid == False) are not transitions.
    """
    obs, r = frag["obs"], np.asarray(frag["rewards"], dtype=np.float32)
    done, term = np.asarray(frag["dones"], bool), np.asarray(frag["terminated"], bool)
    T, N = r.shape
    all_obs = np.concatenate([obs, frag["last_obs"][None]], 0)
    t_idx = np.broadcast_to(np.arange(T)[:, None], (T, N))
    e_idx = np.broadcast_to(np.arange(N)[None, :], (T, N))
    ret = r.copy()
    nxt = t_idx + 1
    disc = np.full((T, N), gamma, dtype=np.float32)
    last_term = term.copy()
    alive = ~done
    for j in range(1, n):
        tj = t_idx + j
        can = alive & (tj < T)
        tjc = np.minimum(tj, T - 1)
        ret += np.where(can, (gamma ** j) * r[tjc, e_idx], 0.0).astype(np.float32)
        nxt = np.where(can, tj + 1, nxt)
        disc = np.where(can, np.float32(gamma ** (j + 1)), disc)
        last_term = np.where(can, term[tjc, e_idx], last_term)
        alive = can & ~done[tjc, e_idx]
    disc = disc * (1.0 - last_term)
    m = np.asarray(frag["valid"], bool)
    return {"obs": obs[m], "actions": np.asarray(frag["actions"])[m].astype(np.int64),
            "returns": ret[m], "next_obs": all_obs[nxt[m], e_idx[m]], "discounts": disc[m].astype(np.float32),
            "versions": np.full(int(m.sum()), frag["version"], dtype=np.int64)}


class Replay:
    """Uniform replay ring of transitions (DQN)."""

    def __init__(self, capacity: int, seed: int):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.rng = np.random.default_rng(seed)
        self.data: dict[str, np.ndarray] = {}
        self.pos = 0
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def put(self, tr: dict[str, np.ndarray]) -> int:
        n = len(tr["actions"])
        if n == 0:
            return 0
        if not self.data:
            self.data = {k: np.empty((self.capacity, *v.shape[1:]), dtype=v.dtype) for k, v in tr.items()}
        if n > self.capacity:
            tr = {k: v[-self.capacity:] for k, v in tr.items()}
            n = self.capacity
        idx = (self.pos + np.arange(n)) % self.capacity
        for k, v in tr.items():
            self.data[k][idx] = v
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.capacity, self.size + n)
        return n

    def sample(self, count: int) -> dict[str, np.ndarray]:
        if self.size == 0:
            raise ValueError("sample from an empty replay")
        idx = self.rng.integers(0, self.size, count)
        return {k: v[idx] for k, v in self.data.items()}
