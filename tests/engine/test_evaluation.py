"""Periodic evaluation during training (spec.evaluation): the spec, the evaluator role (parameters
like an actor, hostile ones refused), its numbers in the shared accounting (summary.json, status),
both engines' evaluator process, and a real local run."""
import copy
import json
import math
import os
import signal
import time

import numpy as np
import pytest
import yaml
import zmq

from helpers import EXAMPLES, last_record, wait_for
from tianji.control.contracts.accounting import Accounting, status_numbers
from tianji.control.contracts.addressing import Addresses
from tianji.control.contracts.rolereport import ReportError, build_report, eval_summary, parse_report
from tianji.control.planner.plan import PlanError, plan_for_job
from tianji.control.spec import SpecError, parse_job

PPO = EXAMPLES / "cartpole-ppo.yaml"


def _doc(**evaluation) -> dict:
    doc = yaml.safe_load(PPO.read_text())
    if evaluation:
        doc["spec"]["evaluation"] = evaluation
    return doc


# ----------------------------------------------------------------- spec
def test_evaluation_is_off_by_default_and_has_bounded_defaults():
    ev = parse_job(_doc()).spec.evaluation
    assert ev.interval_seconds is None and not ev.enabled
    ev = parse_job(_doc(intervalSeconds=30)).spec.evaluation
    assert ev.enabled and ev.episodes == 10 and ev.epsilon == 0.05
    assert not parse_job(_doc(intervalSeconds=None)).spec.evaluation.enabled


@pytest.mark.parametrize("bad, field", [
    ({"intervalSeconds": 0}, "spec.evaluation.intervalSeconds"),
    ({"intervalSeconds": -5}, "spec.evaluation.intervalSeconds"),
    ({"intervalSeconds": float("nan")}, "spec.evaluation.intervalSeconds"),
    ({"intervalSeconds": float("inf")}, "spec.evaluation.intervalSeconds"),
    ({"intervalSeconds": "often"}, "spec.evaluation.intervalSeconds"),
    ({"intervalSeconds": 10, "episodes": 0}, "spec.evaluation.episodes"),
    ({"intervalSeconds": 10, "episodes": 10 ** 6}, "spec.evaluation.episodes"),
    ({"intervalSeconds": 10, "epsilon": 1.5}, "spec.evaluation.epsilon"),
    ({"intervalSeconds": 10, "epsilon": -0.1}, "spec.evaluation.epsilon"),
    ({"intervalSeconds": 10, "every": 3}, "spec.evaluation.every"),
])
def test_bad_evaluation_settings_are_refused_with_the_field(bad, field):
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        parse_job(_doc(**bad))


def test_the_planner_counts_the_evaluators_cores():
    doc = _doc(intervalSeconds=10)
    doc["spec"]["resources"]["cpus"] = 2.25  # 2 x 0.5 + 0.25 + 1 = 2.25: no room for the evaluator's 0.5
    with pytest.raises(PlanError, match="2.75"):
        plan_for_job(parse_job(doc))
    doc["spec"]["resources"]["cpus"] = 2.75
    plan_for_job(parse_job(doc))
    del doc["spec"]["evaluation"]
    doc["spec"]["resources"]["cpus"] = 2.25
    plan_for_job(parse_job(doc))


# ----------------------------------------------------------------- reports and accounting
def _eval_report(count: int, mean: float, incarnation: str = "e1", seq: int = 1, best: float | None = None,
                 version: int = 5) -> dict:
    last = eval_summary(count=count, return_mean=mean, return_std=1.0, episodes=10, policy_version=version,
                        env_frames=1000 * count, t=time.time(), best_return_mean=mean if best is None else best)
    snap = {"counts": {"eval_episodes_total": 10.0 * count}, "reasons": {}, "gauges": {"eval_return_mean": mean},
            "lag": {"count": 0, "sum": 0.0, "min": None, "max": None}}
    return build_report(job="cartpole-ppo", role="evaluator", group=0, index=0, incarnation=incarnation, pid=1,
                        started=time.time(), seq=seq, time=time.time(), final=False, snapshot=snap,
                        episodes_total=0, recent=[], extra={"version": version, "eval": last})


