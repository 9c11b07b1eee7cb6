"""Optional Weights & Biases logging (`spec.wandb`), from the launcher's records like TensorBoard's.

The package is an optional extra (`pip install 'tianji[wandb]'`), never required: a job that asks
for W&B without it fails before any process starts, saying what to install.
"""
from __future__ import annotations

from pathlib import Path

from tianji.observability.tensorboard import scalars


class WandbMissing(RuntimeError):
    pass


def require_wandb():
    try:
        import wandb
    except ImportError as e:
        raise WandbMissing(f"spec.wandb is set but the wandb package is not importable ({e}); install it with "
                           "`pip install 'tianji[wandb]'` or remove spec.wandb") from None
    return wandb


class WandbRun:
    """One W&B run per launch of a TianJi run (a `--resume` continues the same W&B run id)."""

    def __init__(self, cfg, job_name: str, run_dir: Path, config: dict):
        wandb = require_wandb()
        self.run = wandb.init(project=cfg.project, entity=cfg.entity, group=cfg.group, mode=cfg.mode,
                              name=run_dir.name, id=f"{job_name}-{run_dir.name}"[:64], resume="allow",
                              dir=str(run_dir), config=config)

    def write(self, row: dict) -> None:
        self.run.log(scalars(row), step=int(row.get("env_frames") or 0))

    def close(self) -> None:
        self.run.finish()
