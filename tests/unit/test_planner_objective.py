"""The planner's budget rule (spec.plan.minMarginalGain), its runners-up, groupSync on every
prediction path, and cross-node placement on the measured link (issue 24). Pure functions."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tianji.cli import main
from tianji.control.planner import objective
from tianji.control.planner.plan import (
    Plan,
    Profile,
    _budget,
    default_profile,
    load_profile,
    plan,
    plan_for_job,
    planned_job,
    resolve,
)
from tianji.control.planner.search import candidates
from tianji.control.planner.sharedhost import plan_on_host, predict_on_host, predict_with_shares
from tianji.control.spec import SpecError, parse_job

ROOT = Path(__file__).resolve().parents[2]
PPO_PROFILE = ROOT / "bench" / "profiles" / "cartpole-ppo-2core.json"
DQN_PROFILE = ROOT / "bench" / "profiles" / "cartpole-dqn-2core.json"


def job(**spec):
    return parse_job({"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob",
                      "metadata": {"name": "objective-test"}, "spec": spec})


def example(name: str, *sets: str):
    from tianji.control.spec import load_job

    return load_job(str(ROOT / "examples" / name), list(sets))


def considered(j, p: Profile, cpus, gpus=0, nodes=1):
    """What plan() chose among: every candidate, then the budget rule's choice."""
    budget, modes = _budget(j, p, cpus, gpus, nodes, None)
    cands = candidates(j, p, budget, modes)
    return cands, objective.choose(cands, budget.cpus, gpus, j.spec.plan.min_marginal_gain, j.spec.max_policy_lag)


# (job, cores, GPUs, profile): the issue's command and its neighbours, CPU and (assumed) GPU
CASES = [
    ("cartpole-ppo.yaml", 128, 8, "ppo"),
    ("cartpole-ppo.yaml", 16, 0, "ppo"),
    ("cartpole-ppo.yaml", 64, 4, "builtin"),
    ("cartpole-dqn.yaml", 128, 0, "dqn"),
    ("cartpole-dqn.yaml", 32, 2, "builtin"),
]


def _profile(kind, j):
    return {"ppo": lambda: load_profile(PPO_PROFILE), "dqn": lambda: load_profile(DQN_PROFILE),
            "builtin": lambda: default_profile(j)}[kind]()


@pytest.mark.parametrize("name,cpus,gpus,kind", CASES)
def test_no_smaller_plan_it_considered_predicts_more_progress(name, cpus, gpus, kind):
    j = example(name)
    p = _profile(kind, j)
    cands, choice = considered(j, p, cpus, gpus)
    chosen = choice.chosen
    r = objective.resources(chosen, cpus, gpus)
    for c in choice.eligible:
        if objective.resources(c, cpus, gpus) < r - 1e-12:
            assert c.effective <= chosen.effective * (1 + 1e-9), c.shape
    got = plan(j, cpus=cpus, gpus=gpus, profile=p)
    assert (got.groups, got.actors, got.buffers, got.learners) == chosen.shape[:4]
    # A plan the planner itself rates: effective progress at least half the raw consumption.
    assert got.efficiency >= 0.5
    # ... and no plan the rule passed over bought its extra resources' worth (the rule, both ways).
    x = got.min_marginal_gain
    for c in choice.eligible:
        k = objective.resources(c, cpus, gpus) / r
        if k > 1 + 1e-9:
            assert c.effective <= chosen.effective * k ** x * (1 + 1e-9), c.shape


def test_the_issue_command_is_no_longer_forty_times_the_cores_for_twice_the_progress():
    j = example("cartpole-ppo.yaml")
    p = load_profile(PPO_PROFILE)
    chosen = plan(j, cpus=128, gpus=8, profile=p)
    most = plan(j, cpus=128, gpus=8, profile=p, min_marginal_gain=0)
    assert chosen.efficiency >= 0.5 and most.efficiency < 0.2  # x = 0 is the old objective
    assert most.cpus_used > 10 * chosen.cpus_used and most.effective_sps < 2.5 * chosen.effective_sps
    # It says why the most-progress plan lost, in the rule's terms.
    bigger = [r for r in chosen.runners_up if r["cpus_used"] > chosen.cpus_used and "minMarginalGain" in r["lost"]]
    assert bigger and max(r["effective_sps"] for r in bigger) > chosen.effective_sps


def test_a_bigger_budget_rule_never_grows_the_plan():
    j = example("cartpole-ppo.yaml", "spec.topology.groupSync.mode=average")
    p = load_profile(PPO_PROFILE)
    sizes = [plan(j, cpus=64, profile=p, min_marginal_gain=x) for x in (0.0, 0.25, 0.5, 0.75, 1.0)]
    used = [s.cpus_used for s in sizes]
    assert used == sorted(used, reverse=True) and used[0] > used[-1]
    progress = [s.effective_sps for s in sizes]
    assert progress == sorted(progress, reverse=True)


