"""bench/ablation.py: per-seed relaxed/strict ratios and steady rates, from runs' numbers."""
from bench import ablation


def _run(mode, seed, secs, frames, sps, lag=0.0):
    return {"job": "j", "mode": mode, "seed": seed, "reached_target": secs is not None, "seconds_to_target": secs,
            "frames_to_target": frames if secs else None, "produced_fps": sps, "consumed_sps": sps,
            "steady": {"consumed_sps": sps}, "policy_lag": {"mean": lag}}


def test_ratios_pair_the_modes_of_each_seed_and_leave_out_what_cannot_be_paired():
    runs = [_run("relaxed", 1, 10.0, 100, 200, 1.0), _run("strict", 1, 20.0, 80, 100),
            _run("strict", 2, 30.0, 90, 50), _run("relaxed", 2, None, 500, 100, 1.0),  # relaxed missed
            _run("relaxed", 3, 5.0, 50, 10), {"job": "j", "mode": "strict", "seed": 3, "error": "crashed"}]
    s = ablation.summarise(runs)["j"]
    r = s["per_seed_ratios"]
    assert r["time_to_target_strict_over_relaxed"] == [2.0] and r["frames_to_target_strict_over_relaxed"] == [0.8]
    assert r["consumed_sps_relaxed_over_strict"] == [2.0, 2.0]  # seeds 1 and 2; seed 3 has no strict run
    assert s["modes"]["relaxed"]["reached"] == 2 and s["modes"]["strict"]["runs"] == 2
    assert s["modes"]["strict"]["seconds_to_target_median"] == 25.0


def test_steady_rates_start_at_the_first_trained_version():
    recs = [{"t": 1.0, "policy_version": 0, "env_frames": 0, "lag_hist": {"0": 0}},
            {"t": 2.0, "policy_version": 1, "env_frames": 1000, "lag_hist": {"0": 256}},
            {"t": 4.0, "policy_version": 9, "env_frames": 5000, "lag_hist": {"0": 2256, "1": 1000}}]
    assert ablation.steady_rates(recs) == {"produced_fps": 2000, "consumed_sps": 1500}
    assert ablation.steady_rates(recs[:2]) == {"produced_fps": None, "consumed_sps": None}
