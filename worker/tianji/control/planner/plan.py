"""The balance planner (paper §3.3): pure functions, no I/O. Its parts, in the order data flows:

    profile.py     what was measured (`tianji profile`) or assumed (default_profile)
    measured.py    measurements beyond the profile: GPU figures (docs/device), where results lie
    batchcurve.py  frames to target against effective batch: the penalty for more groups
    costmodel.py   cost terms: learner thread curve, all-reduce, links, time to target
    placement.py   which link each kind of traffic crosses on K nodes
    prediction.py  one topology's critical path, throughput, lag, bottleneck, efficiency
    search.py      every topology considered for M cores and G GPUs, each predicted
    objective.py   the budget rule (spec.plan.minMarginalGain) that picks one, and why others lost
    explain.py     what a plan assumes and measured, and why each unused core and GPU stays unused
    plan.py        this file: the Plan, `plan` / `plan_for_job` / `resolve` (entry points)
    sharedhost.py  the same model on one shared machine (`tianji run`)
    rebalance.py   live actor rescaling and pacing from observed rates

Notation (whole job unless said otherwise)
-----------------------------------------
    M            cores the job may use; G GPUs; K nodes of C_n cores each
    g            groups; per group n_a actors, n_b buffers, n_l learners
    c_a, c_b, c_l  cores per actor / buffer / learner process; γ GPUs per learner
    f_a          actor_fps_per_core        (env + inference frames/s per core)
    s_l          learner_sps_per_core      (samples/s per core at the batch size)
    s_g          learner_sps_per_gpu       (samples/s per GPU)
    μ            message_seconds           (send+receive cost of one fragment-sized message)
    F            fragment_samples;  B batch size (samples per learner update)
    r            target replay ratio = consumed / produced (job.spec.replay_ratio;
                 DQN: e.g. 32, PPO: 1 — a fresh sample is consumed about once)

    TR_A = g·n_a·c_a·f_a                          production capacity (frames/s)
    TR_L = g·n_l·(s_L(c_l)  or  γ·s_g)            consumption capacity (samples/s)

The planner solves

    maximise  E / R^x     E = efficiency · consumed (effective progress; time to target ∝ 1/E),
                          R = cores/M + GPUs/G, x = spec.plan.minMarginalGain (objective.py)
    s.t.      g·(n_a·c_a + n_b·c_b + n_l·c_l) ≤ M,   g·n_l·γ ≤ G,
              every process fits on one node (first-fit packing into K nodes),
              n_a ≥ n_b ≥ n_l ≥ 1  (the spec's Topology validator),

i.e. the paper's M_L + M_A = M with production TR_A ≥ TR_L / r (every learner fed), sized no bigger than the
progress it buys pays for. The critical path of one learner update and the bottleneck kinds
are in prediction.py.

Groups grow the effective batch with the learning rate unchanged, charged with the measured
batch curve's frames-to-target ratio ρ(g·n_l) (batchcurve.py, docs/results), so the planner adds
groups only while the progress they buy clears the budget rule; the plan names every figure it
assumes, what it extrapolates (`Plan.extrapolated`), and why each core and GPU it leaves unused
stays so (`Plan.unused`, explain.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Optional

from tianji.control.planner import batchcurve, explain
from tianji.control.planner.objective import choose

# Re-exported: the names the launcher, the operator and the workers import from here.
from tianji.control.planner.prediction import (  # noqa: F401
    COMMUNICATION_BOUND,
    SAMPLE_BOUND,
    TRAINING_BOUND,
    Shape,
)
from tianji.control.planner.profile import Profile, default_profile, load_profile  # noqa: F401
from tianji.control.planner.rebalance import (  # noqa: F401
    GroupThroughput,
    RebalancePolicy,
    actors_for,
    observed_bottleneck,
    pace_fps,
    rebalance,
)
from tianji.control.planner.search import (
    ACTOR_CORES,
    BUFFER_CORES,
    GPU_LEARNER_CORES,
    LEARNER_CORES,
    Budget,
    Candidate,
    candidates,
    predict_shape,
)
from tianji.control.spec import TianJiJob

_EPS = 1e-9


class PlanError(ValueError):
    """Inputs with no feasible plan; the message says which and why."""


@dataclass(frozen=True)
class RolePlan:
    """Per-process request; the same fields as spec.resources.<role>."""

    cpu: float
    memory: str
    gpu: int
    threads: int


@dataclass(frozen=True)
class Plan:
    groups: int
    actors: int  # per group
    buffers: int  # per group
    learners: int  # per group
    actor: RolePlan
    buffer: RolePlan
    learner: RolePlan
    batch_size: int
    produced_fps: float  # predicted, whole job
    consumed_sps: float  # predicted, whole job
    replay_ratio: float  # predicted consumed / produced
    expected_policy_lag: float  # learner versions
    bottleneck: str
    cpus_used: float
    gpus_used: int
    # Critical-path terms of one learner update (seconds), prediction.py.
    sample_seconds: float = 0.0
    train_seconds: float = 0.0  # learner compute
    comm_seconds: float = 0.0  # buffer messages / link, whichever is longer
    allreduce_seconds: float = 0.0  # k all-reduces across the g·n_l learners (average mode: n_l)
    efficiency: float = 1.0  # 1 / (batch penalty ρ · lag cost), costmodel.py
    effective_sps: float = 0.0  # consumed · efficiency: effective progress E ∝ 1/time to target (objective.py)
    learner_threads_measured: int = 1  # the thread curve's range is 1..this
    extrapolated: tuple = ()  # terms predicted beyond what the profile measured
    group_link: str = "loopback"  # the link within a group (placement.py)
    sync_link: str = "loopback"  # the link between groups
    min_marginal_gain: Optional[float] = None  # the budget rule it was chosen by (None: explicit topology)
    runners_up: tuple = ()  # dicts: the plans that lost and why (objective.py)
    # Time to target, the user's goal (costmodel.py): ρ of the batch curve, the lag cost, and in
    # seconds where the job's own curve gives its frames to target (else None).
    frames_ratio: float = 1.0
    lag_cost: float = 1.0
    time_to_target_s: Optional[float] = None
    batch_curve: str = ""  # where ρ comes from (batchcurve.CurveUse.source)
    production_fps: float = 0.0  # TR_A: what the actors can produce (after parameter intake)
    learner_capacity_sps: float = 0.0  # TR_L: what the learners can consume
    cpus_given: float = 0.0  # M and G the plan was made for (explicit topology: its own use)
    gpus_given: int = 0
    assumed: tuple = ()  # figures the plan assumes, each naming why (explain.provenance)
    measured: tuple = ()  # figures it measured, each naming its file
    unused: tuple = ()  # dicts: why each unused core and GPU stays unused (explain.unused)
    lag_floor_seconds: float = 0.0  # the update period the fragments' age imposes, where it binds (prediction)

    def topology(self) -> dict:
        """The counts of spec.topology (camelCase keys alike); planned_job adds groupSync."""
        return {"groups": self.groups, "actors": self.actors, "buffers": self.buffers, "learners": self.learners}

    def to_json(self) -> dict:
        d = asdict(self)
        d["topology"] = self.topology()
        return d


def _threads(cpu: float) -> int:
    return max(1, int(cpu + _EPS))


def make_plan(
    job: TianJiJob, sh: Shape, pred: dict, min_marginal_gain: Optional[float] = None, runners_up: tuple = (), **about
) -> Plan:
    """The Plan of one predicted shape; `about`: the fields on where its figures come from and
    what it leaves unused (cpus_given, gpus_given, assumed, measured, unused, batch_curve)."""
    res = job.spec.resources
    return Plan(
        groups=sh.g,
        actors=sh.na,
        buffers=sh.nb,
        learners=sh.nl,
        actor=RolePlan(sh.ca, res.actor.memory, 0, _threads(sh.ca)),
        buffer=RolePlan(sh.cb, res.buffer.memory, 0, _threads(sh.cb)),
        learner=RolePlan(sh.cl, res.learner.memory, sh.gl, _threads(sh.cl)),
        batch_size=job.spec.algorithm.batch_size,
        produced_fps=pred["produced_fps"],
        consumed_sps=pred["consumed_sps"],
        replay_ratio=pred["replay_ratio"],
        expected_policy_lag=pred["expected_policy_lag"],
        bottleneck=pred["bottleneck"],
        cpus_used=sh.cores,
        gpus_used=sh.gpus,
        sample_seconds=pred["sample_seconds"],
        train_seconds=pred["train_seconds"],
        comm_seconds=pred["comm_seconds"],
        allreduce_seconds=pred["allreduce_seconds"],
        efficiency=pred["efficiency"],
        effective_sps=pred["effective_sps"],
        learner_threads_measured=pred["learner_threads_measured"],
        extrapolated=pred["extrapolated"],
        group_link=pred["group_link"],
        sync_link=pred["sync_link"],
        min_marginal_gain=min_marginal_gain,
        runners_up=runners_up,
        frames_ratio=pred["frames_ratio"],
        lag_cost=pred["lag_cost"],
        time_to_target_s=pred["time_to_target_s"],
        production_fps=pred["tr_a"],
        learner_capacity_sps=pred["tr_l"],
        lag_floor_seconds=pred.get("lag_floor_seconds", 0.0),
        **about,
    )


def planned_job(job: TianJiJob, p: Plan) -> TianJiJob:
    """`job` with the planned topology counts and batch size; everything else of its
    spec.topology (groupSync) kept, so every prediction of the plan sees the job's sync mode."""
    doc = job.to_manifest()
    doc["spec"]["topology"] = {**doc["spec"]["topology"], "auto": False, **p.topology()}
    doc["spec"]["algorithm"]["batchSize"] = p.batch_size
    return kept_dependencies(TianJiJob.model_validate(doc), job)


