"""Bring your own env and model (issue 15): env.imports, entry-point ids, kwargs, declared
spaces, user torch modules, and what a misbehaving user env may not do to a job."""
from __future__ import annotations

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
    from tianji.control.crd import spec_schema

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
    job = job_with(tmp_path, {"id": "bad_envs:FailOnce", "imports": ["reach_goal"],
                              "kwargs": {"marker": str(marker), "after": 60}})
    run, s = train(running_tianji, job)
    assert marker.exists() and s["restarts"]["actor"] >= 1, s
    assert s["reached_target"], s  # the restarted actor carried on
    notice = "actor-0-0 exited (1): RuntimeError: bad_envs: simulated fault in step; restart 1"
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
