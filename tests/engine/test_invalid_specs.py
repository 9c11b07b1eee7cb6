"""One validation, two engines: a spec a real cluster would refuse is refused by `tianji run`
(exit 2, one line naming the field, nothing started) and by the operator (phase Failed,
Planned=False/InvalidSpec) in the same words. And input that is no manifest at all gets a
one-line error from `tianji run`, never a traceback."""
from __future__ import annotations

import contextlib

import pytest
import yaml

from helpers import EXAMPLES, run_tianji
from kube.operator_harness import RunningOperator, children, cond, eventually, job_manifest, start_cluster, status

# name: (spec, the field path named, what the message says about it)
BAD_SPECS = {
    "memory-uppercase-K": ({"resources": {"actor": {"memory": "524288K"}}},
                           "spec.resources.actor.memory", "'524288K' is not a Kubernetes quantity"),
    "memory-without-unit": ({"resources": {"learner": {"memory": "512"}}},
                            "spec.resources.learner.memory", "below the minimum of 64Mi"),
    "cpu-below-a-millicore": ({"resources": {"buffer": {"cpu": 0.0004}}},
                              "spec.resources.buffer.cpu", "greater than or equal to 0.001"),
    "metrics-port-on-a-data-port": ({"network": {"basePort": 6000, "metricsPort": 6004}},
                                    "spec.network.metricsPort", "6004 is one of the data ports"),
    "data-ports-past-65535": ({"network": {"basePort": 65533}},
                              "spec.network.basePort", "less than or equal to 65531"),
    "rdma-without-domain": ({"network": {"rdma": "hca_shared_devices_a"}},
                            "spec.network.rdma", "not an extended resource name"),
    "rdma-in-kubernetes-io": ({"network": {"rdma": "kubernetes.io/rdma"}},
                              "spec.network.rdma", "reserved"),
    "image-empty": ({"image": ""}, "spec.image", "at least 1 character"),
    "image-uppercase-name": ({"image": "registry.example.com/TianJi:0.1.0"},
                             "spec.image", "not an image reference"),
    "env-import-not-a-module-path": ({"env": {"imports": ["my-envs"]}},
                                     "spec.env.imports[0]", "should match pattern"),
    "model-from-an-unlisted-package": ({"model": {"entryPoint": "mypkg.models:Net"}},
                                       "spec", "model.entryPoint: module 'mypkg.models' is not in a package listed"),
    # The CRD's JSON types, which the apiserver enforces and pydantic would coerce: refused, not coerced.
    "actors-as-a-string": ({"topology": {"actors": "2"}}, "spec.topology.actors", "expected an integer, got str '2'"),
    "actors-as-a-boolean": ({"topology": {"actors": True}}, "spec.topology.actors", "expected an integer, got bool"),
    "lr-as-a-string": ({"algorithm": {"name": "ppo", "lr": "0.001"}}, "spec.algorithm.lr",
                       "expected a number, got str '0.001'"),
    "pace-actors-as-an-integer": ({"staleness": {"paceActors": 1}}, "spec.staleness.paceActors",
                                  "expected a boolean, got int 1"),
    # Unknown fields and wrong choices: "did you mean", not the validator's jargon (issue 25).
    "algorithm-name-in-capitals": ({"algorithm": {"name": "PPO"}}, "spec.algorithm.name",
                                   "'PPO' is not one of 'ppo', 'dqn'; did you mean 'ppo'?"),
    "misspelled-field": ({"env": {"numEnv": 4}}, "spec.env.numEnv", "unknown field; did you mean numEnvs?"),
    "other-algorithms-field": ({"algorithm": {"name": "ppo", "replayCapacity": 1000}}, "spec.algorithm.replayCapacity",
                               "unknown field for ppo: replayCapacity is a field of dqn"),
    "activation-misspelled": ({"model": {"activation": "Relu"}}, "spec.model.activation",
                              "Input should be 'tanh' or 'relu'; did you mean 'relu'?"),
}
JSON_TYPE_CASES = [k for k in BAD_SPECS if "-as-a" in k]


def write_manifest(tmp_path, spec: dict):
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(job_manifest("cartpole", spec)))
    return p


