"""`python -m localcluster` (what `make cluster-up`/`cluster-down` run) picks the cluster the
same way for every command: --index, else TIANJI_CLUSTER_INDEX, else 0. `down` with the variable
set must stop that cluster, never cluster 0; a bad index is refused, not wrapped to another."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from localcluster.__main__ import parse_args

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
