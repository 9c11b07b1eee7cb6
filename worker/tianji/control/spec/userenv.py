"""Which jobs run user env code, and what that asks of the spec (torch- and Gymnasium-free:
the operator imports it).

A user env (`env.imports`, an entry-point `env.id`, `env.wrappers`) is imported only where envs are
built (actors, the evaluator, the profiler). Buffers and learners learn its spaces from
`spec.env.spaces`: `tianji run` fills them in from its pre-flight probe; on Kubernetes
the operator cannot import user code, so the manifest must declare them.
"""

from __future__ import annotations

from typing import Optional

from tianji.control.spec import EnvConfig


def is_user_env(env: EnvConfig) -> bool:
    """Env code named by the job (imports, an entry point, wrappers): imported only where envs are built."""
    return bool(env.imports) or ":" in env.id or bool(env.wrappers)


def missing_spaces(env: EnvConfig) -> Optional[str]:
    """Why a role that builds no env cannot learn this env's spaces (None when it can)."""
    if env.spaces is None and is_user_env(env):
        return (
            "spec.env.spaces: a user env (env.imports, an entry-point env.id or env.wrappers) must declare its "
            "spaces: buffers and learners do not import it (tianji run writes them into its run's job.yaml; "
            "docs/custom-envs.md)"
        )
    return None