def refuse_locally(tmp_path, *args: str) -> str:
    """Run `tianji run` on input it must refuse; check how it refuses; return its message."""
    run_dir = tmp_path / "run"
    # --max-seconds: should the input pass after all, the run ends soon (and the test fails).
    r = run_tianji("run", *args, "--run-dir", str(run_dir), "--quiet", "--max-seconds", "1", timeout=120)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.startswith("tianji: invalid job spec: ") and r.stderr.count("\n") == 1, r.stderr
    assert not run_dir.exists()  # nothing was started
    return r.stderr.removeprefix("tianji: invalid job spec: ").strip()


@pytest.fixture
async def old_crd_kube():
    # The CRD's schema refuses some of these at admission already (test_crd.py); a cluster can
    # still serve an older, looser CRD (Helm never upgrades CRDs), so the operator checks too.
    async with contextlib.AsyncExitStack() as stack:
        yield await start_cluster(stack, validate_crd=False)


@pytest.mark.parametrize("case", BAD_SPECS)
def test_tianji_run_refuses_the_spec_naming_the_field(tmp_path, case):
    spec, field, says = BAD_SPECS[case]
    job = write_manifest(tmp_path, spec)
    message = refuse_locally(tmp_path, str(job))
    assert message.startswith(f"{job}: {field}: ") and says in message, message


@pytest.mark.parametrize("case", BAD_SPECS)
async def test_the_operator_refuses_the_spec_in_the_same_words(tmp_path, old_crd_kube, case):
    spec, field, says = BAD_SPECS[case]
    job = write_manifest(tmp_path, spec)
    local = refuse_locally(tmp_path, str(job)).removeprefix(f"{job}: ")
    kube = old_crd_kube
    async with RunningOperator(kube):
        await kube.create_job(job_manifest("cartpole", spec))
        await eventually(lambda: status(kube).get("phase") == "Failed", what="phase Failed")
        planned, failed = cond(kube, "Planned"), cond(kube, "Failed")
        assert (planned["status"], planned["reason"]) == ("False", "InvalidSpec")
        assert (failed["status"], failed["reason"]) == ("True", "InvalidSpec")
        assert local in planned["message"] and local in failed["message"]
        assert planned["message"].startswith(f"{field}: ") and says in planned["message"]
        assert children(kube) == {}


@pytest.mark.parametrize("case", JSON_TYPE_CASES)
def test_the_crd_schema_refuses_the_same_json_types(case):
    import jsonschema

    from unit.test_crd import _job, _validate_instance  # tests/ is on sys.path (conftest): any tier alone

    with pytest.raises(jsonschema.ValidationError):
        _validate_instance(_job(BAD_SPECS[case][0]))


def test_numbers_read_as_kubectl_reads_them(tmp_path):
    """`3e-4` is a number (YAML 1.2, kubectl), not the string PyYAML's 1.1 rules make of it; an
    integral number is an integer, as it is to the apiserver."""
    from tianji.control.spec import load_job

    p = tmp_path / "job.yaml"
    p.write_text((EXAMPLES / "cartpole-ppo.yaml").read_text().replace("lr: 3.0e-3", "lr: 3e-4", 1))
    assert load_job(p).spec.algorithm.lr == 3e-4
    job = load_job(EXAMPLES / "cartpole-ppo.yaml", ["spec.algorithm.lr=5E-4", "spec.topology.actors=3.0",
                                                    "spec.stop.envFrames=1e6"])
    assert (job.spec.algorithm.lr, job.spec.topology.actors, job.spec.stop.env_frames) == (5e-4, 3, 1_000_000)


def test_aliases_mean_what_kubectl_makes_of_them(tmp_path):
    """kubectl applies a manifest with anchors and aliases (it expands them): `tianji run` reads
    the same file to the same job, as the expanded manifest."""
    from tianji.control.spec import load_job

    text = (EXAMPLES / "cartpole-ppo.yaml").read_text()
    anchored = text.replace("    actor: {cpu: 0.5, memory: 1Gi}", "    actor: &small {cpu: 0.5, memory: 1Gi}")
    anchored = anchored.replace("    buffer: {cpu: 0.25, memory: 1Gi}", "    buffer: *small")
    anchored = anchored.replace("hidden: [64, 64]", "hidden: [&width 32, *width]")
    (tmp_path / "anchored.yaml").write_text(anchored)
    expanded = text.replace("    buffer: {cpu: 0.25, memory: 1Gi}", "    buffer: {cpu: 0.5, memory: 1Gi}")
    (tmp_path / "expanded.yaml").write_text(expanded.replace("hidden: [64, 64]", "hidden: [32, 32]"))
    assert anchored != text and load_job(tmp_path / "anchored.yaml") == load_job(tmp_path / "expanded.yaml")


