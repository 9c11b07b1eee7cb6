"""Learner statistics everywhere: in a short run's metrics.jsonl, summary.json, TensorBoard event
files and Prometheus endpoint (`tianji_learner_*`, the per-sample lag histogram); the report
format refuses bad lag histograms; W&B is optional with a clear error."""
from __future__ import annotations

import json
import math
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import EXAMPLES, free_port, run_tianji, wait_for
from tianji.control.contracts.accounting import Accounting
from tianji.control.contracts.rolereport import LAG_BOUNDS, LEARNER_STATS, ReportError, build_report, parse_report
from tianji.observability.exporter import JobExporter
from tianji.observability.metrics import RoleMetrics, metric_names

PPO = str(EXAMPLES / "cartpole-ppo.yaml")
PPO_STATS = {"policy_loss", "value_loss", "entropy", "clip_fraction", "approx_kl", "grad_norm",
             "explained_variance", "importance_weight"}


def _scrape(port: int) -> dict[str, list]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def test_a_vtrace_run_writes_learner_statistics_everywhere(running_tianji):
    from tensorboard.backend.event_processing import event_accumulator

    port, tb_port = free_port(), free_port()
    run = running_tianji(PPO, "--metrics-port", str(port), "--tensorboard", str(tb_port),
                         "--set", "spec.algorithm.offPolicyCorrection=vtrace",
                         "--set", "spec.stop.meanReturn=100000", "--set", "spec.stop.seconds=25")
    run.wait_for_frames(3000)
    # `--tensorboard` serves the run dir while the run lasts.
    wait_for(lambda: "learner/clip_fraction" in (_tb_tags(tb_port) or {}).get(".", {}), 60,
             "TensorBoard serving the run's learner statistics")
    got = wait_for(lambda: (lambda m: m if "tianji_learner_clip_fraction" in m else None)(_scrape(port)), 60,
                   "learner statistics on /metrics")
    assert {"tianji_learner_" + k for k in PPO_STATS} <= set(got)
    assert "tianji_learner_dqn_loss" not in got  # a PPO learner exports no DQN numbers
    buckets = {s.labels["le"]: s.value for s in got["tianji_learner_policy_lag_samples_bucket"]
               if s.labels["role"] == "learner"}
    assert buckets["+Inf"] > 0 and buckets["+Inf"] >= buckets["4.0"] >= buckets["0.0"]
    assert run.wait(120) == 0
    recs = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    last = recs[-1]
    assert PPO_STATS <= set(last["learner"])
    assert all(math.isfinite(v) for v in last["learner"].values())
    assert 0 <= last["learner"]["clip_fraction"] <= 1 and 0 < last["learner"]["importance_weight"] <= 1
    assert last["learner"]["grad_norm"] > 0 and last["learner"]["entropy"] > 0
    summary = run.summary()
    hist = summary["policy_lag_hist"]
    assert list(hist) == [*(str(b) for b in LAG_BOUNDS), "inf"]
    # Every consumed sample is in it (a PPO batch: one version per env column of fragmentLength steps),
    # and no sample lies beyond the lag bound the buffer enforces.
    consumed = json.loads((run.run_dir / "accounting.json").read_text())
    consumed = sum(p["counts"].get("samples_consumed_total", 0) for p in consumed["procs"] if p["role"] == "learner")
    assert sum(hist.values()) == pytest.approx(consumed, rel=0.05)
    assert summary["policy_lag"]["max"] <= 6 and sum(v for k, v in hist.items() if k in ("8", "16", "inf")) == 0
    # TensorBoard reads the run dir the launcher wrote.
    acc = event_accumulator.EventAccumulator(str(run.run_dir), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    tags = acc.Tags()
    for tag in ("charts/episode_return_mean", "throughput/actors_produced_fps", "throughput/learners_consumed_sps",
                "staleness/policy_lag_mean", "learner/clip_fraction", "learner/approx_kl",
                "learner/explained_variance"):
        assert tag in tags["scalars"], tag
    returns = acc.Scalars("charts/episode_return_mean")
    assert len(returns) >= 5 and returns[-1].step == pytest.approx(last["env_frames"], rel=0.2)
    assert returns[-1].value == pytest.approx(last["mean_return"], rel=1e-5)
    assert "staleness/policy_lag_samples" in tags["histograms"]
    h = acc.Histograms("staleness/policy_lag_samples")[-1].histogram_value
    assert h.num == pytest.approx(sum(last["lag_hist"].values()))
    assert _tb_tags(tb_port) == {}  # the TensorBoard server ended with the run


def _tb_tags(port: int) -> dict:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=5) as r:
            return json.loads(r.read())
    except OSError:  # not (or no longer) listening
        return {}


