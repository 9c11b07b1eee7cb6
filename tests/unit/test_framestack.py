"""Stacked frames travel once and are rebuilt exactly, resets included; bad inputs are refused."""
import numpy as np
import pytest

from tianji.runtime.framestack import compress, expand
from tianji.runtime.wire import WireError


def stacked_episode(T=20, N=3, S=4, H=6, W=5, resets=((7, 0), (8, 2), (15, 1)), seed=0):
    """Observations as a frame-stacking env makes them: shift + new frame; zero-padded stack after a reset."""
    rng = np.random.default_rng(seed)
    obs = np.empty((T, N, S, H, W), np.uint8)
    cur = rng.integers(0, 255, (N, S, H, W), dtype=np.uint8)
    reset_at = set(resets)
    for t in range(T):
        new = rng.integers(0, 255, (N, H, W), dtype=np.uint8)
        for n in range(N):
            if (t, n) in reset_at:
                cur[n] = 0
            else:
                cur[n, :-1] = cur[n, 1:]
            cur[n, -1] = new[n]
        obs[t] = cur
    return obs


def test_round_trip_is_exact_and_four_times_smaller():
    obs = stacked_episode()
    c = compress(obs)
    assert c["key"][0].all() and c["key"].sum() == 3 + 3  # t=0 plus the three resets
    np.testing.assert_array_equal(expand(c["frames"], c["key"], c["keystacks"], 4), obs)
    T, N, S, H, W = obs.shape
    sent = sum(a.nbytes for a in c.values())
    assert sent == T * N * H * W + 6 * (S - 1) * H * W + T * N  # one frame per step + the key stacks


def test_expand_rejects_inconsistent_messages():
    c = compress(stacked_episode())
    with pytest.raises(WireError):
        expand(c["frames"], c["key"], c["keystacks"][:-1], 4)  # one key stack missing
    key = c["key"].copy()
    key[0, 0] = False
    with pytest.raises(WireError):
        expand(c["frames"], key, c["keystacks"][1:], 4)  # first step must be a key
    with pytest.raises(WireError):
        expand(c["frames"][:, :, :3], c["key"], c["keystacks"], 4)  # frame size mismatch