def test_valid_kubernetes_values_pass(tmp_path):
    """The grammar accepts what Kubernetes does: decimal, binary and exponent quantities,
    millicores, a registry with a port, a digest."""
    from tianji.control.spec import parse_job

    digest = "sha256:" + "0" * 64
    for spec in ({"resources": {"actor": {"memory": "1.5G", "cpu": 0.001}, "buffer": {"memory": "129e6"},
                                "learner": {"memory": "65536Ki"}}},
                 {"network": {"basePort": 65531, "metricsPort": 65530, "rdma": "rdma/hca_shared_devices_a"}},
                 {"image": f"registry.example.com:5000/ml/tianji-worker:0.1.0@{digest}"}):
        parse_job(job_manifest("cartpole", spec))


# ----------------------------------------------------------------- input that is no manifest
def _directory(tmp_path):
    return [str(tmp_path / "jobs")], "is a directory"


def _not_utf8(tmp_path):
    (tmp_path / "job.yaml").write_bytes(b"\xff\xfe" + "metadata: {name: x}".encode("utf-16-le"))
    return [str(tmp_path / "job.yaml")], "not UTF-8"


def _broken_yaml(tmp_path):
    (tmp_path / "job.yaml").write_text("metadata: {name: x\nspec: [\n")
    return [str(tmp_path / "job.yaml")], "not valid YAML: line"


def _empty(tmp_path):
    (tmp_path / "job.yaml").write_text("# nothing here\n")
    return [str(tmp_path / "job.yaml")], "empty"


def _set_a_yaml_tag(tmp_path):
    return [str(EXAMPLES / "cartpole-ppo.yaml"), "--set", "spec.algorithm.lr=!!python/object/apply:os.getpid []"], \
        "--set spec.algorithm.lr: value '!!python/object/apply:os.getpid []' is not valid YAML"


def _set_broken_yaml(tmp_path):
    return [str(EXAMPLES / "cartpole-ppo.yaml"), "--set", "spec.model.hidden=[64,"], \
        "--set spec.model.hidden: value '[64,' is not valid YAML"


@pytest.mark.parametrize("make", [_directory, _not_utf8, _broken_yaml, _empty, _set_a_yaml_tag, _set_broken_yaml],
                         ids=lambda f: f.__name__.strip("_"))
def test_tianji_run_refuses_unreadable_input_in_one_line(tmp_path, make):
    (tmp_path / "jobs").mkdir()
    args, says = make(tmp_path)
    assert says in refuse_locally(tmp_path, *args)


# ----------------------------------------------------------------- hostile manifests (issue 11)
PPO_TEXT = (EXAMPLES / "cartpole-ppo.yaml").read_text()


def _write(tmp_path, text: str):
    (tmp_path / "job.yaml").write_text(text)
    return [str(tmp_path / "job.yaml")]


def _top_level_typo(tmp_path):
    return _write(tmp_path, PPO_TEXT.replace("spec:", "sepc:", 1)), "sepc: unknown field; did you mean spec?"


def _metadata_unknown_key(tmp_path):
    return _write(tmp_path, PPO_TEXT.replace("  name: cartpole-ppo", "  name: cartpole-ppo\n  nmae: x")), \
        "metadata.nmae: unknown field; did you mean name?"


def _annotation_not_a_string(tmp_path):
    text = PPO_TEXT.replace("  name: cartpole-ppo", "  name: cartpole-ppo\n  annotations: {a: {b: 1}}")
    return _write(tmp_path, text), "metadata.annotations.a: Input should be a valid string"


def _duplicate_key(tmp_path):
    return _write(tmp_path, PPO_TEXT.replace("    lr: 3.0e-3", "    lr: 3.0e-3\n    lr: 5")), \
        "spec.algorithm.lr: duplicate key 'lr'"


def _billion_laughs(tmp_path):
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    text = PPO_TEXT.replace("  name: cartpole-ppo", "  name: cartpole-ppo\n  annotations:\n" +
                            "\n".join("    " + line for line in lines))
    return _write(tmp_path, text), "metadata.annotations.a4[0]: aliases expand to more than 10000 values"


