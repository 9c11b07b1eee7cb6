"""The planner at scale: every unused core and GPU explained with a figure, GPU learners fed,
assumed figures named on the plan's first line, measured GPU figures and batch curves read and
cited (worker/tianji/control/planner/{measured,batchcurve,explain}.py, `tianji plan`).

The grid tests plan the Pong and CartPole examples for 16/64/128/512 cores with 0/1/8/32 GPUs
against the batch curves kept in docs/results/ and check properties, not figures: the figures
move whenever a curve is re-measured."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from tianji.cli import main
from tianji.cli.plan import first_screen
from tianji.control.planner import batchcurve, measured
from tianji.control.planner.plan import plan
from tianji.control.planner.profile import Profile, default_profile, with_gpu_figure
from tianji.control.spec import load_job

ROOT = Path(__file__).resolve().parents[2]
JOBS = ("pong-ppo", "cartpole-ppo")
CPUS = (16, 64, 128, 512)
GPUS = (0, 1, 8, 32)
GRID = [(j, c, g) for j in JOBS for c in CPUS for g in GPUS]
FIGURE = re.compile(r"\d")


@pytest.fixture(scope="module")
def plans():
    """Every plan of the grid, made once: the real batch curves, no device results (an empty
    device directory), so the GPU figure is the built-in one and must be named as assumed."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TIANJI_DEVICE_DIR", str(ROOT / "tests" / "no-such-device-dir"))
    try:
        out = {}
        for name in JOBS:
            job = load_job(ROOT / "examples" / f"{name}.yaml")
            for c in CPUS:
                for g in GPUS:
                    prof = with_gpu_figure(job, default_profile(job)) if g else default_profile(job)
                    out[name, c, g] = (job, plan(job, cpus=c, gpus=g, profile=prof))
        yield out
    finally:
        mp.undo()


def explained(p, resource: str) -> list[dict]:
    return [u for u in p.unused if resource in u["resources"]]


@pytest.mark.parametrize("name,cpus,gpus", GRID)
def test_every_unused_core_and_gpu_is_explained_with_a_figure(plans, name, cpus, gpus):
    job, p = plans[name, cpus, gpus]
    assert p.cpus_given == cpus and p.gpus_given == gpus
    if p.cpus_used < cpus - 1e-9:
        steps = explained(p, "cores")
        assert steps, f"{cpus - p.cpus_used:g} cores unused, no step explains them"
        assert all(FIGURE.search(u["why"]) for u in steps)
    if p.gpus_used < gpus:
        steps = explained(p, "gpus")
        assert steps, f"{gpus - p.gpus_used} GPUs unused, no step explains them"
        assert all(FIGURE.search(u["why"]) for u in steps)
    screen = first_screen(p)
    unused = next(line for line in screen if line.startswith("unused:"))
    if p.cpus_used < cpus - 1e-9:
        assert f" of {cpus} cores" in unused
    if p.gpus_used < gpus:
        assert f"{gpus - p.gpus_used} of {gpus} GPUs" in unused


@pytest.mark.parametrize("name,cpus,gpus", GRID)
def test_no_step_up_that_the_budget_rule_would_take_is_left(plans, name, cpus, gpus):
    """The explanation never names a step the plan should have taken: each step that fits buys
    less than minMarginalGain asks, however close the call."""
    job, p = plans[name, cpus, gpus]
    for u in p.unused:
        if u["gain"] is not None:
            assert (1 + u["gain"]) <= (1 + u["asks"]) * (1 + 1e-9), u


@pytest.mark.parametrize("name,cpus,gpus", [x for x in GRID if x[2]])
def test_a_gpu_plan_feeds_its_learners(plans, name, cpus, gpus):
    job, p = plans[name, cpus, gpus]
    if not p.gpus_used:
        return
    r = job.spec.replay_ratio
    assert p.production_fps * r >= p.learner_capacity_sps * (1 - 1e-6), \
        f"actors make {p.production_fps:.0f} frames/s, the GPU learners take {p.learner_capacity_sps:.0f} / r {r:g}"


@pytest.mark.parametrize("name,cpus,gpus", GRID)
def test_the_first_line_names_what_is_assumed(plans, name, cpus, gpus):
    job, p = plans[name, cpus, gpus]
    first = first_screen(p)[0]
    assert first.startswith("assumed: ")
    assert "learner samples/s per core (built-in" in first
    if gpus:
        assert "learner GPU samples/s (no measurement for this GPU; run tianji profile on it" in first
    else:
        assert "GPU" not in first
    curve = batchcurve.for_job(job)
    if curve.kind != batchcurve.MEASURED:
        assert curve.source() in first
    if name == "pong-ppo" and batchcurve.all_curves():
        assert "batch curve extrapolated from" in first


