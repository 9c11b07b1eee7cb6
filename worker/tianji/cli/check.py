"""`tianji check JOB.yaml`: everything `tianji run` checks before it starts a process, without
running anything: the spec, and every entry point the job names imported and built against the
env's spaces (tianji.local.preflight).

The operator cannot make this check (its image has neither torch nor the user's packages), so
for a Kubernetes job it is run where the worker image's packages are: on the machine the image
is built from, or in the image itself. It prints the env's spaces in the form `spec.env.spaces`
takes, which a Kubernetes job with a user env declares.
"""
from __future__ import annotations

import argparse
import json

from tianji.control.spec import load_job


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="TianJiJob manifest (YAML)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")


def check_command(a: argparse.Namespace) -> int:
    from tianji.envs import spaces_of
    from tianji.local.preflight import check_entry_points

    job = load_job(a.job, a.set)  # SpecError: one line, exit 2 (tianji.cli)
    info = check_entry_points(job, a.job)
    spaces = spaces_of(info).model_dump(mode="json", exclude_none=True)
    model = job.spec.model.entry_point or f"built-in ({job.spec.algorithm.name})"
    print(f"{a.job}: ok: env {job.spec.env.id} and model {model} built against the env's spaces")
    print(f"  spaces: {json.dumps(spaces)}  # spec.env.spaces, as a Kubernetes job with a user env declares them")
    return 0
