"""`tianji run`'s check before any process starts: every entry point the job names is imported
and constructed against the env's spaces, as the workers will.

    spec.env.id, env.imports, env.kwargs,   imported; one env made and wrapped; its spaces checked
    env.wrappers[i].entryPoint              against the algorithm (tianji.envs.check_env_spec)
    spec.model.entryPoint                   imported and built as every worker builds it (same seed,
                                            the env's spaces, spec.model.config), then one forward
                                            pass on zeros (tianji.algos.usermodel)

A failure is a SpecError of one line naming the file, the field and the exception, so `tianji run`
exits 2 with nothing started. The operator cannot run this check: its image has neither torch nor
the user's packages (they are in the worker image). It refuses what the spec alone shows (an entry
point that is not `module:attribute`, a model module outside the listed packages, a user env
without declared spaces); whatever only the import shows, each pod's log names the same way.
"""
from __future__ import annotations

import sys
from collections.abc import Callable

from tianji.control.spec import SpecError, TianJiJob
from tianji.envs import EnvInfo, check_env_spec


def note_on_stderr(text: str) -> None:
    print(f"tianji: note: {text}", file=sys.stderr)


def check_entry_points(job: TianJiJob, source: str, note: Callable[[str], None] = note_on_stderr) -> EnvInfo:
    """The env's spaces, once the env (with its wrappers) and the model have been built here.
    Raises SpecError naming `source` and the field."""
    info = check_env_spec(job.spec.env, source, job.spec.algorithm.name, note=note)
    if job.spec.model.entry_point:
        check_model(job, info, source)
    return info


def check_model(job: TianJiJob, info: EnvInfo, source: str) -> None:
    """Build the user's model as a worker does; torch is imported only for a user model (the
    built-in ones are the package's own and need no check)."""
    import torch

    torch.set_num_threads(1)  # one tiny forward pass; the launcher computes nothing else with torch
    from tianji.algos.models import build_model
    from tianji.envs.custom import UserCodeError

    s = job.spec
    try:
        build_model(s.algorithm, s.model, info, s.env.seed, s.env.imports)
    except UserCodeError as e:  # import, constructor and output-shape failures, already naming the field
        raise SpecError(f"{source}: {e}") from None
    except Exception as e:  # noqa: BLE001 - the user's forward pass, which the contract check runs
        text = str(e).splitlines()[0] if str(e) else ""
        raise SpecError(f"{source}: spec.model.entryPoint: {s.model.entry_point}: a forward pass on zeros "
                        f"failed: {type(e).__name__}{': ' + text if text else ''}") from None
