"""Double-buffered Atari sampling (envs/split.py + Rollout): the same transitions as stepping all envs at once."""
import numpy as np
import pytest
import torch

from helpers import EXAMPLES
from tianji.control.spec import load_job
from tianji.envs import split
from tianji.runtime.rollout import Rollout

pytest.importorskip("ale_py.vector_env")
torch.set_num_threads(1)  # as in an actor: on a loaded 2-core box two spinning OpenMP threads stall the loop

# float32: int8's activation scales follow each call's batch, so a half's greedy actions may differ
# from the whole batch's (actorPrecision auto acts in int8 for DQN where the kernels run)
GREEDY = ["spec.algorithm.epsilonStart=0", "spec.algorithm.epsilonEnd=0", "spec.env.numEnvs=5",
          "spec.env.fragmentLength=24", "spec.env.episodicLife=true", "spec.model.actorPrecision=float32"]


def _fragments(monkeypatch, double: bool, env_id: str, n: int = 3):
    monkeypatch.setenv("TIANJI_ATARI_BACKEND", "native")
    monkeypatch.setenv(split.ENV_DOUBLE_BUFFER, "1" if double else "0")
    job = load_job(EXAMPLES / "pong-dqn.yaml", [*GREEDY, f"spec.env.id={env_id}"])
    r = Rollout(job.spec, seed=7)
    try:
        assert hasattr(r.env, "halves") == double
        out = []
        for _ in range(n):
            arrays, finished = r.fragment()
            out.append((arrays, finished, r.obs.copy(), r.ep_return.copy()))
        return out
    finally:
        r.close()


@pytest.mark.parametrize("env_id", ["ALE/Pong-v5", "ALE/Breakout-v5"])
def test_double_buffered_fragments_equal_sequential_ones(monkeypatch, env_id):
    seq = _fragments(monkeypatch, False, env_id)
    dbl = _fragments(monkeypatch, True, env_id)
    for (a, fa, oa, ra), (b, fb, ob, rb) in zip(seq, dbl):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        assert sorted(fa) == sorted(fb)
        np.testing.assert_array_equal(oa, ob)
        np.testing.assert_array_equal(ra, rb)
    # the comparison means something: envs moved, and (Breakout, episodic life) dones were written
    assert seq[-1][0]["obs"][-1].std() > 0 and not np.array_equal(seq[0][0]["obs"][0], seq[-1][0]["obs"][-1])
    if env_id == "ALE/Breakout-v5":
        assert any(f[0]["dones"].any() for f in seq)


def test_actors_double_buffer_only_with_a_second_core(monkeypatch):
    monkeypatch.delenv(split.ENV_DOUBLE_BUFFER, raising=False)
    assert not split.wanted(1) and not split.wanted(1.5) and split.wanted(2)
    monkeypatch.setenv(split.ENV_DOUBLE_BUFFER, "0")
    assert not split.wanted(4)
    monkeypatch.setenv(split.ENV_DOUBLE_BUFFER, "1")
    assert split.wanted(0.5)
