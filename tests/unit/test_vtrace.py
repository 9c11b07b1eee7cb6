"""V-trace (algos/vtrace.py) against a plain reference loop written from IMPALA's definition,
its reduction to GAE / n-step returns on on-policy data, and a PPO update that uses it."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tianji.algos.ppo import gae
from tianji.algos.vtrace import vtrace

torch.set_num_threads(1)


def reference(tlp, blp, r, v, last_v, done, term, gamma, lam, rho_bar, c_bar, valid):
    """IMPALA eq. (1), one env at a time, as a sum over the trace (not the recursion), cut at episode ends."""
    T = len(r)
    vals = list(v) + [last_v]
    ratio = [1.0 if not valid[t] else math.exp(tlp[t] - blp[t]) for t in range(T)]
    rho = [min(rho_bar, x) for x in ratio]
    c = [lam * min(c_bar, x) for x in ratio]
    delta = [rho[t] * (r[t] + gamma * (1 - term[t]) * vals[t + 1] - vals[t]) for t in range(T)]
    vs = []
    for s in range(T):
        total, coef = 0.0, 1.0
        for t in range(s, T):
            total += coef * delta[t]
            if done[t]:
                break
            coef *= gamma * c[t]
        vs.append(vals[s] + total)
    adv = []
    for s in range(T):
        boot = vals[s + 1] if (done[s] or s == T - 1) else vs[s + 1]
        adv.append(rho[s] * (r[s] + gamma * (1 - term[s]) * boot - vals[s]))
    return np.array(vs), np.array(adv)


def _batch(T=12, N=3, seed=0, lag_noise=1.0):
    g = np.random.default_rng(seed)
    done = (g.random((T, N)) < 0.2).astype(np.float32)
    term = done * (g.random((T, N)) < 0.5)  # some ends are truncations
    valid = np.ones((T, N), bool)
    valid[1:][done[:-1] > 0] = False  # NEXT_STEP autoreset: the step after a done is a reset step
    return dict(
        tlp=g.normal(-0.7, lag_noise, (T, N)).astype(np.float32),
        blp=g.normal(-0.7, lag_noise, (T, N)).astype(np.float32),
        r=g.normal(0, 1, (T, N)).astype(np.float32), v=g.normal(0, 1, (T, N)).astype(np.float32),
        last_v=g.normal(0, 1, N).astype(np.float32), done=done, term=term.astype(np.float32), valid=valid)


def _run(b, gamma, lam, rho_bar, c_bar, logp_equal=False):
    t = {k: torch.from_numpy(x) for k, x in b.items()}
    blp = t["tlp"] if logp_equal else t["blp"]
    return vtrace(t["tlp"], blp, t["r"], t["v"], t["last_v"], t["done"], t["term"], gamma, lam, rho_bar, c_bar,
                  t["valid"])


@pytest.mark.parametrize("gamma,lam,rho_bar,c_bar", [(0.99, 1.0, 1.0, 1.0), (0.9, 0.8, 1.0, 1.0),
                                                     (0.97, 0.95, 2.0, 0.5), (0.5, 1.0, 0.3, 0.3)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vtrace_matches_the_reference_loop(gamma, lam, rho_bar, c_bar, seed):
    b = _batch(seed=seed)
    out = _run(b, gamma, lam, rho_bar, c_bar)
    for n in range(b["r"].shape[1]):
        col = {k: (x[:, n] if x.ndim == 2 else x[n]) for k, x in b.items()}
        vs, adv = reference(col["tlp"], col["blp"], col["r"], col["v"], float(col["last_v"]), col["done"],
                            col["term"], gamma, lam, rho_bar, c_bar, col["valid"])
        np.testing.assert_allclose(out.vs[:, n].numpy(), vs, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(out.advantages[:, n].numpy(), adv, rtol=1e-4, atol=1e-4)
    assert float(out.rhos.max()) <= rho_bar + 1e-6


@pytest.mark.parametrize("lam", [1.0, 0.8, 0.0])
def test_on_policy_vtrace_is_gae_and_lambda_one_is_the_n_step_return(lam):
    b = _batch(T=16, N=4, seed=3)
    gamma = 0.95
    out = _run(b, gamma, lam, 1.0, 1.0, logp_equal=True)
    t = {k: torch.from_numpy(x) for k, x in b.items()}
    adv = gae(t["r"], t["v"], t["last_v"], t["done"], t["term"], gamma, lam)
    np.testing.assert_allclose(out.vs.numpy(), (adv + t["v"]).numpy(), rtol=1e-5, atol=1e-5)
    assert torch.all(out.rhos == 1.0)
    if lam == 1.0:  # the discounted rewards to the episode's end or the fragment's, then a bootstrap
        r, v, last_v, done, term = (b[k] for k in ("r", "v", "last_v", "done", "term"))
        T, N = r.shape
        for n in range(N):
            for s in range(T):
                g, k, ret = 1.0, s, 0.0
                while True:
                    ret += g * r[k, n]
                    nxt = v[k + 1, n] if k + 1 < T else last_v[n]
                    if done[k, n] or k == T - 1:
                        ret += g * gamma * (1 - term[k, n]) * nxt
                        break
                    g *= gamma
                    k += 1
                assert out.vs[s, n].item() == pytest.approx(ret, rel=1e-4, abs=1e-4)


def test_truncated_weights_bound_a_far_off_policy_batch():
    b = _batch(seed=5, lag_noise=30.0)  # log-ratios far beyond exp()'s float32 range
    out = _run(b, 0.99, 1.0, 1.0, 1.0)
    assert torch.isfinite(out.vs).all() and torch.isfinite(out.advantages).all()
    assert float(out.rhos.max()) <= 1.0
    # A behaviour policy that never takes what pi takes (pi/mu -> 0): no correction term survives, the
    # targets are the critic's own values and the advantages vanish.
    b["tlp"][:] = -60.0
    b["blp"][:] = 0.0
    out = _run(b, 0.99, 1.0, 1.0, 1.0)
    keep = torch.from_numpy(b["valid"])
    np.testing.assert_allclose(out.vs[keep].numpy(), b["v"][b["valid"]], atol=1e-5)
    assert float(out.advantages[keep].abs().max()) < 1e-5


def test_ppo_update_with_vtrace_reports_its_statistics():
    from tianji.algos.models import build_model
    from tianji.algos.ppo import PPOLearner
    from tianji.control.spec import EnvConfig, ModelConfig, PPOConfig
    from tianji.envs import probe_env

    info = probe_env(EnvConfig(id="CartPole-v1"))
    T, N = 8, 4
    g = np.random.default_rng(0)
    batch = {"obs": g.normal(0, 1, (T, N, 4)).astype(np.float32), "last_obs": g.normal(0, 1, (N, 4)).astype(np.float32),
             "actions": g.integers(0, 2, (T, N)), "logp": np.full((T, N), math.log(0.9), np.float32),
             "rewards": np.ones((T, N), np.float32), "dones": np.zeros((T, N), np.float32),
             "terminated": np.zeros((T, N), np.float32), "valid": np.ones((T, N), bool)}
    stats = {}
    for corr in ("none", "vtrace"):
        cfg = PPOConfig(batch_size=T * N, minibatch_size=T * N, epochs=2, off_policy_correction=corr)
        model = build_model("ppo", ModelConfig(hidden=[16]), info, 0)
        stats[corr] = PPOLearner(model, cfg, 0).update(batch)
    for corr, s in stats.items():
        for k in ("policy_loss", "value_loss", "entropy", "clip_fraction", "approx_kl", "grad_norm",
                  "explained_variance", "importance_weight"):
            assert math.isfinite(s[k]), (corr, k)
        assert s["grad_norm"] > 0 and s["train_steps"] == 2
    assert stats["none"]["importance_weight"] == 1.0
    # The behaviour policy claims p = 0.9 for every action; a fresh policy gives about 0.5: rho ~ 0.55.
    assert 0.3 < stats["vtrace"]["importance_weight"] < 0.8


@pytest.mark.slow
def test_vtrace_ppo_still_solves_cartpole(tmp_path):
    from helpers import EXAMPLES, read_summary, run_tianji

    r = run_tianji("run", str(EXAMPLES / "cartpole-ppo.yaml"), "--run-dir", str(tmp_path / "run"), "--quiet",
                   "--set", "spec.algorithm.offPolicyCorrection=vtrace", "--set", "spec.stop.seconds=240", timeout=420)
    s = read_summary(tmp_path / "run")
    assert r.returncode == 0 and s["reached_target"], (s["exit_reason"], s["mean_return"], r.stderr[-2000:])
    assert s["learner_stats"]["importance_weight"] <= 1.0
