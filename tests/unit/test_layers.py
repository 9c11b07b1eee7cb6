"""The layer rules (pyproject.toml [tool.importlinter], CONTRIBUTING.md) hold on the tree, and
each one bites: a copy of the packages given one import that breaks a contract fails
`lint-imports` for that contract, naming the importing module. An import inside a function
counts as much as one at the top of a module."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]

# contract id -> (module file under the copy, the import that breaks it, the importer lint-imports names)
VIOLATIONS = {
    "control-plane-stack": ("worker/tianji/control/contracts/ports.py", "import torch\n",
                            "tianji.control.contracts.ports"),
    "tianji-layers": ("worker/tianji/envs/seeding.py", "def _late():\n    from tianji.algos import models\n",
                      "tianji.envs.seeding"),
    "control-no-operator": ("worker/tianji/control/spec/base.py", "import kopf\n", "tianji.control.spec.base"),
    "control-layers": ("worker/tianji/control/spec/job.py", "from tianji.control.planner import plan\n",
                       "tianji.control.spec.job"),
    "runtime-below-launchers": ("worker/tianji/runtime/wire.py", "def _late():\n    import tianji.local.launcher\n",
                                "tianji.runtime.wire"),
    "operator-control-only": ("operator/tianji_operator/status.py", "from tianji.runtime import wire\n",
                              "tianji_operator.status"),
    "no-tests-or-bench": ("worker/tianji/runtime/wire.py", "import helpers\n", "tianji.runtime.wire"),
}


def lint_imports(tree: Path, *contracts: str) -> subprocess.CompletedProcess:
    """lint-imports on the packages under `tree` (worker/, operator/) with pyproject.toml's contracts."""
    assert LINT_IMPORTS.exists(), f"{LINT_IMPORTS} is missing: pip install -e '.[test]' installs import-linter"
    # PYTHONPATH puts the copy ahead of the editable install of the real tree.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "worker"), str(tree / "operator")])}
    args = [str(LINT_IMPORTS), "--no-cache", "--no-logo", *(a for c in contracts for a in ("--contract", c))]
    return subprocess.run(args, cwd=tree, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of both packages (clean: test_the_tree_keeps_every_layer_rule), each test breaking one
    file in it and restoring it afterwards."""
    out = tmp_path_factory.mktemp("layers")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "worker" / "tianji", out / "worker" / "tianji", ignore=skip)
    shutil.copytree(ROOT / "operator" / "tianji_operator", out / "operator" / "tianji_operator", ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", out / "pyproject.toml")
    return out


def test_the_tree_keeps_every_layer_rule():
    r = lint_imports(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"Contracts: {len(CONFIG['contracts'])} kept, 0 broken." in r.stdout


def test_every_contract_has_a_violation_below():
    assert {c["id"] for c in CONFIG["contracts"]} == set(VIOLATIONS)


@pytest.mark.parametrize("contract", sorted(VIOLATIONS))
def test_a_deliberate_violation_breaks_its_contract(tree, contract):
    path, line, importer = VIOLATIONS[contract]
    target = tree / path
    original = target.read_text()
    target.write_text(original + "\n\n" + line)
    try:
        r = lint_imports(tree, contract)
    finally:
        target.write_text(original)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "0 kept, 1 broken" in r.stdout and importer in r.stdout, r.stdout


def test_the_shipped_packages_may_import_no_shared_test_helper():
    """Every module tests/ shares through sys.path (tests/conftest.py) is named in the
    no-tests-or-bench contract, so that a new helper cannot slip into the packages unseen."""
    shared = {p.stem for p in (ROOT / "tests").glob("*.py")} | {
        d.name for d in (ROOT / "tests").iterdir() if (d / "__init__.py").exists()}
    (contract,) = [c for c in CONFIG["contracts"] if c["id"] == "no-tests-or-bench"]
    assert shared | {"tests", "bench"} <= set(contract["forbidden_modules"])