def _alias_bomb_in_env_id(tmp_path):
    levels = ["&a0 [" + ", ".join(["lol"] * 9) + "]"]
    levels += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    return _write(tmp_path, PPO_TEXT.replace("id: CartPole-v1", "id: [" + ", ".join(levels) + "]")), \
        "spec.env.id[4][0]: aliases expand to more than 10000 values"


def _deep_nesting(tmp_path):
    return (_write(tmp_path, "spec: " + "[" * 10000 + "]" * 10000 + "\n"),
            "spec[0][0][0][0][0][0][0][0][0]...: nested deeper than 32 levels")


def _huge_file(tmp_path):
    return _write(tmp_path, PPO_TEXT + "#" * (2 << 20) + "\n"), "2.0 MiB, larger than 1024 KiB"


def _fifty_megabytes(tmp_path):
    with open(tmp_path / "job.yaml", "w") as f:  # a valid manifest, then comments: only its size is wrong
        f.write(PPO_TEXT)
        f.write(("#" * 1023 + "\n") * (50 << 10))
    return [str(tmp_path / "job.yaml")], "50.0 MiB, larger than 1024 KiB"


def _mean_return_nan(tmp_path):
    return _write(tmp_path, PPO_TEXT.replace("meanReturn: 475", "meanReturn: .nan")), \
        "spec.stop.meanReturn: non-finite number '.nan'"


def _lr_nan(tmp_path):
    return _write(tmp_path, PPO_TEXT.replace("lr: 3.0e-3", "lr: .NaN")), "spec.algorithm.lr: non-finite number '.NaN'"


def _lr_overflowing_to_inf(tmp_path):
    return _write(tmp_path, PPO_TEXT.replace("lr: 3.0e-3", "lr: 1e999")), "spec.algorithm.lr: non-finite number '1e999'"


def _seed_1e30(tmp_path):
    return _write(tmp_path, PPO_TEXT.replace("seed: 1", "seed: 1.0e+30")), "spec.env.seed: "


def _seed_past_31_bits(tmp_path):
    return _write(tmp_path, PPO_TEXT.replace("seed: 1", f"seed: {2**40}")), "spec.env.seed: Input should be less"


def _unknown_env(tmp_path):
    return _write(tmp_path, PPO_TEXT.replace("CartPole-v1", "NoSuchEnv-v9")), \
        "spec.env.id: 'NoSuchEnv-v9' is not a registered Gymnasium environment"


def _dqn_continuous_env(tmp_path):
    text = (EXAMPLES / "cartpole-dqn.yaml").read_text().replace("CartPole-v1", "Pendulum-v1")
    return _write(tmp_path, text), ("spec.algorithm.name: dqn needs a Discrete action space, but 'Pendulum-v1' "
                                    "has a continuous one, Box(low=[-2.0], high=[2.0], shape=[1])")


def _set_recursive_alias(tmp_path):
    return [str(EXAMPLES / "cartpole-ppo.yaml"), "--set", "spec.model.hidden=&a [64, *a]"], \
        "--set spec.model.hidden[1]: *a refers to its own anchor"


def _set_nan(tmp_path):
    return ([str(EXAMPLES / "cartpole-ppo.yaml"), "--set", "spec.stop.meanReturn=.inf"],
            "--set spec.stop.meanReturn: non-finite number '.inf'")


def _set_duplicate(tmp_path):
    return [str(EXAMPLES / "cartpole-ppo.yaml"), "--set", "spec.model={hidden: [8], hidden: [9]}"], \
        "--set spec.model.hidden: duplicate key 'hidden'"


@pytest.mark.parametrize("make", [_top_level_typo, _metadata_unknown_key, _annotation_not_a_string, _duplicate_key,
                                  _billion_laughs, _alias_bomb_in_env_id, _deep_nesting, _huge_file, _fifty_megabytes,
                                  _mean_return_nan, _lr_nan, _lr_overflowing_to_inf, _seed_1e30,
                                  _seed_past_31_bits, _unknown_env, _dqn_continuous_env, _set_recursive_alias, _set_nan,
                                  _set_duplicate], ids=lambda f: f.__name__.strip("_"))