def _learner_metrics() -> RoleMetrics:
    m = RoleMetrics("j", "learner", 0, 0)
    m.observe_lag(np.array([0, 1, 1, 5]), samples_each=32)
    m.observe_lag(np.array([2000]))
    m.set("learner_clip_fraction", 0.25)
    m.set("learner_q_mean", 3.0)
    return m


def test_role_metrics_export_learner_series_and_a_per_sample_lag_histogram():
    from prometheus_client import generate_latest

    m = _learner_metrics()
    hist = m.snapshot()["lag"]["hist"]
    # buckets (le): 0 -> 32, 1 -> 64, 6 -> 32 (lag 5), beyond 1024 -> 1
    assert hist[0] == 32 and hist[1] == 64 and hist[LAG_BOUNDS.index(6)] == 32 and hist[-1] == 1
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(m.registry).decode())}
    assert fams["tianji_learner_clip_fraction"].samples[0].value == 0.25
    b = {s.labels["le"]: s.value for s in fams["tianji_learner_policy_lag_samples"].samples
         if s.name.endswith("_bucket")}
    assert (b["0.0"], b["1.0"], b["4.0"], b["6.0"], b["1024.0"], b["+Inf"]) == (32, 96, 96, 128, 128, 129)
    total = next(s.value for s in fams["tianji_learner_policy_lag_samples"].samples if s.name.endswith("_sum"))
    assert total == pytest.approx((0 + 1 + 1 + 5 + 2000) / 5 * 129)  # mean lag x samples
    assert "tianji_learner_clip_fraction" in metric_names()
    assert "tianji_learner_policy_lag_samples_bucket" in metric_names()
    # The launcher's exporter serves the same series from the reports.
    rep = parse_report(build_report(job="j", role="learner", group=0, index=0, incarnation="a", pid=1, started=1.0,
                                    seq=1, time=2.0, final=False, snapshot=m.snapshot(), episodes_total=0,
                                    recent=[], extra={}))
    acc = Accounting()
    acc.take(rep)
    ex = JobExporter("j")
    ex.update(acc)
    by = {f.name: f for f in ex.collect()}
    assert by["tianji_learner_q_mean"].samples[0].value == 3.0
    assert [s.value for s in by["tianji_learner_policy_lag_samples"].samples if s.labels.get("le") == "+Inf"] == [129]


def test_lag_histograms_survive_restarts_in_the_accounting():
    acc = Accounting()
    for inc, started in (("a", 1.0), ("b", 2.0)):  # the second incarnation replaces the first
        m = _learner_metrics()
        acc.take(parse_report(build_report(job="j", role="learner", group=0, index=0, incarnation=inc, pid=1,
                                           started=started, seq=1, time=3.0, final=False, snapshot=m.snapshot(),
                                           episodes_total=0, recent=[], extra={})))
    assert acc.lag_hist()[0] == 64 and acc.lag_hist()[-1] == 2
    again = Accounting(json.loads(json.dumps(acc.state())))
    assert again.lag_hist() == acc.lag_hist()


@pytest.mark.parametrize("bad", [[1.0] * 3, [float("nan")] * (len(LAG_BOUNDS) + 1), [-1.0] * (len(LAG_BOUNDS) + 1),
                                 "many"])
def test_reports_with_a_bad_lag_histogram_are_refused(bad):
    snap = _learner_metrics().snapshot()
    snap["lag"]["hist"] = bad
    doc = build_report(job="j", role="learner", group=0, index=0, incarnation="a", pid=1, started=1.0, seq=1,
                       time=2.0, final=False, snapshot=snap, episodes_total=0, recent=[], extra={})
    with pytest.raises(ReportError):
        parse_report(doc)