def test_evaluations_are_counted_once_across_restarts_and_reach_summary_and_status():
    spec = parse_job(_doc(intervalSeconds=5, episodes=10)).spec.evaluation
    acc = Accounting()
    assert acc.view(1.0, spec)["evaluation"] == {"interval_seconds": 5.0, "episodes_per_eval": 10, "count": 0,
                                                 "last": None, "best_return_mean": None}
    assert "evalReturn" not in status_numbers(acc.view(1.0))
    acc.take(parse_report(_eval_report(1, 20.0, seq=1)))
    acc.take(parse_report(_eval_report(2, 50.0, seq=2)))
    acc.take(parse_report(_eval_report(2, 50.0, seq=2)))  # the same report again: nothing new
    acc.take(parse_report(_eval_report(1, 30.0, incarnation="e2", seq=1, best=30.0)))  # restarted evaluator
    late = _eval_report(2, 50.0, seq=3)  # the replaced one's final report (a termination message), seen late
    late["extra"]["eval"]["last"]["t"] -= 60
    acc.take(parse_report(late))
    ev = acc.view(10.0, spec)["evaluation"]
    assert ev["count"] == 3 and ev["last"]["return_mean"] == 30.0 and ev["best_return_mean"] == 50.0
    assert acc.view(10.0, parse_job(_doc()).spec.evaluation)["evaluation"] is None  # off: null
    assert status_numbers(acc.view(10.0))["evalReturn"] == 30.0  # the operator's view (no spec)
    # evaluations are not training episodes: no episodes, no mean return, nothing for the stop rule
    assert acc.episodes_total == 0 and acc.mean_return() is None
    # an operator restart keeps them (the status' accounting state)
    again = Accounting(json.loads(json.dumps(acc.state())))
    assert again.view(10.0, spec)["evaluation"] == ev
    again.take(parse_report(_eval_report(1, 30.0, incarnation="e2", seq=2)))
    assert again.evals == 3


@pytest.mark.parametrize("path, value", [
    (("return_mean",), math.nan), (("return_mean",), 1e13), (("return_std",), -1.0), (("episodes",), 0),
    (("policy_version",), -1), (("t",), math.inf), ((), "x"),
])
def test_hostile_evaluation_numbers_are_refused(path, value):
    rep = _eval_report(1, 10.0)
    if path:
        rep["extra"]["eval"]["last"][path[0]] = value
    else:
        rep["extra"]["eval"] = value
    with pytest.raises(ReportError, match="eval"):
        parse_report(rep)


# ----------------------------------------------------------------- the evaluator role
def _evaluator(tmp_path, **evaluation):
    from tianji.runtime.roles.evaluator import Evaluator

    doc = _doc(**evaluation)
    doc["spec"]["network"] = {"encryption": "none"}
    job = parse_job(doc)
    role = Evaluator(job, 0, 0, Addresses(job.name, 5550, tmp_path))
    role.setup()
    return job, role


