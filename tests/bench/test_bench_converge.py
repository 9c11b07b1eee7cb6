"""bench/converge.py: the stability read from a run's (seconds, mean-100) curve after it first crosses a target."""
from bench import converge


def test_a_collapse_after_the_crossing_shows_in_min_final_and_held_fraction():
    # crosses 300 at 10 s, dips to 250 for 10 s, back up, then falls to 120 at 40 s; the run ends at 60 s
    curve = [(0.0, 100.0), (10.0, 300.0), (20.0, 250.0), (30.0, 480.0), (40.0, 120.0)]
    st = converge.stability(curve, 60.0)
    assert st["300.0"] == {"after_s": 10.0, "min": 120.0, "final": 120.0, "held_fraction": 0.4}  # 10 + 10 of 50 s
    assert st["475.0"] == {"after_s": 30.0, "min": 120.0, "final": 120.0, "held_fraction": round(10 / 30, 3)}


def test_a_run_that_holds_is_held_to_its_end_and_one_that_never_crosses_has_no_entry():
    st = converge.stability([(5.0, 200.0), (8.0, 310.0), (9.0, 500.0)], None)  # ends at its last point
    assert st["300.0"]["held_fraction"] == 1.0 and st["300.0"]["min"] == 310.0
    assert st["475.0"] == {"after_s": 9.0, "min": 500.0, "final": 500.0, "held_fraction": 1.0}
    assert converge.stability([(1.0, 100.0)], 10.0) == {"300.0": None, "475.0": None}
    assert converge.stability([], None) == {"300.0": None, "475.0": None}


def test_with_frames_the_crossing_names_its_frame_count():
    st = converge.stability([(1.0, 100.0, 1000), (2.0, 320.0, 2500), (3.0, 290.0, 4000)], 4.0)
    assert st["300.0"] == {"after_s": 2.0, "min": 290.0, "final": 290.0, "held_fraction": 0.5, "frames_at": 2500}


def test_pair_ratios_divide_each_seeds_times_and_leave_out_a_missed_target():
    res = {"tianji_hand": [{"seconds": {"475.0": 10.0}}, {"seconds": {"475.0": 12.0}}, {"seconds": {}},
                           {"seconds": {"475.0": 9.0}}],
           "sb3": [{"seconds": {"475.0": 20.0}}, {"seconds": {"475.0": 16.0}}, {"seconds": {"475.0": 30.0}},
                   {"seconds": {}}]}
    p = converge.pair_ratios(res, [1, 2, 3, 4])
    assert p == {"tianji_hand_over_sb3": {"seeds": [1, 2, 3, 4], "ratios": [0.5, 0.75, None, None],
                                          "median": 0.625}}


def test_sb3_at_the_examples_settings_mirrors_the_example():
    from tianji.control.spec import load_job

    s = converge.tianji_settings("ppo")
    job = load_job(converge.ROOT / "examples" / "cartpole-ppo.yaml")
    a, e = job.spec.algorithm, job.spec.env
    assert s["n_envs"] * s["n_steps"] == e.num_envs * job.spec.topology.actors * e.fragment_length
    assert (s["n_epochs"], s["batch_size"], s["learning_rate"], s["lr_anneal_frames"]) == (
        a.epochs, a.minibatch_size, a.lr, a.lr_anneal_frames)
    assert s["n_epochs"] != 20  # not rl-zoo's: the variant exists because the two differ


def test_sb3_runs_in_the_peers_environment_once_make_peers_made_it(tmp_path, monkeypatch):
    """bench/peers/.venv-sb3 (make peers) is SB3's interpreter once installed; before that, this one if it
    has SB3, else the baseline is unavailable, saying how to get it."""
    import sys

    venv = tmp_path / ".venv-sb3"
    (venv / "bin").mkdir(parents=True)
    monkeypatch.setattr(converge, "SB3_VENV_PYTHON", venv / "bin" / "python")
    monkeypatch.setitem(sys.modules, "stable_baselines3", None)  # this interpreter has no SB3
    assert converge.sb3_python() is None
    assert "make peers" in converge.sb3_run("ppo", 1, 1.0, 1)["unavailable"]
    (venv / ".installed").touch()
    assert converge.sb3_python() == str(venv / "bin" / "python")


def test_a_variant_names_its_spec_overrides_and_a_malformed_one_is_refused():
    assert converge.parse_variant("lr2=spec.algorithm.lr=2e-3,spec.algorithm.epochs=8") == (
        "lr2", ["spec.algorithm.lr=2e-3", "spec.algorithm.epochs=8"])
    for bad in ("lr2", "lr2=", "=spec.algorithm.lr=1", "lr2=algorithm.lr=1", "lr 2=spec.a=1", "x=spec.a"):
        assert converge.parse_variant(bad) == ("", []), bad
