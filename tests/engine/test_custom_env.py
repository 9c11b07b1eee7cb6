"""Bring your own env and model (issue 15): env.imports, entry-point ids, kwargs, declared
spaces, user torch modules, and what a misbehaving user env may not do to a job."""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from helpers import EXAMPLES, ROOT, run_tianji
from tianji.control.spec import EnvConfig, JobSpec, ModelConfig, SpecError, parse_job

CUSTOM = EXAMPLES / "custom-env"
REACH = CUSTOM / "reach-goal-ppo.yaml"
TESTS = ROOT / "tests"


@pytest.fixture
def user_path(monkeypatch):
    """The user's packages importable here and in every process `tianji run` starts."""
    monkeypatch.syspath_prepend(str(CUSTOM))
    monkeypatch.syspath_prepend(str(TESTS))
    paths = [str(CUSTOM), str(TESTS), str(ROOT / "worker")] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))


def job_with(tmp_path: Path, env: dict, model: dict | None = None, **spec) -> Path:
    doc = yaml.safe_load(REACH.read_text())
    doc["spec"]["env"].update(env)
    if model is not None:
        doc["spec"]["model"] = model
    doc["spec"].update(spec)
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


# ----------------------------------------------------------------- the spec
def test_user_code_fields_are_checked_by_the_spec():
    ok = parse_job(yaml.safe_load(REACH.read_text()))
    assert ok.spec.env.imports == ["reach_goal"] and ok.spec.env.kwargs == {"step_size": 0.1, "step_penalty": 0.01}
    bad = {
        "spec.env.imports[0]": {"env": {"imports": ["my-pkg"]}},
        "spec.env.id": {"env": {"id": "mypkg.envs:"}},
        "spec.model.entryPoint": {"model": {"entryPoint": "mypkg.models"}},
    }
    for field, spec in bad.items():
        with pytest.raises(SpecError, match="^<manifest>: " + re.escape(field) + ": "):
            parse_job({"metadata": {"name": "j"}, "spec": spec})
    # A model class is importable only from a package the job lists.
    with pytest.raises(SpecError, match=r"spec: model.entryPoint: module 'evil.models' is not in a package listed"):
        parse_job({"metadata": {"name": "j"}, "spec": {"model": {"entryPoint": "evil.models:Net"}}})
    JobSpec(model={"entryPoint": "mypkg.models:Net", "imports": ["mypkg"]})  # a submodule of a listed package
    JobSpec(env={"imports": ["mypkg.envs"]}, model={"entryPoint": "mypkg.envs:Net"})


@pytest.mark.parametrize("kwargs, says", [
    ({"a": {1, 2}}, "spec.env.kwargs.a: set is not plain data"),
    ({"a": float("nan")}, "spec.env.kwargs.a: nan is not a finite number"),
    ({"a": [[[[[[[[[[1]]]]]]]]]]}, "spec.env.kwargs.a[0][0][0][0][0][0][0][0]: nested deeper than 8"),
    ({"a": list(range(2000))}, "spec.env.kwargs.a: more than 1024 items"),
    ({"a": {"b": [0.5, float("inf")]}}, "spec.env.kwargs.a.b[1]: inf is not a finite number"),
])
def test_env_kwargs_must_be_plain_data(kwargs, says):
    """Refused naming the item's own path, on both engines (the operator reads JSON through parse_job)."""
    with pytest.raises(SpecError) as e:
        parse_job({"metadata": {"name": "j"}, "spec": {"env": {"kwargs": kwargs}}})
    assert str(e.value).startswith(f"<manifest>: {says}"), e.value


def test_the_crd_keeps_kwargs_and_model_config():
    """Free-form maps: without preserve-unknown-fields the apiserver would prune them to {}."""
    from tianji.control.spec.crd import spec_schema

    props = spec_schema()["properties"]
    for section, key in (("env", "kwargs"), ("model", "config")):
        node = props[section]["properties"][key]
        assert node["type"] == "object" and node["x-kubernetes-preserve-unknown-fields"] is True