def test_cli_first_screen_on_the_issue_example(capsys, monkeypatch):
    monkeypatch.setenv("TIANJI_DEVICE_DIR", str(ROOT / "tests" / "no-such-device-dir"))
    assert main(["plan", str(ROOT / "examples" / "pong-ppo.yaml"), "--cpus", "512", "--gpus", "32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("assumed: ") and "learner GPU samples/s (no measurement" in lines[0]
    assert lines[1].startswith("measured: ")
    head = "\n".join(lines[:12])  # the first screen
    assert "of 32 GPUs" in head and "cores" in head and "unused: " in head
    assert "measured … extrapolated: nothing" not in "\n".join(lines)


# ----------------------------------------------------------------- batch curves

def curve_doc(env="CartPole-v1", algo="ppo", base=256, pts=((256, 80_000), (512, 120_000), (1024, 200_000)),
              job="cartpole-ppo", date="2026-11-27 01:00 UTC", target=475.0) -> dict:
    return {"job": job, "env": env, "algorithm": algo, "base_batch": base, "date": date, "target_return": target,
            "points": [{"batch": b, "frames_to_target_median": f, "reached": 2, "runs": 2} for b, f in pts]}


def write_curves(d: Path, *docs) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for doc in docs:
        (d / f"batch-curve-{doc['job']}.json").write_text(json.dumps(doc))
    return d


def test_curve_interpolates_and_extrapolates_within_bounds():
    c = batchcurve.parse(curve_doc(), "x.json")
    assert c.frames(256) == 80_000 and c.frames(384) == pytest.approx(100_000)
    assert c.frames(128) == 80_000  # flat below the smallest measured batch
    for b in (2048, 4096, 65536):
        f = c.frames(b)
        assert c.frames(1024) <= f <= c.frames(1024) * b / 1024  # never below the last point, never super-linear
    assert c.frames(4096) > c.frames(2048)  # the fitted line rises: the measured points do
    use = batchcurve.CurveUse(batchcurve.MEASURED, 256, (c,))
    assert use.ratio(1) == 1 and use.ratio(2) == pytest.approx(1.5) and use.ratio(4) == pytest.approx(2.5)
    assert not use.beyond(4) and use.beyond(8)


def test_curve_files_are_validated():
    with pytest.raises(ValueError, match="x.json: not a batch curve"):
        batchcurve.parse({"job": "a"}, "x.json")
    bad = curve_doc()
    bad["points"][0]["frames_to_target_median"] = -1
    with pytest.raises(ValueError, match="frames > 0"):
        batchcurve.parse(bad, "x.json")
    censored = curve_doc()
    censored["points"][2]["reached"] = 1
    assert batchcurve.parse(censored, "x.json").censored == (1024,)
    assert "lower bound at batch 1024" in batchcurve.parse(censored, "x.json").cite()
    with pytest.raises(ValueError, match="a curve needs two batch sizes"):
        batchcurve.parse(curve_doc(pts=((256, 80_000),)), "x.json")
    for p in censored["points"]:
        p["reached"] = 0
    with pytest.raises(ValueError, match="every point is a lower bound"):
        batchcurve.parse(censored, "x.json")


def test_a_job_without_its_own_curve_is_extrapolated_from_the_measured_ones(tmp_path, monkeypatch):
    d = write_curves(tmp_path / "results", curve_doc(),
                     curve_doc(env="Acrobot-v1", job="acrobot-ppo", base=4096,
                               pts=((4096, 150_000), (8192, 300_000))))
    monkeypatch.setenv("TIANJI_RESULTS_DIR", str(d))
    pong = load_job(ROOT / "examples" / "pong-ppo.yaml")
    use = batchcurve.for_job(pong)
    assert use.kind == batchcurve.EXTRAPOLATED and len(use.curves) == 2
    assert use.ratio(2) == pytest.approx(math.sqrt(1.5 * 2.0))  # geometric mean of the two at 2x their batch
    assert "extrapolated from Acrobot/CartPole" in use.source()
    p = plan(pong, cpus=64, gpus=0, profile=default_profile(pong))
    assert "batch curve extrapolated from Acrobot/CartPole" in first_screen(p)[0]
    cart = load_job(ROOT / "examples" / "cartpole-ppo.yaml")
    assert batchcurve.for_job(cart).kind == batchcurve.MEASURED
    q = plan(cart, cpus=64, gpus=0, profile=default_profile(cart))
    assert "batch-curve-cartpole-ppo.json, 2026-11-27 01:00 UTC" in "; ".join(q.measured)
    assert q.time_to_target_s is not None  # the job's own curve, to its own target: seconds


def test_groups_grow_while_the_measured_gain_clears_the_rule(tmp_path, monkeypatch):
    """A flat curve (batch size costs no frames) lets groups multiply progress; a curve where frames
    grow as fast as the batch makes more groups worthless: the plan follows the measurement."""
    cart = load_job(ROOT / "examples" / "cartpole-ppo.yaml")
    prof = Profile(actor_fps_per_core=1e5, learner_sps_per_core=1000.0, learner_sps_per_gpu=None,
                   message_seconds=0.0, fragment_samples=128, bytes_per_sample=64.0, param_bytes=1000.0,
                   allreduce_seconds={2: 1e-6}, ipc_bytes_per_second=1e12, learner_thread_scaling={2: 1.0})
    flat = write_curves(tmp_path / "flat", curve_doc(pts=((256, 1e5), (8192, 1e5))))
    steep = write_curves(tmp_path / "steep", curve_doc(pts=((256, 1e5), (512, 2e5), (1024, 4e5))))
    monkeypatch.setenv("TIANJI_RESULTS_DIR", str(flat))
    many = plan(cart, cpus=64, profile=prof)
    monkeypatch.setenv("TIANJI_RESULTS_DIR", str(steep))
    one = plan(cart, cpus=64, profile=prof)
    assert many.groups > 4 and one.groups == 1
    step = next(u for u in one.unused if u["what"].startswith("a group more"))
    assert step["gain"] < step["asks"] and "frames to target x2.000" in step["why"]
    assert "batch-curve-cartpole-ppo.json" in step["why"]


# ----------------------------------------------------------------- measured GPU figures

def gpu_profile(sps=40_000.0, name="NVIDIA H100 80GB HBM3", env="ALE/Pong-v5", algo="ppo", batch=1024) -> dict:
    """What `tianji profile` writes on a GPU machine (the keys the planner reads, and detail)."""
    return {"actor_fps_per_core": 1400.0, "learner_sps_per_core": 150.0, "learner_sps_per_gpu": sps,
            "message_seconds": 0.03, "fragment_samples": 512, "bytes_per_sample": 28256.0,
            "job": "pong-ppo", "env": env, "algorithm": algo, "batch_size": batch,
            "learner_gpu": {"device": "cuda", "device_name": name, "sps": sps}, "learner_gpu_name": name}


def test_gpu_figures_are_found_at_any_depth_and_named_by_device():
    doc = {"device": "NVIDIA H200", "date": "2026-11-28", "profiles": {"pong-ppo": {
        k: v for k, v in gpu_profile(name="cuda").items() if k != "learner_gpu"}}}
    figs = measured.gpu_figures(doc, "docs/device/h200.json")
    assert [(f.device, f.samples_per_s, f.date) for f in figs] == [("NVIDIA H200", 40_000.0, "2026-11-28")]
    own = measured.gpu_figures(gpu_profile(), "p.json")
    assert own[0].device == "NVIDIA H100 80GB HBM3"
    assert measured.gpu_figures({"learner_sps_per_gpu": 5.0}, "p.json") == []  # no device named: not a figure
    pong = load_job(ROOT / "examples" / "pong-ppo.yaml")
    cart = load_job(ROOT / "examples" / "cartpole-ppo.yaml")
    assert measured.find_gpu_figure(pong, figures=tuple(figs)).device == "NVIDIA H200"
    assert measured.find_gpu_figure(cart, figures=tuple(figs)) is None  # another env
    assert measured.find_gpu_figure(pong, model="h100", figures=tuple(figs)) is None


def test_device_results_replace_the_builtin_gpu_figure(tmp_path, monkeypatch, capsys):
    d = tmp_path / "device"
    d.mkdir()
    (d / "h100.json").write_text(json.dumps({"date": "2026-11-28 10:00 UTC", "results": [gpu_profile()]}))
    (d / "notes.json").write_text("{not json")  # a malformed file is skipped
    monkeypatch.setenv("TIANJI_DEVICE_DIR", str(d))
    pong = load_job(ROOT / "examples" / "pong-ppo.yaml")
    prof = default_profile(pong)
    assert not prof.gpu_assumed and prof.learner_sps_per_gpu == 40_000 and prof.gpu_device.startswith("NVIDIA H100")
    assert main(["plan", str(ROOT / "examples" / "pong-ppo.yaml"), "--cpus", "128", "--gpus", "8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "learner GPU samples/s" not in lines[0]
    assert "learner GPU 40,000 samples/s on NVIDIA H100 80GB HBM3" in lines[1] and "h100.json" in lines[1]
    # Asked for another GPU: nothing measured on it, so assumed, and named.
    assert main(["plan", str(ROOT / "examples" / "pong-ppo.yaml"), "--cpus", "128", "--gpus", "8",
                 "--gpu-model", "A100"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "learner GPU samples/s (no measurement for A100; run tianji profile on it" in first


def test_a_gpu_profile_file_is_measured_and_cited(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TIANJI_DEVICE_DIR", str(tmp_path / "none"))
    pf = tmp_path / "gpu-prof.json"
    pf.write_text(json.dumps(gpu_profile(sps=25_000.0)))
    assert main(["plan", str(ROOT / "examples" / "pong-ppo.yaml"), "--cpus", "64", "--gpus", "8",
                 "--profile", str(pf), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["profile"]["gpu_device"] == "NVIDIA H100 80GB HBM3" and not out["profile"]["gpu_assumed"]
    assert not any("learner GPU samples/s" in a for a in out["assumed"])
    assert any("25,000 samples/s on NVIDIA H100" in m and "gpu-prof.json" in m for m in out["measured"])
    assert any("per core" in m and "gpu-prof.json" in m for m in out["measured"])


def test_the_bench_output_is_what_the_planner_reads():
    """bench/batch_curve.py's points (a run short of the target counts its frames, a lower bound)
    parse as the curve the planner charges groups with."""
    from bench import batch_curve

    runs = [{"batch": 256, "seed": 1, "reached": True, "frames_to_target": 80_000, "env_frames": 80_500},
            {"batch": 256, "seed": 2, "reached": True, "frames_to_target": 90_000, "env_frames": 90_100},
            {"batch": 512, "seed": 1, "reached": False, "frames_to_target": None, "env_frames": 150_000},
            {"batch": 512, "seed": 2, "reached": True, "frames_to_target": 130_000, "env_frames": 130_200},
            {"batch": 1024, "seed": 1, "error": "the learner never published a policy"}]
    pts = batch_curve.points(runs)
    assert [(p["batch"], p["frames_to_target_median"], p["reached"], p["runs"]) for p in pts] == [
        (256, 85_000, 2, 2), (512, 140_000, 1, 2)]
    recs = [{"episodes": 50, "mean_return": 500.0, "env_frames": 10}, {"episodes": 100, "mean_return": 470.0,
            "env_frames": 20}, {"episodes": 120, "mean_return": 476.0, "env_frames": 30}]
    assert batch_curve.frames_at_target(recs, 475.0) == 30
    doc = curve_doc()
    doc["points"] = pts
    c = batchcurve.parse(doc, "docs/results/batch-curve-cartpole-ppo.json")
    assert c.points == ((256, 85_000), (512, 140_000)) and c.censored == (512,)


@pytest.mark.parametrize("name,cpus,gpus", GRID)
def test_time_to_target_is_charged_from_the_curve_it_cites(plans, name, cpus, gpus):
    job, p = plans[name, cpus, gpus]
    curve = batchcurve.for_job(job)
    assert p.frames_ratio == pytest.approx(curve.ratio(p.groups * p.learners))
    assert p.efficiency == pytest.approx(1 / (p.frames_ratio * p.lag_cost))
    assert p.batch_curve == curve.source()
    for u in p.unused:
        if u["what"].startswith("a group more") and u["gain"] is not None:
            assert curve.source() in u["why"]


def test_gpu_plans_that_starve_their_learners_go_when_one_that_feeds_them_exists():
    """search._gpus_fed: 3 groups of 3 actors starve their GPU learners (90k frames/s for 135k);
    2 groups of 5 feed theirs: only the fed one stays. With no fed GPU plan, nothing is dropped;
    CPU plans are never dropped for it."""
    from tianji.control.planner.prediction import Shape
    from tianji.control.planner.search import Candidate, _gpus_fed

    def cand(g, na, gl, tr_a, tr_l):
        return Candidate(Shape(g, na, 1, 1, 1.0, 0.5, 1.0, gl), {"tr_a": tr_a, "tr_l": tr_l})

    starved, fed, cpu_short = cand(3, 3, 1, 90e3, 135e3), cand(2, 5, 1, 100e3, 90e3), cand(2, 2, 0, 20e3, 30e3)
    assert _gpus_fed([starved, fed, cpu_short], 1.0) == [fed, cpu_short]
    assert _gpus_fed([starved, cpu_short], 1.0) == [starved, cpu_short]
    # Replay ratio 2 (each frame trained on twice): 90k frames/s feed 135k samples/s, both are fed.
    assert _gpus_fed([starved, fed], 2.0) == [starved, fed]