def _drain(role, until, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not until():
        if role.sub.poll(50):
            role.probe_params()
    return until()


def test_evaluator_refuses_hostile_parameters_and_evaluates_the_good_ones(tmp_path):
    from tianji.algos.models import state_arrays
    from tianji.runtime.wire import encode

    job, ev = _evaluator(tmp_path, intervalSeconds=0.01, episodes=3)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    (tmp_path / "sock").mkdir(exist_ok=True)
    pub.bind(ev.addrs.bind("params", 0, 0))  # where learner-0-0 publishes
    try:
        time.sleep(0.3)  # the subscription reaches the publisher
        good = {k: v.copy() for k, v in state_arrays(ev.model).items()}
        nan = {k: v.copy() for k, v in good.items()}
        next(iter(nan.values())).flat[0] = np.nan
        shape = {k: (v[:1].copy() if v.ndim else v) for k, v in good.items()}
        # numbered as the learner numbers its messages (a number it used is a replay: test_trust.py)
        hostile = [encode("params", job.name, "actor-0-1", 1, 7, good, {"frames": 10}),  # role
                   encode("params", job.name, "learner-0-0", 2, 7, nan, {"frames": 10}),  # non-finite
                   encode("params", job.name, "learner-0-0", 3, 7, shape, {"frames": 10}),  # shapes
                   encode("params", job.name, "learner-0-0", 4, 7, good, {"frames": -3}),  # frames
                   [b"\x93not-msgpack\xc1"]]
        for frames in hostile:
            pub.send_multipart(frames)
            assert _drain(ev, lambda: False, 0.3) is False
        rejected = ev.metrics.reasons["messages_rejected_total"]
        assert sum(rejected.values()) == len(hostile), rejected
        assert ev.version == 0  # nothing was loaded
        pub.send_multipart(encode("params", job.name, "learner-0-0", 5, 9, good, {"frames": 4096}))
        assert _drain(ev, lambda: ev.version == 9)
        ev.next_at = 0.0
        ev.step()  # due: one evaluation of version 9
        rep = parse_report(ev.report(), job.name)
        last = rep.extra["eval"]["last"]
        assert rep.extra["eval"]["count"] == 1 and last["policy_version"] == 9 and last["env_frames"] == 4096
        assert last["episodes"] == 3 and math.isfinite(last["return_mean"]) and last["return_mean"] >= 1
        assert rep.counts["eval_episodes_total"] == 3 and rep.gauges["eval_return_mean"] == last["return_mean"]
        assert rep.episodes_total == 0  # not training episodes
    finally:
        ctx.destroy(linger=0)
        ev.teardown()
        ev.ctx.destroy(linger=0)


def test_evaluator_seeds_are_never_an_actors():
    from tianji.runtime.evaluation import MAX_EVAL_ENVS, MAX_NATIVE_EVAL_ENVS
    from tianji.runtime.roles.evaluator import EVAL_SEED_BASE, EVAL_SEED_BLOCKS

    spec = parse_job(_doc()).spec
    actor_max = spec.env.seed + 10_000 * 1023 + 100 * 4095 + 1 + spec.env.num_envs  # groups, actors at their max
    assert spec.env.seed + EVAL_SEED_BASE > actor_max
    most = max(MAX_EVAL_ENVS, MAX_NATIVE_EVAL_ENVS)
    top = (2 ** 31 - 1 - 10 ** 7) + EVAL_SEED_BASE + EVAL_SEED_BLOCKS * most + most  # env.seed at its max
    assert top < 2 ** 32  # numpy's seed range


# ----------------------------------------------------------------- both engines
def test_operator_builds_one_evaluator_pod_only_when_evaluation_is_on():
    from tianji.control.planner.plan import resolve
    from tianji_operator.children import builders as b

    def pods(doc):
        job = parse_job(doc)
        resolved, _ = resolve(job)
        objs = b.children(resolved, job.spec, {0: 2}, scrapers=[], command=["tianji", "worker"])
        return [o for o in objs if o["kind"] == "Pod" and o["metadata"]["labels"][b.LABEL_ROLE] == "evaluator"]

    assert pods(_doc()) == []
    doc = _doc(intervalSeconds=30, episodes=5)
    doc["spec"]["resources"]["evaluator"] = {"cpu": 0.75, "memory": "768Mi"}
    (pod,) = pods(doc)
    c = pod["spec"]["containers"][0]
    assert c["resources"]["requests"] == c["resources"]["limits"] == {"cpu": "750m", "memory": "768Mi"}
    assert c["args"][:6] == ["--role", "evaluator", "--group", "0", "--index", "0"]
    assert {e["name"]: e.get("value") for e in c["env"]}["OMP_NUM_THREADS"] == "1"
    assert pod["spec"]["restartPolicy"] == "Always"  # a failing evaluator is restarted, never fails the job
    assert [p["name"] for p in c["ports"]] == ["metrics"]


def test_local_launcher_starts_an_evaluator_only_when_evaluation_is_on(tmp_path):
    from tianji.local.launcher import Launcher

    roles = []
    for doc in (_doc(), _doc(intervalSeconds=3)):
        doc["spec"]["network"] = {"encryption": "none"}
        la = Launcher(parse_job(doc), tmp_path / f"run{len(roles)}")
        roles.append(sorted(c.name for c in la.children if c.role == "evaluator"))
        if la.own_sock_dir:
            import shutil

            shutil.rmtree(la.sock_dir, ignore_errors=True)
    assert roles == [[], ["evaluator-0-0"]]


@pytest.mark.slow
def test_a_local_run_evaluates_periodically_and_survives_a_killed_evaluator(running_tianji):
    from test_faults import pid_of

    run = running_tianji(str(PPO), "--set", "spec.evaluation.intervalSeconds=3", "--set", "spec.evaluation.episodes=4",
                         "--set", "spec.stop.meanReturn=100000", "--set", "spec.stop.seconds=60",
                         "--set", "spec.stop.envFrames=1000000000")  # a fast machine makes 400k frames in 60 s
    wait_for(lambda: (last_record(run.run_dir) or {}).get("eval_return") is not None, 120, "a first evaluation")
    victim = pid_of("evaluator", run.run_dir)
    os.kill(victim, signal.SIGKILL)  # training goes on; the evaluator is restarted and evaluates again
    wait_for(lambda: pid_of("evaluator", run.run_dir) not in (None, victim), 60, "the evaluator to come back")
    assert run.wait(timeout=300) == 0, run.output()[-3000:]
    s = run.summary()
    ev = s["evaluation"]
    assert ev["interval_seconds"] == 3 and ev["episodes_per_eval"] == 4 and ev["count"] >= 2, ev
    assert math.isfinite(ev["last"]["return_mean"]) and ev["last"]["episodes"] == 4
    assert ev["best_return_mean"] >= ev["last"]["return_mean"]
    assert s["restarts"]["evaluator"] == 1 and s["restarts"]["learner"] == 0 and s["exit_reason"] == "seconds", s
    rows = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [x["eval_return"] for x in rows if "eval_return" in x]
    assert evals and all(math.isfinite(x) for x in evals) and evals[-1] == ev["last"]["return_mean"]
    log = (run.run_dir / "logs" / "evaluator-0-0.log").read_text()
    versions = [int(line.split(" of version ")[1].split()[0]) for line in log.splitlines() if " of version " in line]
    assert len(versions) >= 2 and versions[-1] > versions[0], versions
    # after the restart the evaluator evaluates again (its log has evaluation 1 twice)
    assert sum(" evaluation 1 of version " in line for line in log.splitlines()) == 2, log[-2000:]

def test_status_eval_return_survives_the_strict_apiserver():
    from kube import structural
    from tianji.control.spec.crd import crd_dict

    acc = Accounting()
    acc.take(parse_report(_eval_report(1, 42.5)))
    status = status_numbers(acc.view(3.0))
    obj = {"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob", "metadata": {"name": "cp"},
           "spec": {}, "status": copy.deepcopy(status)}
    schema = crd_dict()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert structural.prune(obj, schema) == []
    assert obj["status"]["evalReturn"] == 42.5 and obj["status"] == status


def test_eval_return_reaches_tensorboard_and_the_plot(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from tianji.observability.plot import plot_run
    from tianji.observability.tensorboard import scalars

    assert scalars({"eval_return": 12.5})["eval/return_mean"] == 12.5
    assert "eval/return_mean" not in scalars({"mean_return": 3.0})
    recs = [{"t": float(i), "mean_return": 1.0 * i, "env_frames": 100 * i, "produced_fps": 1.0, "received_fps": 1.0,
             "consumed_sps": 1.0, **({"eval_return": 10.0 * i} if i >= 2 else {})} for i in range(1, 5)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    figs = []
    monkeypatch.setattr(plt, "close", figs.append)
    plot_run(tmp_path, tmp_path / "p.png")
    lines = {ln.get_label(): ln for ln in figs[0].axes[0].get_lines()}
    ev = lines["evaluation (greedy policy)"]
    assert list(ev.get_xdata()) == [2.0, 3.0, 4.0] and list(ev.get_ydata()) == [20.0, 30.0, 40.0]