def test_min_marginal_gain_is_validated_and_read_from_the_spec():
    assert job().spec.plan.min_marginal_gain == 0.5
    for bad in (-0.1, 1.5, "half", True):
        with pytest.raises(SpecError):
            job(plan={"minMarginalGain": bad})
    j = job(plan={"minMarginalGain": 0}, resources={"cpus": 32}, topology="auto")
    p = load_profile(PPO_PROFILE)
    assert plan_for_job(j, p) == plan(j, cpus=32, profile=p, min_marginal_gain=0)
    assert plan_for_job(j, p).min_marginal_gain == 0


def test_cli_prints_the_runners_up_and_why_they_lost(capsys):
    args = ["plan", str(ROOT / "examples" / "cartpole-ppo.yaml"), "--cpus", "128", "--gpus", "8",
            "--profile", str(PPO_PROFILE)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "runners-up" in text and "why it lost" in text and "budget rule" in text
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    lost = [r["lost"] for r in out["runners_up"]]
    assert any("minMarginalGain 0.5 asks" in w for w in lost)
    assert any("maxPolicyLag" in w for w in lost)  # the best plan dropped for staleness, when one is better
    for r in out["runners_up"]:
        assert r["time_to_target_vs_plan"] == pytest.approx(out["effective_sps"] / r["effective_sps"])


# ----------------------------------------------------------------- groupSync on every path
def two_groups(mode):
    return job(topology={"groups": 2, "actors": 1, "buffers": 1, "learners": 1, "groupSync": {"mode": mode}},
               algorithm={"name": "dqn"}, staleness={"replayRatio": 2.0, "paceActors": False})


HOST = replace(load_profile(DQN_PROFILE), allreduce_seconds={2: 0.0015})


def test_on_host_prediction_for_two_allreduce_groups_keeps_their_sync_mode():
    # The planned topology as `tianji plan` predicts it on one host, vs the same job written out.
    for mode in ("allreduce", "average"):
        j = two_groups(mode)
        p = plan_for_job(j, HOST)
        auto = job(**{**j.spec.model_dump(by_alias=True, exclude_unset=True),
                      "topology": {"auto": True, "groupSync": {"mode": mode}}})
        assert plan_on_host(auto, p, HOST, 2.0)["consumed_sps"] == pytest.approx(
            predict_on_host(j, HOST, 2.0)["consumed_sps"])
    sync = plan_on_host(two_groups("allreduce"), plan_for_job(two_groups("allreduce"), HOST), HOST, 2.0)
    avg = predict_on_host(two_groups("average"), HOST, 2.0)
    assert sync["group_sync"] == "allreduce" and sync["consumed_sps"] < 0.8 * avg["consumed_sps"]


def test_group_sync_reaches_every_prediction_path():
    a, v = two_groups("allreduce"), two_groups("average")
    # the planner's own prediction of an explicit topology
    assert plan_for_job(a, HOST).allreduce_seconds > plan_for_job(v, HOST).allreduce_seconds
    # the resolved job the workers read, and planned_job (what plan_on_host and resolve share)
    assert resolve(a, HOST)[0].spec.topology.group_sync.mode == "allreduce"
    assert planned_job(a, plan_for_job(a, HOST)).spec.topology.group_sync.mode == "allreduce"
    # the search (topology: auto): the same shape predicted under each mode
    auto = lambda mode: job(algorithm={"name": "dqn"}, topology={"auto": True, "groupSync": {"mode": mode}},  # noqa: E731
                            plan={"minMarginalGain": 0}, staleness={"replayRatio": 2.0, "paceActors": False})
    pr = replace(HOST, learner_thread_scaling=None, allreduce_seconds={2: 0.05})
    assert plan(auto("allreduce"), cpus=16, profile=pr).groups < plan(auto("average"), cpus=16, profile=pr).groups
    # one shared host, and the model given measured shares
    assert predict_on_host(a, HOST, 2.0)["consumed_sps"] < predict_on_host(v, HOST, 2.0)["consumed_sps"]
    assert predict_with_shares(a, HOST, 1.0, 0.2, 1.0)["allreduce_seconds"] > \
        predict_with_shares(v, HOST, 1.0, 0.2, 1.0)["allreduce_seconds"]


def test_the_operator_rebuilds_a_lost_configmap_with_the_jobs_group_sync():
    from tianji_operator.children.lifecycle import _resolved_from_plan

    spec = {"topology": {"auto": True, "groupSync": {"mode": "allreduce", "intervalUpdates": 7}},
            "resources": {"cpus": 8}}
    resolved, p = resolve(job(**spec))
    body = {"metadata": {"name": "objective-test", "namespace": "ns"}, "spec": spec, "status": {}}
    again = _resolved_from_plan(body, json.loads(json.dumps(p.to_json())))
    gs = again.spec.topology.group_sync
    assert (gs.mode, gs.interval_updates) == ("allreduce", 7)
    assert again.spec.topology.groups == resolved.spec.topology.groups


# ----------------------------------------------------------------- cross-node placement
SLOW = 1e8 / 8  # a 100 Mbit/s link measured between two hosts


def link_profile(bps=SLOW, lat=1e-3):
    return Profile(actor_fps_per_core=1e5, learner_sps_per_core=1000.0, learner_sps_per_gpu=None,
                   message_seconds=0.0, fragment_samples=256, bytes_per_sample=64.0, param_bytes=1e6,
                   allreduce_seconds={2: 1e-3}, ipc_bytes_per_second=1e10,
                   link_bytes_per_second=bps, link_latency_s=lat)


def test_a_group_on_one_node_stays_on_loopback_and_only_the_sync_crosses_the_measured_link():
    topo = {"groups": 2, "actors": 2, "buffers": 1, "learners": 1, "groupSync": {"mode": "allreduce"}}
    res = {"nodes": 2, "cpusPerNode": 4, "actor": {"cpu": 1}, "buffer": {"cpu": 0.5}, "learner": {"cpu": 1}}
    j = job(algorithm={"name": "dqn"}, topology=topo, resources=res)
    placed = plan_for_job(j, link_profile())
    assert (placed.group_link, placed.sync_link) == ("loopback", "measured")
    # The all-reduce between the nodes pays the measured link: slower link, longer all-reduce.
    fast = plan_for_job(j, link_profile(bps=1e10, lat=1e-5))
    assert placed.allreduce_seconds > fast.allreduce_seconds > 0
    # Node sizes unknown: groups are assumed to span the nodes, all traffic on the measured link.
    spread = plan_for_job(job(algorithm={"name": "dqn"}, topology=topo,
                              resources={k: v for k, v in res.items() if k != "cpusPerNode"}), link_profile())
    assert (spread.group_link, spread.sync_link) == ("measured", "measured")
    assert spread.comm_seconds > placed.comm_seconds
    # An explicit spec.network.link is what every process talks over.
    eth = plan_for_job(job(algorithm={"name": "dqn"}, topology=topo, resources=res,
                           network={"link": {"preset": "ethernet-10g"}}), link_profile())
    assert (eth.group_link, eth.sync_link) == ("ethernet-10g", "ethernet-10g")


def test_the_search_keeps_groups_whole_on_nodes_over_a_slow_measured_link():
    j = job(algorithm={"name": "dqn"}, staleness={"replayRatio": 1.0, "paceActors": False},
            plan={"minMarginalGain": 0})
    p = plan(j, cpus=16, nodes=4, cpus_per_node=4, profile=link_profile())
    assert p.group_link == "loopback"
    assert isinstance(p, Plan) and p.cpus_used <= 16


def test_a_close_call_that_meets_the_rule_takes_the_bigger_plan(capsys, monkeypatch, tmp_path):
    # The user's goal is time to a trained model on the resources given: a bigger plan that buys
    # what minMarginalGain asks is taken however close the call; one that misses it is not, and
    # the explanation says the call was within the model's noise. With the built-in GPU figure
    # (no device results), GPU learners buy +193 % for 8.56x the resources where the rule asks +192 %.
    monkeypatch.setenv("TIANJI_DEVICE_DIR", str(tmp_path / "no-device-results"))
    args = ["plan", str(ROOT / "examples" / "cartpole-ppo.yaml"), "--cpus", "128", "--gpus", "8",
            "--profile", str(PPO_PROFILE), "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpus_used"] > 0
    cpu_plans = [r for r in out["runners_up"] if r["gpus_used"] == 0]
    assert cpu_plans and all(r["effective_sps"] < out["effective_sps"] for r in cpu_plans)
    step = next(u for u in out["unused"] if u["what"].startswith("a group more"))
    assert step["gain"] < step["asks"] and "cannot resolve" in step["why"]
    assert main(args + ["--set", "spec.plan.minMarginalGain=1"]) == 0  # the rule still binds
    assert json.loads(capsys.readouterr().out)["gpus_used"] == 0


def test_a_measured_gpu_slower_than_a_core_is_left_unused_and_said_so(capsys, monkeypatch, tmp_path):
    """A GPU figure measured for this job (env, algorithm, batch) below a CPU core's replaces the
    built-in one: the plan takes no GPU and names the measurement as the reason."""
    dev = tmp_path / "device"
    dev.mkdir()
    (dev / "profile.json").write_text(json.dumps({
        "env": "CartPole-v1", "algorithm": "ppo", "batch_size": 256, "date": "2026-11-28",
        "learner_sps_per_gpu": 4929.1, "learner_gpu": {"device_name": "NVIDIA H200"}}))
    monkeypatch.setenv("TIANJI_DEVICE_DIR", str(dev))
    assert main(["plan", str(ROOT / "examples" / "cartpole-ppo.yaml"), "--cpus", "128", "--gpus", "8",
                 "--profile", str(PPO_PROFILE), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpus_used"] == 0
    gpu = next(u for u in out["unused"] if u["what"].startswith("GPU learners instead"))
    assert gpu["gain"] < 0 and "4,929 samples/s (measured on NVIDIA H200)" in gpu["why"], gpu