def test_learner_stats_names_cover_both_algorithms():
    from tianji.algos.dqn import DQNLearner
    from tianji.algos.models import build_model
    from tianji.control.spec import DQNConfig, EnvConfig, ModelConfig
    from tianji.envs import probe_env

    info = probe_env(EnvConfig(id="CartPole-v1"))
    cfg = DQNConfig(batch_size=16, steps_per_batch=2)
    g = np.random.default_rng(0)
    M = 32
    out = DQNLearner(build_model("dqn", ModelConfig(hidden=[16]), info, 0), cfg, 0).update({
        "obs": g.normal(0, 1, (M, 4)).astype(np.float32), "next_obs": g.normal(0, 1, (M, 4)).astype(np.float32),
        "actions": g.integers(0, 2, M), "returns": np.ones(M, np.float32), "discounts": np.full(M, 0.99, np.float32)})
    assert {"dqn_loss", "q_mean", "grad_norm"} <= set(out) <= set(LEARNER_STATS) | {"train_steps", "samples",
                                                                                   "skipped_steps"}
    assert out["dqn_loss"] > 0 and out["grad_norm"] > 0


def test_wandb_requested_but_not_installed_fails_before_anything_starts(tmp_path):
    import importlib.util

    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    r = run_tianji("run", PPO, "--run-dir", str(tmp_path / "run"), "--set", "spec.wandb.project=demo", timeout=120)
    assert r.returncode == 2
    assert "spec.wandb" in r.stderr and "pip install 'tianji[wandb]'" in r.stderr
    assert not (tmp_path / "run" / "logs").exists()


def test_the_dashboard_shows_the_learner_statistics():
    from chart_support import DASHBOARD

    text = DASHBOARD.read_text()
    for k in LEARNER_STATS:
        assert f"tianji_learner_{k}" in text, k
    assert "tianji_learner_policy_lag_samples_bucket" in text


def test_plot_puts_clip_fraction_and_kl_against_the_interval_lag(tmp_path):
    from tianji.observability.plot import interval_lags, plot_run

    keys = [*(str(b) for b in LAG_BOUNDS), "inf"]
    h1 = dict.fromkeys(keys, 0) | {"1": 10, "2": 10}
    h2 = dict(h1) | {"4": 20}  # the next interval consumed 20 samples at lag 4
    h3 = dict(h2) | {"inf": 1}  # ... and one beyond the buckets: no finite mean
    recs = [{"t": float(i), "mean_return": 1.0, "env_frames": 100 * i, "produced_fps": 1.0, "received_fps": 1.0,
             "consumed_sps": 1.0, "lag_hist": h, "learner": {"clip_fraction": 0.1 * i, "approx_kl": 0.01}}
            for i, h in enumerate((h1, h2, h3), 1)]
    lags = interval_lags(recs)
    assert lags[:2] == [1.5, 4.0] and math.isnan(lags[2])
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert plot_run(tmp_path, tmp_path / "p.png").stat().st_size > 1000


def _tensorboard_pids(run_dir) -> list[int]:
    from pathlib import Path

    out = []
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0") if d.name.isdigit() else []
        except OSError:
            continue
        if b"--logdir" in cmd and str(run_dir).encode() in cmd:
            out.append(int(d.name))
    return out


def test_the_tensorboard_server_dies_with_a_killed_launcher(running_tianji):
    tb_port = free_port()
    run = running_tianji(PPO, "--tensorboard", str(tb_port), "--set", "spec.stop.seconds=300")
    def serving() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{tb_port}/data/environment", timeout=5):
                return True
        except OSError:
            return False

    wait_for(serving, 90, "TensorBoard to serve the run")
    (pid,) = _tensorboard_pids(run.run_dir)
    run.stop()  # SIGKILL: the launcher cannot stop it; PR_SET_PDEATHSIG must
    wait_for(lambda: pid not in _tensorboard_pids(run.run_dir), 30, "the TensorBoard server to exit")
