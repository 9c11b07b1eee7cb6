"""Reset seeds for vector envs, in the form every backend takes.

Callers seed a vector env with one base seed (env i gets seed + i, Gymnasium's rule), but
backends differ in what they accept: Gymnasium's SyncVectorEnv takes a Python int or a
list of ints (not a numpy integer), ale-py's native AtariVectorEnv an int or an ndarray of
C ints, so nothing at or above 2**31 (the evaluator's seeds are there, roles/evaluator.py;
an actor's can be, at the top of env.seed's range). `per_env` turns any seed into n plain
ints; `fit_c_int` maps each one the native env cannot take into its range, deterministically.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

C_INT_LIMIT = 2 ** 31 - 1  # ALE's seeds are C ints, and -1 means "random": use [0, 2**31 - 1)


def per_env(seed: Any, n: int) -> Optional[list[int]]:
    """None, an int (numpy's too) → seed + i for env i; a sequence of n ints → those, as ints."""
    if seed is None:
        return None
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return [int(seed) + i for i in range(n)]
    seeds = np.asarray(seed)
    if seeds.shape != (n,) or not np.issubdtype(seeds.dtype, np.integer):
        raise ValueError(f"seed must be an int or {n} ints, got {seed!r}")
    return [int(s) for s in seeds]


def fit_c_int(seeds: list[int]) -> np.ndarray:
    """Seeds in [0, 2**31 - 1) unchanged; any other through numpy's SeedSequence (a hash of the
    whole integer) to 31 bits. Distinct seeds stay distinct with probability ~1 - n**2 / 2**32."""
    out = [s if 0 <= s < C_INT_LIMIT
           else int(np.random.SeedSequence(abs(s)).generate_state(1, np.uint32)[0] % C_INT_LIMIT)
           for s in seeds]
    return np.asarray(out, dtype=np.int64)