def kept_dependencies(resolved: TianJiJob, job: TianJiJob) -> TianJiJob:
    """`resolved` running the dependencies `job` resolved to: the plan was made for them (auto is
    relaxed under topology: auto), not for what auto would make of the planned topology. Pinned only
    where the two differ, so that a job that stays `auto` still says so (lagbound.staleness_notes)."""
    if resolved.spec.dependency_mode == job.spec.dependency_mode:
        return resolved
    doc = resolved.to_manifest()
    doc["spec"]["dependencies"] = job.spec.dependency_mode
    return TianJiJob.model_validate(doc)


def _budget(
    job: TianJiJob, p: Profile, cpus: float, gpus: int, nodes: int, cpus_per_node: Optional[float]
) -> tuple[Budget, list[int]]:
    """The usable budget and the GPU modes to search (0: CPU learners; γ: GPU learners);
    PlanError for inputs with no plan (plan's docstring)."""
    if not (isinstance(cpus, (int, float)) and cpus > 0):
        raise PlanError(f"cpus must be > 0 (the total cores M the job may use), got {cpus!r}")
    if gpus < 0:
        raise PlanError(f"gpus must be >= 0, got {gpus}")
    if nodes < 1:
        raise PlanError(f"nodes must be >= 1, got {nodes}")
    if cpus_per_node is not None and not cpus_per_node > 0:
        raise PlanError(f"cpus_per_node must be > 0, got {cpus_per_node!r}")
    cn = float(cpus_per_node) if cpus_per_node is not None else cpus / nodes
    node_gpus = tuple(gpus // nodes + (1 if i < gpus % nodes else 0) for i in range(nodes))
    budget = Budget(min(float(cpus), nodes * cn), gpus, (cn,) * nodes, node_gpus)
    want_gpu = job.spec.resources.learner.gpu
    if want_gpu and gpus == 0:
        raise PlanError(
            f"spec.resources.learner.gpu asks {want_gpu} GPU(s) per learner but no GPUs were given "
            "(pass --gpus, or set resources.learner.gpu: 0)"
        )
    if want_gpu and want_gpu > max(node_gpus):
        raise PlanError(
            f"a learner needs {want_gpu} GPU(s) but a node has at most {max(node_gpus)} "
            f"({gpus} GPU(s) over {nodes} node(s))"
        )
    if want_gpu and p.learner_sps_per_gpu is None:
        raise PlanError(
            "spec.resources.learner.gpu > 0 but the profile has no GPU figure (learner_sps_per_gpu); "
            "profile on a GPU machine or omit --profile"
        )
    a_min, b_min = min(ACTOR_CORES), min(BUFFER_CORES)
    l_min = GPU_LEARNER_CORES if want_gpu else min(LEARNER_CORES)
    if budget.cpus + _EPS < a_min + b_min + l_min:
        raise PlanError(
            f"{budget.cpus:g} cores cannot hold one actor ({a_min:g}) + one buffer ({b_min:g}) + one "
            f"learner ({l_min:g}): need at least {a_min + b_min + l_min:g} cores"
        )
    modes = [want_gpu] if want_gpu else [0] + ([1] if gpus and p.learner_sps_per_gpu is not None else [])
    return budget, modes


def plan(
    job: TianJiJob,
    cpus: float,
    gpus: int = 0,
    nodes: int = 1,
    cpus_per_node: Optional[float] = None,
    profile: Optional[Profile] = None,
    min_marginal_gain: Optional[float] = None,
) -> Plan:
    """Size `job` for M = `cpus` cores and G = `gpus` GPUs (module docstring; objective.py).

    Preconditions (PlanError otherwise): M > 0; G ≥ 0; K = nodes ≥ 1; C_n =
    cpus_per_node > 0 (default M/K; usable cores are min(M, K·C_n)); M holds at
    least one actor + buffer + learner; a spec that asks for γ =
    resources.learner.gpu > 0 GPUs per learner gets G ≥ γ and a profile with a
    GPU figure. GPUs are spread evenly over the nodes. `min_marginal_gain`: the
    budget rule's x (default spec.plan.minMarginalGain).
    """
    p = profile or default_profile(job)
    budget, modes = _budget(job, p, cpus, gpus, nodes, cpus_per_node)
    curve = batchcurve.for_job(job)
    cands = candidates(job, p, budget, modes, curve)
    if not cands:
        raise PlanError(
            f"no topology fits {budget.cpus:g} cores on {nodes} node(s) of {budget.node_cpus[0]:g} cores"
            + (f" with {gpus} GPU(s)" if gpus else "")
        )
    x = job.spec.plan.min_marginal_gain if min_marginal_gain is None else min_marginal_gain
    lag = job.spec.max_policy_lag
    choice = choose(cands, budget.cpus, gpus, x, lag)
    c: Candidate = explain.improve(job, p, choice.chosen, budget, curve, x, lag)
    if c is not choice.chosen:  # a step up the grid missed: the runners-up are judged against it
        choice = choose([*cands, c], budget.cpus, gpus, x, lag)
    assumed, measured = explain.provenance(job, p, curve, gpus, c.gpus)
    return make_plan(
        job,
        c.shape,
        c.pred,
        x,
        choice.runners_up,
        cpus_given=budget.cpus,
        gpus_given=gpus,
        assumed=assumed,
        measured=measured,
        batch_curve=curve.source(),
        unused=explain.unused(job, p, c, cands, budget, curve, x, lag),
    )


DEFAULT_PLAN_CPUS = 2.0  # topology: auto without resources.cpus


def plan_for_job(job: TianJiJob, profile: Optional[Profile] = None) -> Plan:
    """The plan a launcher or the operator uses for `job`.

    topology.auto: plan(job, cpus = resources.cpus or DEFAULT_PLAN_CPUS, gpus, nodes, cpus_per_node).
    Otherwise the explicit topology and per-role requests (resources.actor/buffer/
    learner) are described as a Plan with the same predictions. PlanError if the
    explicit topology has more learners than resources.cpus cores, needs more
    cores than resources.cpus, or more GPUs than resources.gpus (when set), or a
    process larger than resources.cpusPerNode. With spec.evaluation, the evaluator's
    resources.evaluator.cpu is taken off resources.cpus first (auto) or counted in (explicit).
    """
    s = job.spec
    res = s.resources
    # spec.evaluation's evaluator takes resources.evaluator.cpu of the cores, not the planner's to give
    evaluator = res.evaluator.cpu if s.evaluation.enabled else 0.0
    if s.topology.auto:
        cpus = (res.cpus or DEFAULT_PLAN_CPUS) - evaluator
        if cpus <= 0:
            raise PlanError(
                f"resources.evaluator.cpu ({evaluator:g}) leaves no cores of resources.cpus "
                f"({res.cpus or DEFAULT_PLAN_CPUS:g}) for training"
            )
        return plan(job, cpus=cpus, gpus=res.gpus, nodes=res.nodes, cpus_per_node=res.cpus_per_node, profile=profile)
    p = profile or default_profile(job)
    t = s.topology
    sh = Shape(
        t.groups, t.actors, t.buffers, t.learners, res.actor.cpu, res.buffer.cpu, res.learner.cpu, res.learner.gpu
    )
    _check_explicit(sh, res, p, sh.cores + evaluator)
    budget = None
    if res.cpus_per_node is not None:  # node sizes known: groups that fit one node keep loopback
        n = res.nodes
        budget = Budget(
            n * res.cpus_per_node,
            res.gpus,
            (res.cpus_per_node,) * n,
            tuple(res.gpus // n + (1 if i < res.gpus % n else 0) for i in range(n)),
        )
    curve = batchcurve.for_job(job)
    assumed, measured = explain.provenance(job, p, curve, res.gpus, sh.gpus)
    out = make_plan(
        job,
        sh,
        predict_shape(job, p, sh, budget, curve),
        cpus_given=sh.cores + evaluator,
        gpus_given=res.gpus or sh.gpus,
        assumed=assumed,
        measured=measured,
        batch_curve=curve.source(),
    )
    threads = {r: getattr(res, r).threads for r in ("actor", "buffer", "learner")}
    if any(threads.values()):  # keep explicit thread counts from the spec
        out = replace(out, **{r: replace(getattr(out, r), threads=n) for r, n in threads.items() if n})
    return out


def _check_explicit(sh: Shape, res, p: Profile, used: float) -> None:
    if res.cpus is not None:
        if sh.g * sh.nl > res.cpus:
            raise PlanError(
                f"more learners ({sh.g * sh.nl} = {sh.g} groups x {sh.nl}) than cores (resources.cpus = {res.cpus:g})"
            )
        if used > res.cpus + _EPS:
            raise PlanError(f"the topology requests {used:g} cores but resources.cpus is {res.cpus:g}")
    if res.gpus and sh.gpus > res.gpus:
        raise PlanError(f"the topology requests {sh.gpus} GPUs but resources.gpus is {res.gpus}")
    if sh.gl and p.learner_sps_per_gpu is None:
        raise PlanError("resources.learner.gpu > 0 but the profile has no GPU figure (learner_sps_per_gpu)")
    big = max(sh.ca, sh.cb, sh.cl)
    if res.cpus_per_node is not None and big > res.cpus_per_node + _EPS:
        raise PlanError(
            f"a process of {big:g} cores does not fit a node of {res.cpus_per_node:g} (resources.cpusPerNode)"
        )


def resolve(job: TianJiJob, profile: Optional[Profile] = None) -> tuple[TianJiJob, Plan]:
    """The job as it will run, and its plan: the one entry point of both engines.

    Always plans, so an explicit topology is validated exactly like `topology: auto`
    (a manifest `tianji run` accepts is one the operator accepts). The resolved job has
    the planned topology (`auto: false`, groupSync kept), per-role requests and batch size;
    workers read it (run dir job.yaml, or the ConfigMap), so every process agrees on the
    topology. PlanError names the spec field at fault.
    """
    try:
        p = plan_for_job(job, profile)
    except PlanError as e:
        where = "spec.resources" if job.spec.topology.auto else "spec.topology"
        raise PlanError(f"{where}: {e}") from None
    doc = planned_job(job, p).to_manifest()  # `spec` and `spec.resources` always there: defaults are dumped
    for role in ("actor", "buffer", "learner"):
        rp = getattr(p, role)
        doc["spec"]["resources"][role] = {"cpu": rp.cpu, "memory": rp.memory, "gpu": rp.gpu, "threads": rp.threads}
    return TianJiJob.model_validate(doc), p
