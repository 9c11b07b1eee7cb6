"""The planner's model for one shared machine (`tianji run`), where processes are not limited to
their requests: co-located actors and learners take turns (costmodel.host_turns), and each
phase gets a max-min fair share of the cores. `tianji plan` prints it beside the plan;
bench/scaling.py and bench/planner_validation.py check it against real runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from tianji.control.planner import costmodel
from tianji.control.planner.placement import one_host_links
from tianji.control.planner.prediction import Shape, predict
from tianji.control.planner.profile import Profile
from tianji.control.spec import TianJiJob

if TYPE_CHECKING:
    from tianji.control.planner.plan import Plan

_EPS = 1e-9


def _threads(cpu: float) -> int:
    return max(1, int(cpu + _EPS))


def predict_on_host(
    job: TianJiJob, profile: Profile, cores: float, background: float = 0.0, learner_threads: Optional[int] = None
) -> dict:
    """The model for the job's own topology on one machine of `cores`. Co-located actors and
    learners take turns, and so do synchronised groups (costmodel.host_turns): per batch the
    actors' phase and the learner's phase add up, over the g groups, T = max(g·(T_A + T_learn),
    T_C). Averaging groups (groupSync average) run side by side instead: T = max(T_A + T_learn,
    T_C), with all g groups' processes sharing each phase (measured 2026-11-24: 2 averaging
    groups produced 1.5× one group on 2 cores, where turns would give 1×). Each phase gets a
    max-min fair share of the `cores` (costmodel.max_min_shares) beside `background` busy
    processes of other work and the buffers' busy share:

        actor phase:    n_a actors of a group (demand 1 core each)  -> share a of a core each
        learner phase:  n_l learners of a group (demand t threads),
                        beside the actors' busy share                -> share l each

    The actors keep producing during the learner's phase (paced, for the next batch): their busy
    share (production over their per-core rate) competes there too (costmodel.host_turns).
    A buffer's capacity (for T_C) is the share it would get busy (demand 1) in those phases.
    A learner given l of its t threads runs at s_L(t)·l/t. Returns prediction.predict's dict
    plus the shares used (actor_share, learner_share: per process within its phase)."""
    s = job.spec
    t = s.topology
    g, na, nb, nl = t.groups, t.actors, t.buffers, t.learners
    threads = learner_threads or s.resources.learner.threads or _threads(s.resources.learner.cpu)
    full = costmodel.learner_sps(profile.learner_sps_per_core, profile.learner_thread_scaling, threads)[0]
    bg = max(0.0, background)
    # Synchronised groups take turns with each other (one group's processes per phase, g turns);
    # averaging groups never wait for each other, so they run side by side: every group's
    # processes share each phase (all in the same phase: the contended case), one turn each.
    side_by_side = g > 1 and t.group_sync.mode == "average"
    k, turns = (g, 1) if side_by_side else (1, g)
    links = one_host_links(job, profile)
    d_b, d_a = 0.1, 0.0
    pred: dict = {}
    for _ in range(5):  # the buffers' and actors' shares depend on the rates: a few rounds reach the fixed point
        sa, sb, sl = costmodel.host_turns(cores, k * na, k * nb, k * nl, float(threads), d_b, bg, d_a)
        cb = costmodel.host_turns(cores, k * na, k * nb, k * nl, float(threads), 1.0, bg, d_a)[1]  # were it busy
        shape = Shape(g, na, nb, nl, 1.0, max(cb, _EPS), float(threads), 0)
        pred = predict(
            job, profile, shape, links, actor_share=sa, learner_rate_sps=full * min(1.0, sl / threads), turns=turns
        )
        msgs = (pred["produced_fps"] + pred["consumed_sps"]) / profile.fragment_samples / (g * nb)
        d_b = min(1.0, max(0.05, msgs * profile.message_seconds))
        d_a = min(1.0, pred["produced_fps"] / (g * na) / profile.actor_fps_per_core)  # each actor's busy cores
    pred.update(
        {
            "actor_share": sa,
            "buffer_share": sb,
            "learner_share": sl,
            "host_cores": cores,
            "background": bg,
            "group_sync": t.group_sync.mode,
        }
    )
    return pred


def plan_on_host(job: TianJiJob, p: Plan, profile: Profile, cores: float, background: float = 0.0) -> dict:
    """predict_on_host for the planned topology `p` (what `tianji run` starts on one machine of
    `cores`), with the job's groupSync: the figures `tianji plan` shows beside the plan's own."""
    from tianji.control.planner.plan import planned_job

    return predict_on_host(planned_job(job, p), profile, cores, background, learner_threads=p.learner.threads)


def predict_with_shares(
    job: TianJiJob,
    profile: Profile,
    actor_share: float,
    buffer_share: float,
    learner_share: float,
    learner_threads: int = 1,
) -> dict:
    """The model given the CPU each process was measured to get (cores, per process of the role):
    separates the cost model from the scheduler's split on a host with unknown other load.
    (A paced actor that keeps pace uses share·f_a = headroom·capacity/r: then T_A < T_L and
    the kind is training-bound, as it should be.)"""
    t = job.spec.topology
    full = costmodel.learner_sps(profile.learner_sps_per_core, profile.learner_thread_scaling, learner_threads)[0]
    shape = Shape(t.groups, t.actors, t.buffers, t.learners, 1.0, max(buffer_share, _EPS), float(learner_threads), 0)
    return predict(
        job,
        profile,
        shape,
        one_host_links(job, profile),
        actor_share=actor_share,
        learner_rate_sps=full * min(1.0, learner_share / learner_threads),
    )
