"""OpenMP's wait policy for learners that share cores: side by side, interleaved.

    python -m bench.omp_wait [--seconds 20] [--reps 2] [--out docs/results/omp-wait.json]

CartPole PPO with 2-thread learners on this machine, two topologies: 1 group of 2 actors (the
learner's 2 threads fit 2 cores) and 2 groups of 3 actors (4 learner threads on 2 cores). Each
runs under three arms: `launcher` (OMP_WAIT_POLICY unset: the launcher's rule,
contracts/launch.omp_wait_policy, PASSIVE only where the learners' threads outnumber the
cores), `ACTIVE` and `PASSIVE` (the user's setting, which the launcher keeps). Steady consumed
samples/s per run (bench/scaling.steady_rates), the arms interleaved per repetition.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from bench.harness import ROOT, emit, host, run_job, stamp
from bench.scaling import steady_rates

JOB = ROOT / "examples" / "cartpole-ppo.yaml"
TOPOLOGIES = {"1 group x 2 actors": ["spec.topology.groups=1", "spec.topology.actors=2"],
              "2 groups x 3 actors": ["spec.topology.groups=2", "spec.topology.actors=3"]}
ARMS = {"launcher": None, "ACTIVE": "ACTIVE", "PASSIVE": "PASSIVE"}
COMMON = ["spec.env.numEnvs=4", "spec.resources.learner.cpu=2", "spec.resources.learner.threads=2",
          "spec.stop.meanReturn=null", "spec.stop.envFrames=null"]


def one(sets: list[str], policy: str | None, seconds: float) -> dict:
    """One run; `policy` None leaves OMP_WAIT_POLICY unset (the launcher decides)."""
    saved = os.environ.pop("OMP_WAIT_POLICY", None)
    try:
        with tempfile.TemporaryDirectory(prefix="tianji-omp-") as tmp:
            run = Path(tmp) / "run"
            p = run_job(JOB, [*COMMON, *sets, f"spec.stop.seconds={seconds}"], run, timeout=seconds + 120,
                        env={"OMP_WAIT_POLICY": policy} if policy else None)
            rates = steady_rates(run) if (run / "metrics.jsonl").exists() else {}
    finally:
        if saved is not None:
            os.environ["OMP_WAIT_POLICY"] = saved
    return {"rc": p.returncode, "consumed_sps": round(rates["consumed_sps"], 1) if rates else None}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    runs = []
    for rep in range(a.reps):
        for topo, sets in TOPOLOGIES.items():
            for arm, policy in ARMS.items():
                r = {"rep": rep, "topology": topo, "arm": arm, "load1_before": round(os.getloadavg()[0], 2),
                     **one(sets, policy, a.seconds)}
                print(r, flush=True)
                runs.append(r)
    summary = {topo: {arm: statistics.median([r["consumed_sps"] for r in runs if r["topology"] == topo
                                              and r["arm"] == arm and r["consumed_sps"] is not None] or [0])
                      for arm in ARMS} for topo in TOPOLOGIES}
    emit({"bench": "omp-wait", **stamp("omp_wait", argv), "host": host(), "seconds": a.seconds,
          "runs": runs, "median_consumed_sps": summary}, a.out)


if __name__ == "__main__":
    main()
