"""The control plane is torch-free: `tianji.control` (shared by `tianji run` and the operator)
and the operator's modules import neither the training stack nor numpy, which the operator
image does not install (images/operator-requirements.txt). Each module is imported alone in
a fresh interpreter, so that nothing this test process already imported can hide a culprit."""
from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import pytest

import tianji.control
import tianji_operator
from helpers import operator_image_requirements

TRAINING_STACK = ("torch", "gymnasium", "ale_py")
# numpy is fine only where the operator image installs it.
FORBIDDEN = TRAINING_STACK + (() if "numpy" in operator_image_requirements() else ("numpy",))

CONTROL = sorted(m.name for m in pkgutil.walk_packages(tianji.control.__path__, "tianji.control."))
OPERATOR = sorted(m.name for m in pkgutil.walk_packages(tianji_operator.__path__, "tianji_operator.")
                  if m.name != "tianji_operator.__main__") + ["tianji_operator"]

REPORT = "import importlib, json, sys; importlib.import_module(sys.argv[1]); " \
         "print(json.dumps([m for m in sys.argv[2:] if m in sys.modules]))"


def loaded_by(module: str) -> list[str]:
    """The FORBIDDEN modules in sys.modules after importing `module` in a fresh interpreter."""
    r = subprocess.run([sys.executable, "-c", REPORT, module, *FORBIDDEN], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, f"import {module} failed:\n{r.stderr[-3000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_every_control_module_is_covered():
    assert {"tianji.control.spec", "tianji.control.planner.plan", "tianji.control.spec.crd"} <= set(CONTROL)


@pytest.mark.parametrize("module", CONTROL + OPERATOR)
def test_control_plane_module_imports_no_training_stack(module):
    assert loaded_by(module) == [], f"{module} imports what the operator image lacks"


def test_the_check_sees_a_forbidden_import():
    """The probe itself works: a module that does import torch is caught."""
    assert "torch" in loaded_by("tianji.algos.models")
