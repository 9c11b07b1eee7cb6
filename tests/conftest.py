import contextlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))  # localcluster

from helpers import TianjiRun  # noqa: E402  (needs the path above)


def pytest_addoption(parser):
    # Registered here (the root conftest) so `pytest tests --e2e` works too.
    parser.addoption("--e2e", action="store_true", default=False,
                     help="run the real-cluster end-to-end tests (needs a reachable cluster)")


@pytest.fixture
async def kube():
    """The Kubernetes API emulator with the TianJiJob CRD (validating) and the test namespace."""
    from kube.operator_harness import start_cluster

    async with contextlib.AsyncExitStack() as stack:
        yield await start_cluster(stack)


@pytest.fixture
def running_tianji(tmp_path):
    """Start `tianji run` as a user would: `start(JOB, *args)` -> TianjiRun (run dir tmp_path/run).

    Whatever the test does, teardown kills the launcher's process group, reaps it and fails
    if any of its workers outlived it."""
    runs: list[TianjiRun] = []

    def start(job: str, *args: str, run_dir: Path | None = None, export_keys: bool = True) -> TianjiRun:
        run = TianjiRun.start(job, *args, run_dir=run_dir or tmp_path / "run", log=tmp_path / f"tianji-{len(runs)}.out",
                              export_keys=export_keys)
        runs.append(run)
        return run

    yield start
    leftovers = [pid for run in runs for pid in run.stop()]
    assert not leftovers, f"worker processes outlived `tianji run`: {leftovers} (killed now)"
