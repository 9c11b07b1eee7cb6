"""Learner checkpoints: atomic writes, keep the last K, load the newest good one.

Files are `ckpt-<policy_version:012d>.pt` in `<run_dir>/checkpoints/<group>-<index>/`,
written as temp file + fsync + rename so a crash never leaves a half file under
the final name; a failed write (ENOSPC) removes its temp file, and a learner removes
temp files a killed writer left before it resumes. Loading uses `torch.load(weights_only=True)`: tensors and plain
containers only, never arbitrary unpickling. A newest file that fails to load
is reported and the previous one is tried.
"""
from __future__ import annotations

import logging
import os
import re
import stat
from pathlib import Path
from typing import Any, Optional

import torch

from tianji.runtime.atomicfile import atomic_write

log = logging.getLogger("tianji")
PATTERN = re.compile(r"^ckpt-(\d{12})\.pt$")


def checkpoint_dir(run_dir: str | Path, group: int, index: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"{group}-{index}"


def list_checkpoints(directory: str | Path) -> list[Path]:
    """Checkpoint files, oldest first (by policy version in the name)."""
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted((p for p in d.iterdir() if PATTERN.match(p.name)), key=lambda p: p.name)


def save(directory: str | Path, version: int, state: dict[str, Any], keep: int) -> Path:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    final = d / f"ckpt-{version:012d}.pt"
    atomic_write(final, d / f".tmp-{os.getpid()}-{final.name}", lambda f: torch.save(state, f))
    for old in list_checkpoints(d)[:-keep]:
        old.unlink(missing_ok=True)
    return final


def read_named(directory: Optional[str | Path], name: str) -> Optional[bytes]:
    """The bytes of checkpoint `name` in `directory`, or None: a name that is not exactly
    `ckpt-<12 digits>.pt` (so no path, no `..`), no directory, or no regular file of that name
    (a symbolic link is not followed). What a learner serves at GET /checkpoint/<name>."""
    if directory is None or not PATTERN.fullmatch(name):
        return None
    try:
        fd = os.open(Path(directory) / name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            return f.read()
        except OSError:
            return None


def remove_temp_files(directory: str | Path) -> list[Path]:
    """Remove `.tmp-*` files a killed writer left (a learner calls this before it resumes)."""
    d = Path(directory)
    gone = []
    if d.is_dir():
        for p in d.glob(".tmp-*"):
            p.unlink(missing_ok=True)
            gone.append(p)
    return gone


def load(path: str | Path) -> dict[str, Any]:
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or "model" not in state or "policy_version" not in state:
        raise ValueError(f"{path}: not a TianJi checkpoint")
    return state


def load_latest(directory: str | Path) -> Optional[tuple[Path, dict[str, Any]]]:
    """Newest loadable checkpoint, skipping (and logging) corrupt ones; None if there is none."""
    for p in reversed(list_checkpoints(directory)):
        try:
            return p, load(p)
        except Exception as e:  # truncated zip, bad pickle opcode under weights_only, missing keys
            log.error("checkpoint %s is unreadable (%s: %s); trying the previous one", p, type(e).__name__, e)
    return None
