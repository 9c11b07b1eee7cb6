"""The learner's idle time, which pacing's starved rule reads (runtime/pacing.py): the time it waits
for a batch counts whether or not a batch comes within one poll. A DQN learner whose batches came
every 70 ms, each after a 35 ms wait, counted none of it (the poll is 50 ms): its actors stayed
paced at the minimum headroom with the learner half idle."""
import time

import pytest

from helpers import EXAMPLES
from tianji.control.contracts.addressing import Addresses
from tianji.control.spec import load_job
from tianji.runtime import security
from tianji.runtime.roles.learner import Learner


class _Socket:
    """A batch socket whose next batch comes `delay` s into the poll (never, past the timeout)."""

    def __init__(self, delay: float):
        self.delay = delay

    def poll(self, timeout: int = 0) -> bool:
        if timeout == 0:
            return False
        time.sleep(min(self.delay, timeout / 1000))
        return self.delay <= timeout / 1000


@pytest.mark.parametrize("delay", [0.03, 0.2])  # a batch within the 50 ms poll, and none
def test_waiting_for_a_batch_is_idle_time(tmp_path, monkeypatch, delay):
    job = load_job(EXAMPLES / "cartpole-dqn.yaml")
    rings = security.issue(["learner-0-0", "buffer-0-0", "actor-0-0"])
    security.write_keyring(tmp_path / "learner.json", rings["learner-0-0"])
    monkeypatch.setenv("TIANJI_CURVE_KEYS", str(tmp_path / "learner.json"))
    learner = Learner(job, 0, 0, Addresses(job.name, run_dir=tmp_path), run_dir=str(tmp_path))
    learner.setup()
    real = learner.batch_in
    try:
        learner.batch_in = _Socket(delay)
        learner.last_refresh = learner.last_ckpt_t = time.monotonic() + 60  # no refresh, no checkpoint
        learner.step()
        idle = learner.window["idle"]
        assert min(delay, 0.05) * 0.9 <= idle <= min(delay, 0.05) + 0.05
    finally:
        learner.batch_in = real
        learner.teardown()
        learner.ctx.destroy(linger=0)