# ----------------------------------------------------------------- before anything starts
def refuse(tmp_path: Path, job: Path) -> str:
    run_dir = tmp_path / "run"
    r = run_tianji("run", str(job), "--run-dir", str(run_dir), "--quiet", "--max-seconds", "1", timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert not run_dir.exists()  # nothing was started
    return r.stderr


def test_a_missing_env_module_fails_before_any_process_starts(tmp_path, user_path):
    err = refuse(tmp_path, job_with(tmp_path, {"imports": ["reach_goal", "no_such_pkg.envs"]}))
    assert "spec.env.imports[1]: cannot import 'no_such_pkg.envs': ModuleNotFoundError" in err, err


@pytest.mark.parametrize("env_id, says", [
    ("reach_goal.envs:NoSuchEnv", "spec.env.id: 'reach_goal.envs:NoSuchEnv': module 'reach_goal.envs' has no "
                                  "attribute 'NoSuchEnv'"),
    ("no_such_pkg:Env", "spec.env.id: 'no_such_pkg:Env': cannot import 'no_such_pkg': ModuleNotFoundError"),
    ("NotRegistered-v0", "spec.env.id: 'NotRegistered-v0' is not a registered Gymnasium environment"),
    ("bad_envs:DictObs", "observation space Dict("),
    ("bad_envs:TextObs", "observation space Text("),
])
def test_a_bad_env_id_or_space_is_refused_naming_it(tmp_path, user_path, env_id, says):
    from tianji.envs import check_env_spec

    cfg = EnvConfig(id=env_id, imports=["reach_goal"])
    with pytest.raises(SpecError, match="^job.yaml: spec.env") as e:
        check_env_spec(cfg, "job.yaml")
    assert says in str(e.value), e.value


def test_kwargs_the_env_does_not_take_are_named(user_path):
    from tianji.envs import check_env_spec

    with pytest.raises(SpecError, match=r"^job.yaml: spec.env.kwargs: 'ReachGoal-v0' cannot be made with "
                                        r"\{'speed': 2\}: TypeError: .*'speed'"):
        check_env_spec(EnvConfig(id="ReachGoal-v0", imports=["reach_goal"], kwargs={"speed": 2}), "job.yaml")


def test_atari_ids_refuse_kwargs_they_would_ignore():
    from tianji.envs import check_env_spec

    with pytest.raises(SpecError, match="^job.yaml: spec.env.kwargs: Atari ids take frameStack"):
        check_env_spec(EnvConfig(id="ALE/Pong-v5", kwargs={"frameskip": 2}), "job.yaml")


def test_declared_spaces_must_match_the_env(user_path):
    from tianji.envs import check_env_spec

    cfg = EnvConfig(id="ReachGoal-v0", imports=["reach_goal"],
                    spaces={"observation": {"shape": [3]}, "action": {"n": 3}})
    with pytest.raises(SpecError, match=r"spec.env.spaces: declares .*'shape': \[3\].* has .*'shape': \[2\]"):
        check_env_spec(cfg, "job.yaml")


# ----------------------------------------------------------------- buffers and learners build no env
def test_buffers_and_learners_read_declared_spaces_without_importing(user_path):
    from tianji.envs import EnvInfo, declared_info

    spaces = {"observation": {"shape": [2], "dtype": "float32"}, "action": {"n": 3}}
    assert declared_info(EnvConfig(id="Gone-v0", imports=["no_such_pkg"], spaces=spaces)) == \
        EnvInfo((2,), "float32", 3)  # nothing imported: the module does not even exist
    with pytest.raises(ValueError, match="spec.env.spaces: a user env .* must declare its spaces"):
        declared_info(EnvConfig(id="ReachGoal-v0", imports=["reach_goal"]))


# ----------------------------------------------------------------- user models
def reach_info():
    from tianji.envs import EnvInfo

    return EnvInfo((2,), "float32", 3)


def test_a_user_model_is_built_the_same_everywhere_and_travels_as_arrays(user_path):
    from tianji.algos.models import build_model, load_arrays, state_arrays

    cfg = ModelConfig(entry_point="reach_goal.models:Net", config={"width": 16})
    a = build_model("ppo", cfg, reach_info(), 7, ["reach_goal"])
    b = build_model("ppo", cfg, reach_info(), 7, ["reach_goal"])
    wire = state_arrays(a)
    assert wire["trunk.1.weight"].shape == (16, 2) and all(isinstance(v, np.ndarray) for v in wire.values())
    assert all(np.array_equal(wire[k], v) for k, v in state_arrays(b).items())  # version 0 is the same
    with torch.no_grad():
        a.pi.bias += 1.0
    load_arrays(b, state_arrays(a))
    obs = torch.rand(5, 2)
    assert torch.equal(a.logits(obs), b.logits(obs))


def test_a_user_model_outside_the_listed_packages_is_refused(user_path):
    from tianji.algos.models import build_model
    from tianji.envs.custom import UserCodeError

    # model_construct skips the spec's own check: the worker checks again before importing.
    cfg = ModelConfig.model_construct(entry_point="reach_goal.models:Net", imports=[], config={},
                                      hidden=[64], activation="tanh", encoder="auto")
    with pytest.raises(UserCodeError, match="module 'reach_goal.models' is not in a package listed"):
        build_model("ppo", cfg, reach_info(), 1, ["bad_envs"])


@pytest.mark.parametrize("source, says", [
    ("class Net(nn.Module):\n def __init__(s, o, a, c): super().__init__(); s.l = nn.Linear(2, 3)\n"
     " def forward(s, x): return s.l(x)\n", "has no logits(obs) method"),
    ("class Net(nn.Module):\n def __init__(s, o, a, c): super().__init__(); s.l = nn.Linear(2, 4)\n"
     " def forward(s, x): return s.l(x), s.l(x)[:, 0]\n def logits(s, x): return s.l(x)\n",
     "forward logits: expected shape [2, 3], got (2, 4)"),
    ("class Net(nn.Module):\n def __init__(s, o, a): super().__init__()\n", "failed: TypeError"),
    ("Net = 3\n", "is not a torch.nn.Module subclass"),
])
def test_a_user_model_that_breaks_the_contract_fails_at_build(tmp_path, monkeypatch, source, says):
    from tianji.algos.models import build_model
    from tianji.envs.custom import UserCodeError

    pkg = tmp_path / "usermodel_case"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from torch import nn\n" + source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "usermodel_case", raising=False)  # each case its own module
    cfg = ModelConfig(entry_point="usermodel_case:Net", imports=["usermodel_case"])
    with pytest.raises(UserCodeError, match="^spec.model.entryPoint: ") as e:
        build_model("ppo", cfg, reach_info(), 1)
    assert says in str(e.value), e.value


# ----------------------------------------------------------------- bad env output, faults
def test_nonfinite_env_output_is_found():
    from tianji.runtime.envguard import nonfinite_steps, obs_finite

    frag = {"obs": np.zeros((4, 3, 2), np.float32), "rewards": np.zeros((4, 3), np.float32)}
    last = np.zeros((3, 2), np.float32)
    assert nonfinite_steps(frag, last) == 0
    frag["obs"][1, 2, 0] = np.nan
    frag["rewards"][3, 0] = np.inf
    frag["rewards"][1, 2] = -np.inf  # same step as the NaN observation: one step
    last[1, 1] = np.nan
    assert nonfinite_steps(frag, last) == 3 and not obs_finite(last)
    images = {"obs": np.full((2, 1, 4, 84, 84), 255, np.uint8), "rewards": np.zeros((2, 1), np.float32)}
    assert nonfinite_steps(images, np.zeros((1, 4, 84, 84), np.uint8)) == 0


def test_the_restart_notice_quotes_this_incarnations_exception(tmp_path):
    from tianji.local.worker_logs import last_exception

    log = tmp_path / "actor-0-0.log"
    log.write_text("Traceback (most recent call last):\n  File \"x\", line 1\nValueError: old one\n")
    since = log.stat().st_size
    assert last_exception(log) == "ValueError: old one"
    assert last_exception(log, since) is None  # killed without a traceback: nothing from the last run
    with open(log, "a") as f:
        f.write("2026 actor-0-0 ERROR actor-0-0 failed\nTraceback (most recent call last):\n"
                "  File \"env.py\", line 9, in step\n    raise RuntimeError('boom')\nRuntimeError: boom\n"
                "2026 actor-0-0 INFO bye\n")
    assert last_exception(log, since) == "RuntimeError: boom"


def train(running_tianji, job: Path, *sets: str):
    run = running_tianji(str(job), *[a for s in sets for a in ("--set", s)])
    run.wait(timeout=300)
    return run, run.summary()


@pytest.mark.slow
def test_custom_env_with_a_user_model_trains_to_its_target(tmp_path, user_path, monkeypatch, running_tianji):
    log = tmp_path / "imports.log"
    monkeypatch.setenv("TIANJI_TEST_IMPORT_LOG", str(log))
    run, s = train(running_tianji, REACH, "spec.env.imports=[reach_goal,bad_envs]")
    assert s["reached_target"] and s["exit_reason"] == "target" and s["mean_return_at_target"] >= 0.85, s
    # env.imports ran in the launcher's pre-flight check and in the actor, in no other process
    assert sorted(set(log.read_text().split())) == ["actor", "launcher"], log.read_text()
    ckpt = sorted((run.run_dir / "checkpoints" / "0-0").glob("ckpt-*.pt"))[-1]
    weights = torch.load(ckpt, weights_only=True)["model"]
    assert "trunk.1.weight" in weights and tuple(weights["pi.weight"].shape) == (3, 32)  # the user's Net


@pytest.mark.slow
def test_an_env_that_raises_in_step_is_a_restarted_worker_fault(tmp_path, user_path, running_tianji):
    marker = tmp_path / "fault-raised"
    # FailOnce is ReachGoalEnv, which has no time limit of its own: ReachGoal-v0's 50 steps come as a
    # wrapper. Without one, a policy that fell into a loop under load (5,000-step episodes, mean return
    # -53 with two busy cores beside the run) never recovered within 1M frames.
    job = job_with(tmp_path, {"id": "bad_envs:FailOnce", "imports": ["reach_goal"],
                              "kwargs": {"marker": str(marker), "after": 60},
                              "wrappers": [{"entryPoint": "gymnasium.wrappers:TimeLimit",
                                            "kwargs": {"max_episode_steps": 50}}]})
    run, s = train(running_tianji, job, "spec.stop.envFrames=600000")
    assert marker.exists() and s["restarts"]["actor"] >= 1, s
    seen = {k: s.get(k) for k in ("exit_reason", "env_frames", "mean_return", "wall_seconds", "target_checks",
                                  "target_evaluation", "policy_version")}
    assert s["reached_target"], seen  # the restarted actor carried on
    notice = "actor-0-0 exited (exit code 1): RuntimeError: bad_envs: simulated fault in step; restart 1"
    assert notice in run.output(), run.output()
    actor_log = (run.run_dir / "logs" / "actor-0-0.log").read_text()
    assert "Traceback (most recent call last)" in actor_log and "in step" in actor_log


@pytest.mark.slow
def test_nonfinite_env_output_is_counted_and_never_sent(tmp_path, user_path, running_tianji):
    job = job_with(tmp_path, {"id": "bad_envs:NaNSometimes", "imports": ["reach_goal"], "kwargs": {"every": 400}})
    run, s = train(running_tianji, job, "spec.stop.meanReturn=null", "spec.stop.envFrames=30000")
    assert s["exit_reason"] == "frames", s
    assert s["dropped_samples"].get("env_nonfinite", 0) > 0, s
    assert s["rejected_messages"] == 0 and "nonfinite" not in s["dropped_samples"], s  # nothing reached them
    assert s["restarts"] == {"actor": 0, "buffer": 0, "learner": 0}, s
    assert s["policy_version"] > 0 and s["episodes"] > 0, s
    assert "non-finite observations/rewards; fragment dropped" in (run.run_dir / "logs" / "actor-0-0.log").read_text()


# ----------------------------------------------------------------- env.wrappers (issue 25)
GRIDWORLD = CUSTOM / "gridworld-ppo.yaml"
FLATTEN = {"entryPoint": "gymnasium.wrappers:FlattenObservation"}


def gridworld_env(**env) -> EnvConfig:
    cfg = yaml.safe_load(GRIDWORLD.read_text())["spec"]["env"]
    return EnvConfig.model_validate({**cfg, **env})


def test_wrapper_fields_are_checked_by_the_spec():
    for wrappers, field, says in (
            ([{"entryPoint": "FlattenObservation"}], "spec.env.wrappers[0].entryPoint",
             "'FlattenObservation': expected module.path:Class, e.g. gymnasium.wrappers:FlattenObservation"),
            ([FLATTEN, {"entryPoint": "gymnasium.wrappers:TimeLimit", "kwargs": {"n": float("nan")}}],
             "spec.env.wrappers[1].kwargs.n", "nan is not a finite number"),
            ([{"kwargs": {}}], "spec.env.wrappers[0].entryPoint", "Field required"),
            ([{"entryPiont": "a:B"}], "spec.env.wrappers[0].entryPiont", "unknown field; did you mean entryPoint?")):
        with pytest.raises(SpecError) as e:
            parse_job({"metadata": {"name": "j"}, "spec": {"env": {"wrappers": wrappers}}})
        assert f"<manifest>: {field}: {says}" in str(e.value), e.value
    assert EnvConfig(wrappers=[FLATTEN]).wrappers[0].kwargs == {}


def test_the_gymnasium_tutorial_env_runs_flattened_and_cast(user_path):
    """GridWorldEnv's Dict of int64 Boxes: refused as it is (the message says which wrapper); with
    FlattenObservation it is an int64 Box(4,), carried as float32 with a note."""
    from tianji.envs import check_env_spec, make_vec_env

    with pytest.raises(SpecError, match=r"not a Box: .*spec.env.wrappers: \[\{entryPoint: gymnasium.wrappers:"
                                        r"FlattenObservation\}\]"):
        check_env_spec(gridworld_env(wrappers=[]), "job.yaml")
    notes = []
    info = check_env_spec(gridworld_env(), "job.yaml", "ppo", note=notes.append)
    assert (info.obs_shape, info.obs_dtype, info.n_actions) == ((4,), "float32", 4)
    assert notes == ["spec.env.id 'gymnasium_env/GridWorld-v0': observations int64[4] are cast to float32 "
                     "(TianJi carries uint8/float32/float64 arrays)"]
    env = make_vec_env(gridworld_env(), 2, note=notes.append)
    obs, _ = env.reset(seed=1)
    assert obs.dtype == np.float32 and obs.shape == (2, 4) and set(np.unique(obs)) <= {0.0, 1.0, 2.0, 3.0, 4.0}
    env.close()


def test_wrappers_apply_in_order_with_their_kwargs(user_path):
    """Flatten, then cast to float64 works; the other way round DtypeObservation meets a Dict."""
    from tianji.envs import check_env_spec

    to64 = {"entryPoint": "gymnasium.wrappers:DtypeObservation", "kwargs": {"dtype": "float64"}}
    info = check_env_spec(gridworld_env(wrappers=[FLATTEN, to64]), "job.yaml")
    assert info.obs_dtype == "float64"
    with pytest.raises(SpecError, match=r"^job.yaml: spec.env.wrappers\[0\].entryPoint: "
                                        r"'gymnasium.wrappers:DtypeObservation' cannot wrap the env"):
        check_env_spec(gridworld_env(wrappers=[to64, FLATTEN]), "job.yaml")


@pytest.mark.parametrize("wrapper, says", [
    ({"entryPoint": "no_such_pkg.wrappers:W"},
     "spec.env.wrappers[0].entryPoint: 'no_such_pkg.wrappers:W': cannot import 'no_such_pkg.wrappers'"),
    ({"entryPoint": "gymnasium.wrappers:NoSuchWrapper"},
     "spec.env.wrappers[0].entryPoint: 'gymnasium.wrappers:NoSuchWrapper': module 'gymnasium.wrappers' has no "
     "attribute"),
    ({"entryPoint": "gymnasium.wrappers:TimeLimit", "kwargs": {"steps": 5}},
     "spec.env.wrappers[0].entryPoint: 'gymnasium.wrappers:TimeLimit' cannot wrap the env with kwargs {'steps': 5}: "
     "TypeError"),
])
def test_a_wrapper_that_cannot_be_used_is_refused_naming_it(wrapper, says):
    from tianji.envs import check_env_spec

    with pytest.raises(SpecError) as e:
        check_env_spec(EnvConfig(wrappers=[wrapper]), "job.yaml")
    assert str(e.value).startswith(f"job.yaml: {says}"), e.value


def test_a_native_vector_env_is_wrapped_per_env(user_path):
    """CartPole's own vector env has no single envs: with wrappers it runs Gymnasium's per-env loop."""
    from tianji.envs import make_vec_env

    env = make_vec_env(EnvConfig(wrappers=[{"entryPoint": "gymnasium.wrappers:TimeLimit",
                                            "kwargs": {"max_episode_steps": 3}}]), 2)
    env.reset(seed=0)
    truncated = [env.step(np.zeros(2, dtype=np.int64))[3] for _ in range(3)]
    assert not truncated[1].any() and truncated[2].all()
    env.close()


def test_atari_ids_take_no_wrappers():
    from tianji.envs import check_env_spec

    with pytest.raises(SpecError, match="spec.env.wrappers: Atari ids are wrapped by TianJi's Atari maker"):
        check_env_spec(EnvConfig(id="ALE/Pong-v5", wrappers=[FLATTEN]), "job.yaml")


def test_tianji_run_notes_the_cast_and_reports_episode_length(tmp_path, user_path, running_tianji):
    """The tutorial env through `tianji run` as a user runs it: the cast is noted before anything
    starts; the run's episode length (the measure that shows a sparse reward's learning) is in
    metrics.jsonl, summary.json and the last console line."""
    run = running_tianji(str(GRIDWORLD), "--set", "spec.stop.envFrames=6000")
    run.wait(timeout=300)
    s, out = run.summary(), run.output()
    assert "tianji: note: spec.env.id 'gymnasium_env/GridWorld-v0': observations int64[4] are cast to float32" in out
    assert s["exit_reason"] == "frames" and s["episodes"] > 100, s
    assert 1 <= s["mean_episode_length"] <= 300, s  # the tutorial's TimeLimit is 300 steps
    rows = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["mean_episode_length"] == pytest.approx(s["mean_episode_length"])
    assert f"episode length {s['mean_episode_length']:.1f}" in out
    job = yaml.safe_load((run.run_dir / "job.yaml").read_text())["spec"]["env"]
    assert job["wrappers"] == [{**FLATTEN, "kwargs": {}}] and job["spaces"]["observation"] == {
        "shape": [4], "dtype": "float32"}


@pytest.mark.slow
def test_the_gymnasium_tutorial_env_learns_shorter_episodes(user_path, running_tianji):
    """The sparse reward is 1 at the target however long it takes: the learning shows in the episode
    length, from a random walk's dozens of steps to about the Manhattan distance (~3.3 on 5x5)."""
    run = running_tianji(str(GRIDWORLD))
    run.wait(timeout=400)
    s = run.summary()
    assert s["exit_reason"] == "frames" and s["mean_return"] > 0.95, s
    assert s["mean_episode_length"] < 6, s


# ----------------------------------------------------------------- Kubernetes
async def test_the_operator_needs_a_user_envs_spaces_declared(kube):
    """Pods cannot learn a user env's spaces (buffers and learners do not import it): without
    spec.env.spaces the job fails before any pod; with them it runs, kwargs kept as written."""
    from kube.operator_harness import RunningOperator, children, cond, eventually, job_manifest, status

    env = {"id": "ReachGoal-v0", "imports": ["reach_goal"], "kwargs": {"step_size": 0.1, "opts": {"a": [1, "b"]}}}
    async with RunningOperator(kube):
        await kube.create_job(job_manifest("cartpole", {"env": env}))
        await eventually(lambda: status(kube).get("phase") == "Failed", what="phase Failed")
        failed = cond(kube, "Failed")
        assert failed["reason"] == "InvalidSpec" and failed["message"].startswith("spec.env.spaces: a user env")
        assert children(kube) == {}
        spaces = {"observation": {"shape": [2]}, "action": {"n": 3}}
        await kube.create_job(job_manifest("declared", {"env": {**env, "spaces": spaces}}))
        await eventually(lambda: children(kube, "declared"), what="the declared job's children")
        cm = next(o for (kind, _), o in children(kube, "declared").items() if kind == "ConfigMap")
        applied = yaml.safe_load(next(iter(cm["data"].values())))
        assert applied["spec"]["env"]["kwargs"] == env["kwargs"]  # not pruned by the CRD schema
        assert applied["spec"]["env"]["spaces"]["action"] == {"n": 3}


async def test_the_operator_passes_wrappers_to_pods_unchanged(kube):
    """One manifest, one meaning: the CRD admits spec.env.wrappers, a job with wrappers is a user
    env (its spaces declared), and the ConfigMap the pods read carries the wrappers as written."""
    from kube.operator_harness import RunningOperator, children, cond, eventually, job_manifest, status

    wrappers = [FLATTEN, {"entryPoint": "gymnasium.wrappers:TimeLimit", "kwargs": {"max_episode_steps": 100}}]
    env = {"id": "gymnasium_env/GridWorld-v0", "imports": ["gymnasium_env"], "kwargs": {"size": 5},
           "wrappers": wrappers}
    async with RunningOperator(kube):
        await kube.create_job(job_manifest("undeclared", {"env": {**env, "imports": []}}))
        await eventually(lambda: status(kube, "undeclared").get("phase") == "Failed", what="phase Failed")
        assert cond(kube, "Failed", "undeclared")["message"].startswith("spec.env.spaces: a user env")
        spaces = {"observation": {"shape": [4], "dtype": "float32"}, "action": {"n": 4}}
        await kube.create_job(job_manifest("grid", {"env": {**env, "spaces": spaces}}))
        await eventually(lambda: children(kube, "grid"), what="the job's children")
        cm = next(o for (kind, _), o in children(kube, "grid").items() if kind == "ConfigMap")
        applied = yaml.safe_load(next(iter(cm["data"].values())))
        assert applied["spec"]["env"]["wrappers"] == [{"kwargs": {}, **w} for w in wrappers]  # kwargs' default filled