def test_tianji_run_refuses_hostile_manifests_quickly_in_one_line(tmp_path, make):
    import time

    args, says = make(tmp_path)
    t0 = time.monotonic()
    message = refuse_locally(tmp_path, *args)
    assert time.monotonic() - t0 < 5 + 3  # < 5 s on an idle machine; some slack for interpreter start-up
    assert says in message, message
    if not args[0].startswith(str(EXAMPLES)):
        assert message.startswith(f"{args[0]}: {says}"), message  # the file, then the field


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_max_seconds_must_be_positive(tmp_path, value):
    run_dir = tmp_path / "run"
    r = run_tianji("run", str(EXAMPLES / "cartpole-ppo.yaml"), "--run-dir", str(run_dir), "--quiet",
                   "--max-seconds", value, timeout=60)
    assert r.returncode == 2 and "--max-seconds must be a positive" in r.stderr, r.stderr
    assert not run_dir.exists()


def test_metadata_labels_and_annotations_are_string_maps():
    from tianji.control.spec import SpecError, parse_job

    job = job_manifest("cartpole", {})
    job["metadata"].update(labels={"team": "rl"}, annotations={"note": "x"})
    assert parse_job(job).metadata.labels == {"team": "rl"}
    job["metadata"]["labels"] = {"team": ["rl"]}
    with pytest.raises(SpecError, match="metadata.labels.team"):
        parse_job(job)


# ----------------------------------------------------------------- the operator's own validation (issue 25)
# The operator gets JSON from the apiserver: no aliases (kubectl expands them, with its own alias
# limit), no duplicate keys (a decoded map), no NaN (JSON has none). What the CRD schema lets
# through (free-form maps, an older looser CRD, a client that sends what it likes) is refused by
# the operator's validation function naming the field, in the words `tianji run` uses.
def _laughs(levels: int) -> list:
    lol = ["lol"] * 9
    for _ in range(levels):
        lol = [lol] * 9  # shared, as an expanded alias bomb is: cheap to build, large as JSON
    return lol


def _nested(depth: int) -> list:
    v: list = [1]
    for _ in range(depth):
        v = [v]
    return v


OPERATOR_CASES = {
    "lr-nan": ({"algorithm": {"name": "ppo", "lr": float("nan")}},
               "spec.algorithm.lr: Input should be a finite number"),
    "mean-return-inf": ({"stop": {"meanReturn": float("inf")}},
                        "spec.stop.meanReturn: Input should be a finite number"),
    "kwargs-nan": ({"env": {"kwargs": {"scale": [1.0, float("nan")]}}},
                   "spec.env.kwargs.scale[1]: nan is not a finite number"),
    "env-id-an-expanded-bomb": ({"env": {"id": _laughs(3)}}, "spec.env.id: Input should be a valid string"),
    "kwargs-an-expanded-bomb": ({"env": {"kwargs": {"layout": _laughs(5)}}},
                                "spec.env.kwargs.layout: the spec is 3"),  # 9^6 strings: 3.x MiB of JSON
    "kwargs-nested-deep": ({"env": {"kwargs": {"grid": _nested(12)}}},
                           "spec.env.kwargs.grid[0][0][0][0][0][0][0][0]: nested deeper than 8 levels"),
    "model-config-not-plain-data": ({"model": {"config": {"w": {"x": [1, {2: 3}]}}}},
                                    "spec.model.config.w.x[1]: key 2 is not a string"),
}


@pytest.mark.parametrize("case", OPERATOR_CASES)
def test_the_operators_validation_names_the_field(case):
    import time

    from tianji_operator.context import InvalidSpec, checked_job

    spec, says = OPERATOR_CASES[case]
    t0 = time.monotonic()
    with pytest.raises(InvalidSpec) as e:
        checked_job({"metadata": {"name": "cartpole", "namespace": "default"}, "spec": spec})
    assert time.monotonic() - t0 < 5  # a guard against expanding or walking the bomb slowly, not a benchmark
    assert str(e.value).startswith(says) and "\n" not in str(e.value), e.value


def test_the_operators_validation_passes_a_good_spec_through():
    from tianji_operator.context import checked_job

    spec = yaml.safe_load(PPO_TEXT)["spec"]
    job = checked_job({"metadata": {"name": "cartpole-ppo", "namespace": "default"}, "spec": spec})
    assert job.spec.algorithm.lr == 3e-3 and job.spec.stop.mean_return == 475
