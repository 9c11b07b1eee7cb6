"""`python -m localcluster` (what `make cluster-up`/`cluster-down` run) picks the cluster the
same way for every command: --index, else TIANJI_CLUSTER_INDEX, else 0. `down` with the variable
set must stop that cluster, never cluster 0; a bad index is refused, not wrapped to another.
`up --node-kind real` makes the layout the tests' TianJi jobs run on."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from localcluster import realnode
from localcluster.__main__ import cluster_of, parse_args

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", ["up", "down", "status"])
def test_every_command_takes_the_index_from_the_environment(command):
    assert parse_args([command], {"TIANJI_CLUSTER_INDEX": "7"}).index == 7


def test_flag_wins_over_the_environment_and_default_is_zero():
    assert parse_args(["down", "--index=3"], {"TIANJI_CLUSTER_INDEX": "7"}).index == 3
    assert parse_args(["down"], {}).index == 0
    assert parse_args(["down"], {"TIANJI_CLUSTER_INDEX": " "}).index == 0


@pytest.mark.parametrize("bad", ["16", "-1", "two"])
def test_bad_index_is_refused_from_flag_and_environment(bad, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["down", f"--index={bad}"], {})
    assert e.value.code == 2
    with pytest.raises(SystemExit):
        parse_args(["down"], {"TIANJI_CLUSTER_INDEX": bad})
    assert "TIANJI_CLUSTER_INDEX" in capsys.readouterr().err


@pytest.mark.parametrize("how", ["argument", "environment"])
@pytest.mark.parametrize("target", ["cluster-down", "cluster-up"])
def test_make_targets_pass_the_index(target, how):
    """`make -n` prints the recipe: the index reaches the CLI whichever way it was given."""
    env_args = ["TIANJI_CLUSTER_INDEX=5"]
    cmd = ["make", "-n", "-o", "install", "-o", "cluster", target]
    if how == "argument":
        cmd += env_args
        env = None
    else:
        env = {**os.environ, "TIANJI_CLUSTER_INDEX": "5"}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.splitlines() if "-m localcluster" in x)
    assert "--index=5" in line


def test_real_nodes_come_tainted_beside_a_process_mode_node_for_the_operator(tmp_path):
    c = cluster_of(parse_args(["up", "--node-kind=real", "--nodes=2"], {}), tmp_path)
    assert [(n.name, n.real, n.taints) for n in c.nodes] == [
        ("node-1", False, ()), ("node-2", True, (realnode.TAINT,)), ("node-3", True, (realnode.TAINT,))]
    assert all(n.labels == {realnode.KIND_LABEL: "real"} for n in c.real_nodes)
    assert realnode.WORKER_DEFAULTS["tolerations"][0]["key"] == realnode.TAINT.split("=")[0]
    plain = cluster_of(parse_args(["up", "--nodes=3"], {}), tmp_path)
    assert [(n.real, n.taints) for n in plain.nodes] == [(False, ())] * 3
