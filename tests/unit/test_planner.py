"""Balance planner, rebalancing and `tianji plan` (pure functions; seconds to run)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tianji.cli import main
from tianji.control.planner.placement import pack as _pack
from tianji.control.planner.plan import (
    COMMUNICATION_BOUND,
    SAMPLE_BOUND,
    TRAINING_BOUND,
    GroupThroughput,
    Plan,
    PlanError,
    Profile,
    RebalancePolicy,
    default_profile,
    pace_fps,
    plan,
    plan_for_job,
    rebalance,
)
from tianji.control.spec import parse_job

ROOT = Path(__file__).resolve().parents[2]


def job(**spec):
    return parse_job({"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob",
                      "metadata": {"name": "plan-test"}, "spec": spec})


LINEAR = {t: float(t) for t in (2, 4, 8)}  # a learner that scales perfectly up to 8 threads


def prof(actor=1000.0, learner=1000.0, gpu=None, msg=0.0, frag=256, bps=64.0, curve=LINEAR,
         param_bytes=1000.0, allreduce=None, ipc=1e12):
    """Defaults isolate the compute balance: linear thread curve, free links and all-reduce."""
    return Profile(actor_fps_per_core=actor, learner_sps_per_core=learner, learner_sps_per_gpu=gpu,
                   message_seconds=msg, fragment_samples=frag, bytes_per_sample=bps,
                   learner_thread_scaling=curve, param_bytes=param_bytes, allreduce_seconds=allreduce,
                   ipc_bytes_per_second=ipc)


def role_cores(p: Plan) -> dict:
    g = p.groups
    return {"actor": g * p.actors * p.actor.cpu, "buffer": g * p.buffers * p.buffer.cpu,
            "learner": g * p.learners * p.learner.cpu}


def check_sums(p: Plan, cpus: float) -> None:
    """The constraint sums: M_A + M_B + M_L = cpus_used <= M; fan-in holds."""
    c = role_cores(p)
    assert p.cpus_used == pytest.approx(sum(c.values()))
    assert p.cpus_used <= cpus + 1e-9
    assert 1 <= p.learners <= p.buffers <= p.actors
    assert p.gpus_used == p.groups * p.learners * p.learner.gpu
    # The topology is valid for the spec (its validator enforces the fan-in).
    job(topology=p.topology())


# Synchronised groups (the all-reduce tests; the default, average, has none across groups).
ALLREDUCE = {"auto": True, "groupSync": {"mode": "allreduce"}}

# DQN keeps maxPolicyLag off by default, and minMarginalGain 0 takes the most progress the budget
# buys (no budget rule), so these exercise the pure throughput balance.
DQN = {"algorithm": {"name": "dqn"}, "staleness": {"replayRatio": 1.0, "paceActors": False},
       "plan": {"minMarginalGain": 0}}


# ----------------------------------------------------------------- plan()
def test_balanced_profile_splits_cores_evenly():
    p = plan(job(**DQN), cpus=8, profile=prof(actor=1000, learner=1000))
    check_sums(p, 8)
    c = role_cores(p)
    produce, consume = p.produced_fps * 1.0, c["learner"] * 1000
    # min(TR_L, r·TR_A) within 15 % of the ideal split of the non-buffer cores.
    ideal = (8 - c["buffer"]) / 2 * 1000
    assert p.consumed_sps >= 0.85 * ideal
    assert min(produce, consume) / max(produce, consume) >= 0.8
    assert p.consumed_sps == pytest.approx(min(produce, consume))
    assert p.bottleneck in (SAMPLE_BOUND, TRAINING_BOUND)


def test_sample_bound_profile_gives_cores_to_actors():
    p = plan(job(**DQN), cpus=16, profile=prof(actor=10, learner=1e6))
    check_sums(p, 16)
    c = role_cores(p)
    assert p.bottleneck == SAMPLE_BOUND
    assert c["actor"] >= 0.85 * 16
    assert p.produced_fps == pytest.approx(c["actor"] * 10)
    assert p.consumed_sps == pytest.approx(p.produced_fps)  # r = 1: every sample consumed once
    assert p.cpus_used >= 15.5  # nothing left that another actor could use


def test_training_bound_profile_gives_cores_to_learners():
    p = plan(job(**DQN), cpus=16, profile=prof(actor=1e6, learner=100))
    check_sums(p, 16)
    c = role_cores(p)
    assert p.bottleneck == TRAINING_BOUND
    assert c["learner"] >= 0.75 * 16
    assert p.consumed_sps == pytest.approx(c["learner"] * 100)
    assert p.actors == 1  # one actor per group already out-produces the learner


def test_replay_ratio_scales_needed_production():
    # DQN at replay ratio 8: each inserted sample is consumed ~8 times, so the
    # actors need 1/8 of the learner's rate and most cores go to the learners.
    j = job(algorithm={"name": "dqn"}, staleness={"replayRatio": 8.0, "paceActors": False})
    p = plan(j, cpus=18, profile=prof(actor=1000, learner=1000))
    check_sums(p, 18)
    c = role_cores(p)
    assert c["learner"] > 3 * c["actor"]
    assert p.replay_ratio == pytest.approx(8.0, rel=0.35)
    assert p.consumed_sps <= 8 * p.produced_fps + 1e-6


def test_communication_bound_when_messages_are_expensive():
    p = plan(job(**DQN), cpus=8, profile=prof(msg=1.0))
    check_sums(p, 8)
    assert p.bottleneck == COMMUNICATION_BOUND
    assert p.comm_seconds > max(p.sample_seconds, p.train_seconds)
    # Consumption is limited by the buffers' message budget, not by compute.
    assert p.consumed_sps < min(role_cores(p)["learner"] * 1000, p.produced_fps)


def test_expensive_messages_buy_more_buffer_capacity():
    cheap = plan(job(**DQN, topology=ALLREDUCE), cpus=16, profile=prof(actor=1e5, learner=1e5, msg=1e-6))
    dear = plan(job(**DQN, topology=ALLREDUCE), cpus=16, profile=prof(actor=1e5, learner=1e5, msg=2e-3))
    bufcap = lambda p: p.buffers * min(p.buffer.cpu, 1.0) / p.learners  # noqa: E731
    assert bufcap(dear) > bufcap(cheap)


@pytest.fixture
def stated_batch_rule(tmp_path, monkeypatch):
    """No batch curve: more groups cost (1 + W)/2 times the frames (batchcurve.py's fallback), so
    a test of another mechanism does not move when a curve in docs/results is re-measured."""
    monkeypatch.setenv("TIANJI_RESULTS_DIR", str(tmp_path / "no-curves"))


def test_staleness_bound_prefers_small_groups_for_ppo(stated_batch_rule):
    # PPO with slow actors: one big group would put ~15 actors' fragments on one
    # learner (lag ~ n_a·F/B versions); the planner splits into groups instead.
    j = job(staleness={"maxPolicyLag": 4})
    p = plan(j, cpus=16, profile=prof(actor=200, learner=1e5))
    check_sums(p, 16)
    assert p.expected_policy_lag <= 4
    assert p.groups > 1
    loose = plan(job(staleness={"maxPolicyLag": 1000}), cpus=16, profile=prof(actor=200, learner=1e5))
    assert loose.groups == 1 and loose.expected_policy_lag > 4


def test_fractional_cores_fit_two_cores():
    p = plan(job(), cpus=2)  # CartPole PPO with built-in estimates
    check_sums(p, 2)
    assert (p.groups, p.learners, p.buffers) == (1, 1, 1)
    assert p.buffer.cpu < 1 and p.actor.threads >= 1 and p.learner.threads >= 1


def test_per_node_packing():
    # 3 nodes of 2.5 cores: no process over 2.5 cores, and the processes pack.
    p = plan(job(**DQN), cpus=100, nodes=3, cpus_per_node=2.5, profile=prof(actor=1e6, learner=100))
    check_sums(p, 7.5)  # usable cores = min(M, K·C_n)
    assert max(p.actor.cpu, p.buffer.cpu, p.learner.cpu) <= 2.5
    g = p.groups
    items = [(p.actor.cpu, 0, g * p.actors), (p.buffer.cpu, 0, g * p.buffers), (p.learner.cpu, 0, g * p.learners)]
    assert _pack(items, [2.5] * 3, [0] * 3)
    # On one node of 7.5 cores the learner may be bigger than 2.5.
    one = plan(job(**DQN), cpus=7.5, profile=prof(actor=1e6, learner=100))
    assert one.learner.cpu > 2.5


def test_pack_first_fit():
    assert _pack([(2.0, 0, 2), (1.0, 0, 2)], [3.0, 3.0], [0, 0])
    assert not _pack([(2.0, 0, 3)], [3.0, 3.0], [0, 0])
    assert not _pack([(1.0, 1, 2)], [4.0, 4.0], [1, 0])  # second GPU learner has no GPU node
    assert _pack([(1.0, 1, 2)], [4.0, 4.0], [1, 1])


def test_gpus_feed_learners():
    p = plan(job(**DQN), cpus=8, gpus=2, profile=prof(actor=1e5, learner=100, gpu=50_000))
    check_sums(p, 8)
    assert p.learner.gpu == 1 and 1 <= p.gpus_used <= 2
    assert p.consumed_sps > 8 * 100  # more than every core as a CPU learner
    # A profile without a GPU figure plans on CPUs only.
    q = plan(job(**DQN), cpus=8, gpus=2, profile=prof(actor=1e5, learner=100))
    assert q.gpus_used == 0


@pytest.mark.parametrize("cpus", [0, -1, 0.0])
def test_no_cpus_is_infeasible(cpus):
    with pytest.raises(PlanError, match="cpus must be > 0"):
        plan(job(), cpus=cpus)


def test_too_few_cpus_for_one_of_each():
    with pytest.raises(PlanError, match="one actor .* one buffer .* one learner"):
        plan(job(), cpus=1.0)


def test_gpu_request_without_gpus():
    j = job(resources={"learner": {"gpu": 1}})
    with pytest.raises(PlanError, match="GPU.*no GPUs were given"):
        plan(j, cpus=8, gpus=0)
    with pytest.raises(PlanError, match="needs 2 GPU"):
        plan(job(resources={"learner": {"gpu": 2}}), cpus=8, gpus=1)
    with pytest.raises(PlanError, match="no GPU figure"):
        plan(j, cpus=8, gpus=1, profile=prof())
    p = plan(j, cpus=8, gpus=1)
    assert p.learner.gpu == 1 and p.gpus_used == 1


def test_bad_node_arguments():
    with pytest.raises(PlanError, match="nodes must be >= 1"):
        plan(job(), cpus=8, nodes=0)
    with pytest.raises(PlanError, match="cpus_per_node must be > 0"):
        plan(job(), cpus=8, nodes=2, cpus_per_node=0)
    with pytest.raises(PlanError, match="no topology fits"):
        plan(job(), cpus=8, nodes=32, cpus_per_node=0.25)


# ----------------------------------------------------------------- profiles
def test_profile_json_round_trip_and_validation():
    p = prof(gpu=123.0)
    assert Profile.from_json(p.to_json()) == p
    assert Profile.from_json({"profile": p.to_json(), "meta": {"host": "x"}}) == p
    camel = {"actorFpsPerCore": 1, "learnerSpsPerCore": 2, "messageSeconds": 0, "fragmentSamples": 4,
             "bytesPerSample": 8}
    assert Profile.from_json(camel).learner_sps_per_gpu is None
    with pytest.raises(ValueError, match="missing actor_fps_per_core"):
        Profile.from_json({"learner_sps_per_core": 1})
    with pytest.raises(ValueError, match="actor_fps_per_core must be > 0"):
        prof(actor=0)


def test_default_profile_by_env_and_algorithm():
    cart_ppo = default_profile(job())
    cart_dqn = default_profile(job(algorithm={"name": "dqn"}))
    atari = default_profile(job(env={"id": "ALE/Pong-v5"}, algorithm={"name": "dqn"}))
    assert atari.actor_fps_per_core < cart_ppo.actor_fps_per_core
    assert atari.learner_sps_per_core < cart_dqn.learner_sps_per_core
    assert atari.bytes_per_sample > 1000 > cart_ppo.bytes_per_sample
    assert atari.message_seconds > cart_ppo.message_seconds
    assert cart_ppo.fragment_samples == 8 * 32
    ppo4 = default_profile(job(algorithm={"name": "ppo", "epochs": 4}))
    assert ppo4.learner_sps_per_core > cart_ppo.learner_sps_per_core  # fewer passes per sample
    assert all(x.learner_sps_per_gpu for x in (cart_ppo, cart_dqn, atari))


# ----------------------------------------------------------------- plan_for_job
def test_plan_for_explicit_topology():
    j = job(topology={"groups": 2, "actors": 3, "buffers": 1, "learners": 1},
            resources={"actor": {"cpu": 0.5}, "buffer": {"cpu": 0.25}, "learner": {"cpu": 2, "threads": 3}},
            staleness={"maxPolicyLag": 16})  # lag bounds nothing here (test_the_lag_floor_... does)
    p = plan_for_job(j, prof(actor=1000, learner=1000))
    assert p.topology() == {"groups": 2, "actors": 3, "buffers": 1, "learners": 1}
    assert (p.actor.cpu, p.buffer.cpu, p.learner.cpu) == (0.5, 0.25, 2)
    assert p.learner.memory == "1Gi" and p.learner.threads == 3  # RoleResources default memory
    assert p.cpus_used == pytest.approx(2 * (1.5 + 0.25 + 2))
    # 1.5 actor cores vs 2 learner cores per group at r = 1: the actors are short.
    assert p.bottleneck == SAMPLE_BOUND
    assert p.consumed_sps == pytest.approx(2 * 1500)


def test_the_lag_floor_holds_updates_to_what_the_fragments_age_allows():
    """A learner that could update faster than its actors' fragments age within maxPolicyLag trains
    no faster: at 500 frames/s per actor a 256-frame fragment takes 0.51 s, and with maxPolicyLag 4
    (one version of spread, half a version of delivery) a version may come every 0.51 / 2.5 s."""
    from tianji.control.planner.prediction import LAG_SPREAD

    j = job(topology={"groups": 1, "actors": 4, "buffers": 1, "learners": 1},
            resources={"actor": {"cpu": 0.5}, "buffer": {"cpu": 0.25}, "learner": {"cpu": 2, "threads": 2}},
            staleness={"maxPolicyLag": 4})
    p = plan_for_job(j, prof(actor=1000, learner=1e6))  # a learner far faster than the fragments age
    d_f = 256 / 500
    assert p.consumed_sps == pytest.approx(j.spec.algorithm.batch_size * (4 - LAG_SPREAD - 0.5) / d_f)
    assert p.expected_policy_lag <= 4 and p.bottleneck == SAMPLE_BOUND
    assert p.lag_floor_seconds == pytest.approx(d_f / (4 - LAG_SPREAD - 0.5))  # tianji plan names it
    loose = plan_for_job(job(topology=j.spec.topology.model_dump(), resources=j.spec.resources.model_dump(),
                             staleness={"maxPolicyLag": 40}), prof(actor=1000, learner=1e6))
    assert loose.consumed_sps == pytest.approx(4 * 500)  # a looser bound: the actors' production bounds it
    assert loose.lag_floor_seconds == 0


def test_plan_for_explicit_topology_infeasible():
    too_many = job(topology={"groups": 4, "actors": 1}, resources={"cpus": 3, "learner": {"cpu": 0.5}})
    with pytest.raises(PlanError, match="more learners"):
        plan_for_job(too_many)
    over = job(topology={"actors": 8}, resources={"cpus": 4})
    with pytest.raises(PlanError, match="requests 9.5 cores"):
        plan_for_job(over)


def test_plan_for_auto_topology_uses_resources():
    j = job(topology="auto", resources={"cpus": 6}, **DQN)
    p = plan_for_job(j, prof())
    assert p == plan(j, cpus=6, profile=prof())
    check_sums(p, 6)
    assert plan_for_job(job(topology="auto")).cpus_used <= 2  # default M = 2


# ----------------------------------------------------------------- rebalance
POLICY = RebalancePolicy(target_ratio=1.0, band=0.15, min_actors=1, max_actors=10, max_step=4)


def obs(produced, consumed, actors, received=None):
    return GroupThroughput(produced_fps=produced, received_sps=produced if received is None else received,
                           consumed_sps=consumed, actors=actors)


def test_rebalance_up_down_unchanged():
    out = rebalance({0: obs(500, 1000, 2), 1: obs(2000, 1000, 4), 2: obs(1050, 1000, 3)}, POLICY)
    assert out == {0: 4, 1: 2, 2: 3}  # half the production: double; twice: halve; in band: keep


def test_rebalance_steps_and_bounds():
    assert rebalance({0: obs(100, 1000, 2)}, POLICY) == {0: 6}  # wants 20, +max_step
    assert rebalance({0: obs(800, 1000, 9)}, POLICY) == {0: 10}  # capped by max_actors
    assert rebalance({0: obs(10_000, 1000, 8)}, POLICY) == {0: 4}  # wants 1, -max_step
    floor = RebalancePolicy(1.0, 0.15, min_actors=3, max_actors=10)
    assert rebalance({0: obs(10_000, 1000, 4)}, floor) == {0: 3}
    assert rebalance({0: obs(1000, 1000, 20)}, POLICY) == {0: 10}  # out of bounds even in band
    assert rebalance({0: obs(800, 1000, 4)}, POLICY) == {0: 5}  # small deficit: at least +1
    assert rebalance({0: obs(0, 1000, 3)}, POLICY) == {0: 7}  # nothing produced: +max_step


def test_rebalance_uses_target_ratio_and_edge_cases():
    dqn = RebalancePolicy(target_ratio=8.0, band=0.2, min_actors=1, max_actors=64)
    # consumed 8000 at ratio 8 needs 1000/s; 1000 produced is balanced, 500 is short.
    assert rebalance({0: obs(1000, 8000, 2), 1: obs(500, 8000, 2)}, dqn) == {0: 2, 1: 4}
    assert rebalance({0: obs(100, 0, 2)}, POLICY) == {0: 2}  # learner not started: keep
    # Buffer receives far less than the actors send: more actors would not help.
    assert rebalance({0: obs(500, 1000, 2, received=200)}, POLICY) == {0: 2}
    assert rebalance({}, POLICY) == {}


def test_rebalance_policy_preconditions():
    for kw, msg in [({"target_ratio": 0}, "target_ratio"), ({"band": 1.0}, "band"),
                    ({"min_actors": 0}, "min_actors"), ({"min_actors": 5, "max_actors": 2}, "max_actors"),
                    ({"max_step": 0}, "max_step")]:
        args = {"target_ratio": 1.0, "band": 0.1, "min_actors": 1, "max_actors": 4} | kw
        with pytest.raises(ValueError, match=msg):
            RebalancePolicy(**args)
    with pytest.raises(ValueError, match="consumed_sps"):
        GroupThroughput(1.0, 1.0, -1.0, 1)


def test_pace_fps():
    assert pace_fps(8000, 8.0, 4, 1.25) == pytest.approx(8000 / 8 * 1.25 / 4)
    for args, msg in [((0, 1, 1, 1), "learner_capacity_sps"), ((1, 0, 1, 1), "ratio"),
                      ((1, 1, 0, 1), "actors"), ((1, 1, 1, 0), "headroom")]:
        with pytest.raises(ValueError, match=msg):
            pace_fps(*args)


# ----------------------------------------------------------------- CLI
@pytest.fixture
def job_yaml(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("apiVersion: tianji.dev/v1alpha1\nkind: TianJiJob\nmetadata: {name: cli-plan}\n"
                    "spec:\n  algorithm: {name: ppo}\n  topology: auto\n")
    return path


def test_cli_plan_json(job_yaml, capsys):
    assert main(["plan", str(job_yaml), "--cpus", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("groups", "actors", "buffers", "learners", "actor", "buffer", "learner", "batch_size",
                "produced_fps", "consumed_sps", "replay_ratio", "expected_policy_lag", "bottleneck",
                "cpus_used", "gpus_used", "topology", "profile"):
        assert key in out
    assert out["cpus_used"] <= 8
    assert out["bottleneck"] in (SAMPLE_BOUND, TRAINING_BOUND, COMMUNICATION_BOUND)
    assert set(out["learner"]) == {"cpu", "memory", "gpu", "threads"}
    # One machine: what `tianji run` would see (predict_on_host for the planned topology).
    host = out["on_host"]
    assert host["consumed_sps"] == pytest.approx(1.0 * host["produced_fps"])  # PPO: replay ratio 1
    assert 0 < host["consumed_sps"] and host["bottleneck"] in (SAMPLE_BOUND, COMMUNICATION_BOUND)
    assert main(["plan", str(job_yaml), "--cpus", "8", "--nodes", "2", "--json"]) == 0
    assert "on_host" not in json.loads(capsys.readouterr().out)


def test_cli_plan_with_profile_and_set(job_yaml, tmp_path, capsys):
    pf = tmp_path / "profile.json"
    pf.write_text(json.dumps(prof(actor=10, learner=1e6).to_json()))
    rc = main(["plan", str(job_yaml), "--cpus", "4", "--profile", str(pf), "--json",
               "--set", "spec.staleness.maxPolicyLag=1000"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bottleneck"] == SAMPLE_BOUND and out["profile"]["actor_fps_per_core"] == 10


def test_cli_plan_takes_the_budget_from_the_spec_without_cpus(job_yaml, capsys):
    """`tianji plan JOB.yaml` plans what `tianji run` and the operator would: resources.cpus/gpus."""
    job_yaml.write_text(job_yaml.read_text() + "  resources: {cpus: 6, gpus: 0}\n")
    assert main(["plan", str(job_yaml), "--json"]) == 0
    from_spec = capsys.readouterr()
    assert "budget 6 cores from spec.resources.cpus" in from_spec.err
    assert main(["plan", str(job_yaml), "--cpus", "6", "--json"]) == 0
    assert json.loads(from_spec.out) == json.loads(capsys.readouterr().out)
    job_yaml.write_text(job_yaml.read_text().replace("resources: {cpus: 6, gpus: 0}", "resources: {gpus: 0}"))
    assert main(["plan", str(job_yaml), "--json"]) == 0  # no cpus in the spec: tianji run's default
    assert json.loads(capsys.readouterr().out)["cpus_used"] <= DEFAULT_PLAN_CPUS


def test_cli_plan_table(job_yaml, capsys):
    assert main(["plan", str(job_yaml), "--cpus", "4"]) == 0
    out = capsys.readouterr().out
    for word in ("actor", "buffer", "learner", "groups", "batch size", "produced", "consumed",
                 "replay ratio", "policy lag", "bottleneck"):
        assert word in out


def test_cli_plan_infeasible_exits_2(job_yaml, tmp_path, capsys):
    assert main(["plan", str(job_yaml), "--cpus", "0"]) == 2
    assert "cpus must be > 0" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["plan", str(job_yaml), "--cpus", "4", "--profile", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    # `tianji run --profile` reads the same file the same way, before anything starts.
    assert main(["run", str(job_yaml), "--profile", str(bad), "--run-dir", str(tmp_path / "r")]) == 2
    assert "bad profile" in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_cli_plan_states_the_curve_range_and_what_it_extrapolates(job_yaml, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TIANJI_DEVICE_DIR", str(tmp_path / "no-device-results"))  # the GPU figure: assumed
    job_yaml.write_text(job_yaml.read_text().replace("topology: auto", "topology: " + json.dumps(ALLREDUCE)))
    pf = tmp_path / "p.json"
    pf.write_text(json.dumps(prof(actor=10_000, learner=16_200, curve=SLOWER_AT_2, allreduce={2: 8e-4}).to_json()))
    assert main(["plan", str(job_yaml), "--cpus", "128", "--profile", str(pf), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["learner_threads_measured"] == 2 and out["learner"]["cpu"] <= 2
    assert out["profile"]["learner_thread_scaling"] == {"1": 1.0, "2": pytest.approx(13.5 / 16.2)} or \
        out["profile"]["learner_thread_scaling"] == {"2": pytest.approx(13.5 / 16.2)}
    # Built-in profile, no budget rule (the most progress): its GPU learner is an assumed speed-up.
    assert main(["plan", str(job_yaml), "--cpus", "128", "--gpus", "8", "--json",
                 "--set", "spec.plan.minMarginalGain=0"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["learner"]["gpu"] == 1 and any("GPU learner throughput assumed" in x for x in out["extrapolated"])
    assert main(["plan", str(job_yaml), "--cpus", "128"]) == 0
    text = capsys.readouterr().out
    assert "learner curve" in text and "extrapolated" in text


# ----------------------------------------------------------------- cost model (issue 13)
from tianji.control.planner import costmodel  # noqa: E402
from tianji.control.planner.plan import DEFAULT_PLAN_CPUS, actors_for, load_profile, observed_bottleneck  # noqa: E402
from tianji.control.planner.sharedhost import predict_on_host  # noqa: E402

# Measured here (issue 13): a CartPole PPO learner at 2 torch threads is slower than at 1.
SLOWER_AT_2 = {2: 13.5 / 16.2}


def test_learner_curve_is_interpolated_and_never_extrapolated_upward():
    assert costmodel.learner_sps(1000, {2: 1.6, 4: 2.0}, 0.5) == (500, False)
    assert costmodel.learner_sps(1000, {2: 1.6, 4: 2.0}, 3) == (pytest.approx(1800), False)
    assert costmodel.learner_sps(1000, {2: 1.6, 4: 2.0}, 8) == (pytest.approx(2000), True)  # flat past 4
    assert costmodel.learner_sps(1000, None, 6) == (1000, True)  # only one thread measured


def test_no_bigger_learner_than_the_curve_pays_for():
    # The 16-core CartPole PPO: a 2-thread learner is slower, so no learner gets 2+ cores,
    # and an explicit 6-core learner is predicted at the 1-thread rate and said to be extrapolated.
    measured = prof(actor=10_000, learner=16_200, curve=SLOWER_AT_2, allreduce={2: 8e-4}, param_bytes=2.7e5)
    p = plan(job(topology=ALLREDUCE), cpus=16, profile=measured)
    assert p.learner.cpu <= 1
    assert p.learners * p.groups <= 2  # not the 7 synchronised 1-core learners of before
    big = plan_for_job(job(topology={"groups": 1, "actors": 2, "buffers": 1, "learners": 1},
                           resources={"learner": {"cpu": 6}}), prof(actor=1e6, learner=16_200, curve=SLOWER_AT_2))
    assert big.consumed_sps == pytest.approx(16_200 * 13.5 / 16.2)
    assert any("beyond the measured 1..2 threads" in x for x in big.extrapolated)


def test_expensive_allreduce_keeps_one_group_cheap_allreduce_may_replicate(stated_batch_rule):
    # Training-bound, learner capped at one thread: only groups can add consumption.
    dear = plan(job(**DQN, topology=ALLREDUCE), cpus=16,
                profile=prof(actor=1e6, learner=1000, curve=None, allreduce={2: 0.2}))
    assert dear.groups == 1
    cheap = plan(job(**DQN, topology=ALLREDUCE), cpus=16,
                 profile=prof(actor=1e6, learner=1000, curve=None, allreduce={2: 1e-6}))
    assert cheap.groups > 1
    # The stated batch rule: W synchronised learners need (1 + W)/2 times the samples.
    assert cheap.frames_ratio == pytest.approx((1 + cheap.groups) / 2) and cheap.lag_cost == 1.0  # DQN
    assert cheap.efficiency == pytest.approx(2 / (1 + cheap.groups))
    assert cheap.effective_sps == pytest.approx(cheap.consumed_sps * cheap.efficiency)
    assert cheap.effective_sps < 2 * 1000  # never more than 2x one learner, whatever the groups


def test_allreduce_time_slows_synchronised_learners():
    j = job(**DQN, topology={"groups": 4, "actors": 1, "buffers": 1, "learners": 1, "groupSync": {"mode": "allreduce"}})
    free = plan_for_job(j, prof(actor=1e6, learner=1000, allreduce={2: 0.0}))
    slow = plan_for_job(j, prof(actor=1e6, learner=1000, allreduce={2: 0.064}))
    # DQN: one all-reduce per B = 64 samples (64 ms of compute at 1000 samples/s).
    assert slow.allreduce_seconds == pytest.approx(0.064 * 3, rel=0.01)  # 4 ranks: ring steps x3
    assert slow.consumed_sps == pytest.approx(free.consumed_sps * 0.064 / (0.064 + 0.192), rel=0.01)
    assert slow.bottleneck == COMMUNICATION_BOUND  # more time in all-reduce than computing
    assert any("all-reduce at 4 ranks" in x for x in slow.extrapolated)


def test_parameter_broadcast_over_ethernet_is_communication_bound():
    # 64 actors each get a copy of 4 MB parameters per version: 256 MB per update.
    spec = dict(DQN, topology={"groups": 1, "actors": 64, "buffers": 4, "learners": 1})
    pr = prof(actor=1e6, learner=1e4, param_bytes=4e6)
    eth = plan_for_job(job(**spec, network={"link": {"preset": "ethernet-10g"}}), pr)
    ib = plan_for_job(job(**spec, network={"link": {"preset": "infiniband-hdr"}}), pr)
    assert eth.bottleneck == COMMUNICATION_BOUND
    assert eth.comm_seconds == pytest.approx((64 * 4e6 + 64 * 128) / 1.25e9 + 50e-6, rel=0.01)
    assert ib.consumed_sps > 10 * eth.consumed_sps
    every4 = plan_for_job(job(**dict(spec, staleness={**DQN["staleness"], "publishEvery": 4}),
                              network={"link": {"bandwidthGbps": 10, "latencyUs": 50}}), pr)
    assert every4.consumed_sps == pytest.approx(4 * eth.consumed_sps, rel=0.05)


@pytest.mark.parametrize("link", [{}, {"preset": "loopback", "latencyUs": 3}, {"bandwidthGbps": 10}])
def test_link_is_a_preset_or_bandwidth_and_latency(link):
    from tianji.control.spec import SpecError

    with pytest.raises(SpecError, match="either preset, or both"):
        job(network={"link": link})


def test_planned_topology_beats_a_hand_picked_one_on_predicted_time_to_target():
    pr = prof(actor=12_000, learner=16_200, curve=SLOWER_AT_2, allreduce={2: 8e-4}, param_bytes=2.7e5)
    j = job()  # CartPole PPO
    hand = plan_for_job(job(topology={"groups": 7, "actors": 1, "buffers": 1, "learners": 1},
                            resources={"actor": {"cpu": 1}, "buffer": {"cpu": 0.25}, "learner": {"cpu": 1}}), pr)
    most = plan(j, cpus=16, profile=pr, min_marginal_gain=0)  # the most progress 16 cores buy
    assert most.effective_sps > hand.effective_sps
    # Under the default budget rule the plan is smaller, and scores better than the hand-picked one.
    best = plan(j, cpus=16, profile=pr)
    x = best.min_marginal_gain
    assert x == 0.5 and best.cpus_used < hand.cpus_used
    assert best.effective_sps / best.cpus_used ** x > hand.effective_sps / hand.cpus_used ** x


def test_max_min_shares():
    assert costmodel.max_min_shares([1, 1, 1, 1], 2) == [0.5, 0.5, 0.5, 0.5]
    assert costmodel.max_min_shares([0.2, 1, 1], 2) == pytest.approx([0.2, 0.9, 0.9])
    assert costmodel.max_min_shares([0.2, 0.3], 2) == [0.2, 0.3]


def test_host_turns_two_cores_learner_and_two_busy_actors():
    # Rule: each phase splits the cores max-min fairly among its own role, the buffer and
    # background; the two phases alternate, so neither takes CPU from the other.
    a, b, lr = costmodel.host_turns(2.0, actors=2, buffers=1, learners=1, learner_threads=1.0, buffer_demand=0.1)
    assert 2 * a + b <= 2.0 + 1e-9 and lr + b <= 2.0 + 1e-9
    assert a == pytest.approx(0.95) and b == pytest.approx(0.1) and lr == pytest.approx(1.0)
    # Three actors overfill the actor phase: each gets a third of what the buffer leaves.
    a3, _, l3 = costmodel.host_turns(2.0, 3, 1, 1, 1.0, 0.1)
    assert a3 == pytest.approx(1.9 / 3) and l3 == lr
    # A 2-thread learner has the 2 cores in its phase, less the buffer; background takes its share.
    _, _, l2 = costmodel.host_turns(2.0, 2, 1, 1, 2.0, 0.1)
    assert l2 == pytest.approx(1.9)
    ab, _, lb = costmodel.host_turns(2.0, 2, 1, 1, 1.0, 0.1, background=2.0)
    assert ab == pytest.approx(1.9 / 4) and lb == pytest.approx(1.9 / 3)


def test_actors_that_keep_producing_take_cores_from_a_multi_thread_learners_phase():
    # Paced actors go on producing during the learner's phase: a 2-thread learner on 2 cores
    # beside 2 actors busy 0.25 core each gets what they and the buffer leave.
    _, _, l2 = costmodel.host_turns(2.0, 2, 1, 1, 2.0, 0.1, actor_demand=0.25)
    assert l2 == pytest.approx(2.0 - 0.5 - 0.1)
    # A 1-thread learner on the same cores loses nothing: there is room for all of them.
    _, _, l1 = costmodel.host_turns(2.0, 2, 1, 1, 1.0, 0.1, actor_demand=0.25)
    assert l1 == pytest.approx(1.0)
    # In the model: the 2-thread learner's prediction falls with the actors' busy share, the
    # 1-thread one's does not move.
    pr = prof(actor=12_000, learner=6_000, curve={1: 1.0, 2: 1.1})
    ppo = lambda threads: job(topology={"groups": 1, "actors": 2, "buffers": 1, "learners": 1},  # noqa: E731
                              resources={"learner": {"cpu": threads, "threads": threads}})
    two = predict_on_host(ppo(2), pr, 2.0, learner_threads=2)
    busy = two["produced_fps"] / 12_000  # the 2 actors' cores, at the fixed point
    assert 0.1 < busy < 1.0 and two["learner_share"] == pytest.approx(2.0 - busy - 0.05, abs=0.02)
    assert predict_on_host(ppo(1), pr, 2.0, learner_threads=1)["learner_share"] == pytest.approx(1.0)


def test_on_a_shared_host_actors_and_learner_take_turns():
    d = dict(DQN, staleness={"replayRatio": 2.0, "paceActors": False})
    pr = prof(actor=20_000, learner=40_000, curve=None)
    topo = lambda n, g=1: {"groups": g, "actors": n, "buffers": 1, "learners": 1}  # noqa: E731
    one, two, three = (predict_on_host(job(**d, topology=topo(n)), pr, 2.0) for n in (1, 2, 3))
    # Turns: per frame the actor phase (1/(n·a·f_a)) and the learner phase (r/s_l) add up.
    assert one["produced_fps"] == pytest.approx(1 / (1 / 20_000 + 2 / 40_000), rel=0.02)
    # More actors take nothing from the learner; they shorten the actor phase until it fills
    # both cores, so a third actor on 2 cores buys nothing.
    assert two["learner_share"] == one["learner_share"]
    assert two["consumed_sps"] > 1.2 * one["consumed_sps"]
    assert three["consumed_sps"] <= two["consumed_sps"] * 1.001
    for p in (one, two, three):
        assert p["consumed_sps"] == pytest.approx(2.0 * p["produced_fps"])
        assert p["bottleneck"] == SAMPLE_BOUND  # the learner waits out every actor phase
    # Synchronised groups take turns as well and pay the all-reduce: two groups consume less.
    sync = {**topo(1, 2), "groupSync": {"mode": "allreduce"}}
    groups = predict_on_host(job(**d, topology=sync), replace(pr, allreduce_seconds={2: 0.0005}), 2.0)
    assert groups["consumed_sps"] < one["consumed_sps"]
    # Averaging groups (the default) never wait for each other: they run side by side, sharing
    # the cores in each phase, so two gain over one but less than twice (each actor phase now
    # has two actors and a buffer each on 2 cores).
    avg = predict_on_host(job(**d, topology=topo(1, 2)), replace(pr, allreduce_seconds={2: 0.0005}), 2.0)
    assert 1.2 * one["consumed_sps"] < avg["consumed_sps"] < 2.0 * one["consumed_sps"]
    assert avg["actor_share"] < one["actor_share"] and avg["consumed_sps"] > 1.5 * groups["consumed_sps"]
    busy = predict_on_host(job(**d, topology=topo(1)), pr, 2.0, background=6)
    assert busy["consumed_sps"] < 0.5 * one["consumed_sps"]


def test_rescore_of_the_recorded_scaling_run(capsys):
    # docs/results/scaling.json: real `tianji run` points (bench/scaling.py); the model re-predicts them.
    from bench import scaling as bench

    recorded = json.loads((ROOT / "docs" / "results" / "scaling.json").read_text())
    res = bench.rescore(recorded, load_profile(ROOT / "bench" / "profiles" / "cartpole-dqn-2core.json"),
                        str(ROOT / recorded["job"]), ["spec.staleness.replayRatio=2"], 2.0)
    assert len(res["points"]) == 7
    assert res["median_abs_error"] <= 0.15
    assert res["bottleneck_agreement"] == "7/7"
    one = next(r for r in res["points"] if r["point"] == "1 actors")
    assert all(abs(e) <= 0.05 for e in one["rel_error"].values())
    # The bench's --rescore mode prints the same summary as JSON.
    assert bench.main(["--rescore", str(ROOT / "docs" / "results" / "scaling.json"), "--profile",
                       str(ROOT / "bench" / "profiles" / "cartpole-dqn-2core.json"),
                       "--set", "spec.staleness.replayRatio=2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bench"] == "scaling-rescore" and out["median_abs_error"] == res["median_abs_error"]


def test_rebalance_sees_a_sample_bound_learner_through_its_capacity():
    # DQN held by the replay ratio consumes r x produced: by consumption alone it looks balanced.
    pol = RebalancePolicy(target_ratio=8.0, band=0.1, min_actors=1, max_actors=16)
    held = GroupThroughput(produced_fps=1000, received_sps=1000, consumed_sps=8000, actors=1)
    assert rebalance({0: held}, pol) == {0: 1}
    seen = GroupThroughput(produced_fps=1000, received_sps=1000, consumed_sps=8000, actors=1, capacity_sps=32_000)
    assert observed_bottleneck(seen, 8.0, 0.1) == SAMPLE_BOUND
    assert rebalance({0: seen}, pol) == {0: 4} == {0: actors_for(32_000, 8.0, 1000)}


def test_link_defaults_to_loopback_on_one_node_and_ethernet_across_nodes():
    spec = dict(DQN, topology={"groups": 1, "actors": 16, "buffers": 1, "learners": 1})
    pr = prof(actor=1e6, learner=1e4, param_bytes=4e6, ipc=20e9)
    one = plan_for_job(job(**spec, resources={"nodes": 1}), pr)
    two = plan_for_job(job(**spec, resources={"nodes": 2}), pr)
    eth = plan_for_job(job(**spec, resources={"nodes": 1}, network={"link": {"preset": "ethernet-10g"}}), pr)
    assert two.comm_seconds == pytest.approx(eth.comm_seconds)
    assert two.comm_seconds > 10 * one.comm_seconds
