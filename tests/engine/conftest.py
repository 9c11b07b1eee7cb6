"""Fixtures of the engine tier's launcher-level tests (a Launcher object, no processes)."""
from __future__ import annotations

import pytest

from helpers import EXAMPLES
from tianji.control.spec import load_job
from tianji.local import launcher as L


@pytest.fixture
def launcher(tmp_path):
    """The launcher of examples/cartpole-ppo.yaml, not started."""
    return L.Launcher(load_job(EXAMPLES / "cartpole-ppo.yaml"), tmp_path / "run", progress=False)
