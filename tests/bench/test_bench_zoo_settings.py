"""bench/zoo_settings.py: the seed pairs' ratios, the job that copies rl-zoo's entry, bad input."""
import pytest

from bench import zoo_settings as zs
from helpers import EXAMPLES
from tianji.control.spec import load_job


def test_pairs_divide_each_seeds_frames_and_seconds_and_leave_out_a_missed_target():
    rows = {"tianji": [(100, 10.0), (None, None), (90, 6.0)], "tianji_frag": [(50, 5.0), (80, 8.0), (60, 3.0)],
            "sb3": [(50, 20.0), (40, 10.0), (60, 12.0)]}
    runs = [{"arm": arm, "seed": seed, "frames": f, "seconds": s}
            for seed in (1, 2, 3) for arm, rs in rows.items() for f, s in [rs[seed - 1]]]
    for r in runs:
        if r["arm"] == "sb3":
            r["frames_rollout_end"] = 2 * r["frames"]
    p = zs.pairs(runs, [1, 2, 3])
    assert p["tianji_over_sb3_frames"] == {"seeds": [1, 2, 3], "ratios": [2.0, None, 1.5], "median": 1.75,
                                           "geomean": round(3 ** 0.5, 3)}
    assert p["tianji_over_sb3_frames_rollout_end"]["ratios"] == [1.0, None, 0.75]
    assert p["tianji_over_sb3_seconds"]["ratios"] == [0.5, None, 0.5]
    assert p["tianji_frag_over_sb3_frames"] == {"seeds": [1, 2, 3], "ratios": [1.0, 2.0, 1.0], "median": 1.0,
                                                "geomean": round(2 ** (1 / 3), 3)}
    assert set(p) == {f"{arm}_over_sb3_{w}" for arm in ("tianji", "tianji_frag")
                      for w in ("frames", "frames_rollout_end", "seconds")}
    assert zs.pairs([r for r in runs if not (r["arm"] == "sb3" and r["seed"] == 3)], [1, 2, 3])[
        "tianji_frag_over_sb3_frames"]["ratios"] == [1.0, 2.0, None]  # a seed SB3 did not run


def test_sb3s_crossing_is_also_counted_at_the_end_of_its_rollout(monkeypatch):
    """TianJi sees a crossing when a batch's fragments arrive; SB3's step count is rounded up to its
    rollout's end (n_envs x n_steps = 4096 on Acrobot) for the like-for-like ratio."""
    class Done:
        returncode, stderr = 0, ""
        stdout = '{"hit": {"seconds": 3.0, "frames": 58272, "mean_return": -99.0}, "frames": 58272, "end_s": 3.1}'

    monkeypatch.setattr(zs, "sb3_python", lambda: "python")
    monkeypatch.setattr(zs.subprocess, "run", lambda *a, **k: Done())
    r = zs.sb3_run("Acrobot-v1", 1, -100.0, 10.0)
    assert (r["frames"], r["frames_rollout_end"]) == (58272, 15 * 4096)


def test_the_benchmark_job_copies_rl_zoos_entry():
    """What SB3 runs and what the job says are one set of settings: envs in all, rollout length
    (rl-zoo's n_steps is each env's fragment), batch, epochs, discounting, entropy, normalisation."""
    spec = load_job(zs.JOB).spec
    zoo = zs.ZOO[spec.env.id]
    a, e = spec.algorithm, spec.env
    assert e.num_envs * spec.topology.actors == zoo["n_envs"]
    assert e.fragment_length == zoo["ppo"]["n_steps"]
    assert a.batch_size == zoo["n_envs"] * zoo["ppo"]["n_steps"]
    assert (a.epochs, a.gamma, a.gae_lambda, a.ent_coef) == (zoo["ppo"]["n_epochs"], zoo["ppo"]["gamma"],
                                                              zoo["ppo"]["gae_lambda"], zoo["ppo"]["ent_coef"])
    assert a.minibatch_size == 64 and a.lr == 3e-4 and a.clip_coef == 0.2  # SB3's defaults
    assert a.normalize_observations and a.normalize_rewards and zoo["normalize"]


def test_a_job_of_a_task_without_a_kept_entry_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as e:
        zs.main(["--job", str(EXAMPLES / "cartpole-ppo.yaml")])
    assert e.value.code == 2 and "no rl-zoo entry kept here for CartPole-v1" in capsys.readouterr().err


def test_a_malformed_variant_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        zs.main(["--variant", "frag=env.fragmentLength=256"])
    assert e.value.code == 2 and "--variant NAME=spec.path=value" in capsys.readouterr().err
