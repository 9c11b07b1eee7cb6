"""Job specs: bad input fails fast, naming the file and the field path."""
from pathlib import Path

import pytest

from helpers import EXAMPLES, run_tianji
from tianji.control.spec import SpecError, StopConfig, dump_job, load_job, stop_problem

GOOD = """\
apiVersion: tianji.dev/v1alpha1
kind: TianJiJob
metadata: {name: t}
spec:
  algorithm: {name: ppo, lr: 0.001}
  topology: {actors: 2}
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "job.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("example", sorted(str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.yaml")))
def test_examples_are_valid(example):
    job = load_job(EXAMPLES / example)
    assert stop_problem(job.spec.stop) is None  # each one ends by itself under `tianji run`


def test_a_manifest_without_kind_is_refused_naming_it(tmp_path):
    p = write(tmp_path, GOOD.replace("kind: TianJiJob\n", ""))
    with pytest.raises(SpecError, match=rf"^{p}: kind: missing: a TianJiJob manifest starts with "
                                        r"`apiVersion: tianji.dev/v1alpha1` and `kind: TianJiJob`$"):
        load_job(p)
    with pytest.raises(SpecError, match=rf"^{p}: kind: expected TianJiJob, got 'Job'$"):
        load_job(write(tmp_path, GOOD.replace("kind: TianJiJob", "kind: Job")))


def test_a_stop_rule_must_be_able_to_end_a_local_run():
    """`stop: {}` (or none) trains forever under `tianji run`: refused, unless --max-seconds caps it.
    A Kubernetes job may have none (it runs until deleted, suspended or its activeDeadlineSeconds)."""
    assert "spec.stop: no stop rule" in stop_problem(StopConfig())
    assert stop_problem(StopConfig(), max_seconds=60) is None
    for rule in ({"meanReturn": 475}, {"envFrames": 10_000}, {"seconds": 30}):
        assert stop_problem(StopConfig(**rule)) is None


@pytest.mark.parametrize("stop", ["  stop: {}\n", ""])
def test_tianji_run_refuses_a_job_that_would_never_end(tmp_path, stop):
    p = write(tmp_path, GOOD + stop)
    r = run_tianji("run", str(p), "--run-dir", str(tmp_path / "run"), "--quiet", timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr == (f"tianji: invalid job spec: {p}: spec.stop: no stop rule, so the run would never end: set "
                        "meanReturn, envFrames or seconds (or give `tianji run --max-seconds`)\n")
    assert not (tmp_path / "run").exists()


def test_wrong_type_names_file_and_field(tmp_path):
    p = write(tmp_path, GOOD.replace("lr: 0.001", "lr: fast"))
    with pytest.raises(SpecError) as e:
        load_job(p)
    assert str(p) in str(e.value) and "spec.algorithm.lr" in str(e.value)


def test_unknown_field_is_an_error(tmp_path):
    p = write(tmp_path, GOOD.replace("actors: 2", "actors: 2, actorz: 3"))
    with pytest.raises(SpecError, match=r"spec\.topology\.actorz"):
        load_job(p)


def test_impossible_values(tmp_path):
    with pytest.raises(SpecError, match=r"spec\.topology"):
        load_job(write(tmp_path, GOOD.replace("actors: 2", "actors: 1, buffers: 2")))
    with pytest.raises(SpecError, match=r"spec\.env\.numEnvs"):
        load_job(write(tmp_path, GOOD + "  env: {numEnvs: 0}\n"))
    with pytest.raises(SpecError, match=r"metadata\.name"):
        load_job(write(tmp_path, GOOD.replace("name: t", "name: Bad_Name")))


def test_overrides_go_through_validation(tmp_path):
    p = write(tmp_path, GOOD)
    job = load_job(p, ["spec.algorithm.lr=3e-4", "spec.topology.actors=3"])
    assert job.spec.algorithm.lr == pytest.approx(3e-4) and job.spec.topology.actors == 3
    with pytest.raises(SpecError, match=r"spec\.algorithm\.lr"):
        load_job(p, ["spec.algorithm.lr=-1"])
    with pytest.raises(SpecError, match="KEY=VALUE"):
        load_job(p, ["spec.algorithm.lr"])


def test_topology_auto_shorthand(tmp_path):
    job = load_job(write(tmp_path, GOOD.replace("topology: {actors: 2}", "topology: auto")))
    assert job.spec.topology.auto


def test_cli_fails_fast_before_starting_anything(tmp_path):
    p = write(tmp_path, GOOD.replace("lr: 0.001", "lr: -5"))
    r = run_tianji("run", str(p), "--run-dir", str(tmp_path / "run"), timeout=60)
    assert r.returncode == 2
    assert "spec.algorithm.lr" in r.stderr and str(p) in r.stderr
    assert not (tmp_path / "run").exists()


def test_retired_ratio_band_is_accepted_and_dropped(tmp_path):
    """Run dirs, checkpoints and ConfigMaps written before `staleness.ratioBand` went away still load."""
    job = load_job(write(tmp_path, GOOD + "  staleness: {ratioBand: 0.2, maxPolicyLag: 3}\n"))
    assert job.spec.staleness.max_policy_lag == 3
    assert "ratioBand" not in dump_job(job)
