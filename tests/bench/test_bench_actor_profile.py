"""bench/actor_profile.py: a `RUNTIME:PRECISION` mode profiles the actor at that actorPrecision."""
import pytest

from bench import actor_profile
from helpers import EXAMPLES
from tianji.algos import int8

pytest.importorskip("ale_py.vector_env")


@pytest.mark.parametrize("mode, precision", [("torch:float32", "float32"), ("torch:bfloat16", "bfloat16"),
                                             ("torch:int8", "int8")])
def test_a_mode_sets_the_runtime_and_the_actor_precision(mode, precision):
    point = actor_profile.profile(str(EXAMPLES / "pong-dqn.yaml"), ["spec.env.fragmentLength=4"], 2, 4, mode)
    assert (point["inference"], point["actor_precision"]) == ("torch", precision)
    assert point["loop_us"] > 0 and point["env_step_us"] > 0
    # a new version's cost to the acting copy: none for the model itself
    assert (point["policy_sync_us"] is None) == (precision == "float32")
    # side by side: env steps and fragments in alternation, as many rounds as the loop's fragments
    assert point["side_by_side_rounds"] == 2
    assert point["ratio_side_by_side"] == pytest.approx(
        point["side_by_side_env_step_us"] / point["side_by_side_loop_us"], abs=2e-3)


def test_a_plain_runtime_profiles_what_auto_picks():
    point = actor_profile.profile(str(EXAMPLES / "pong-dqn.yaml"), ["spec.env.fragmentLength=4"], 2, 4, "torch")
    assert point["actor_precision"] == ("int8" if int8.ops() is not None and int8.vnni() else "float32")
