"""`make images` finds a base and a torch index this machine can reach, and says which it used:
Docker Hub's python base, else the one `make image-base` makes from Debian's packages; PyTorch's
CPU index, else the configured pip index. Run against a fake engine and a fake python3 on PATH
(no build, no network)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

IMAGES = Path(__file__).resolve().parents[2] / "images"
LOCAL_BASE = "localhost/tianji-base:bookworm-py3.11"

ENGINE = """#!/bin/sh
echo "$0 $*" >> "$FAKE_LOG"
case "$1" in
  inspect|image) for a in "$@"; do [ "$a" = "$LOCAL_BASE_HERE" ] && exit 0; done; exit 1 ;;
  pull) [ -n "$HUB" ] && exit 0; exit 1 ;;
  info) exit 0 ;;
esac
exit 0
"""
PYTHON = """#!/bin/sh
case "$*" in *urlopen*) [ -n "$TORCH_INDEX_ANSWERS" ] && exit 0; exit 1 ;; esac
exit 1
"""


def build(tmp_path: Path, engine: str, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    for name, text in ((engine, ENGINE), ("python3", PYTHON)):
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    for tool in ("dirname", "sh", "cat"):
        if not (bin_ / tool).exists():
            (bin_ / tool).symlink_to(f"/usr/bin/{tool}" if os.path.exists(f"/usr/bin/{tool}") else f"/bin/{tool}")
    log = tmp_path / "engine.log"
    r = subprocess.run(["/bin/sh", str(IMAGES / "build.sh")], capture_output=True, text=True,
                       env={"PATH": str(bin_), "FAKE_LOG": str(log), "ENGINE": engine, **env})
    return r, (log.read_text().splitlines() if log.exists() else [])


def builds(calls: list[str]) -> list[str]:
    return [c for c in calls if " build " in c]


def test_without_docker_hub_or_pytorchs_index_it_uses_the_local_base_and_the_pip_index(tmp_path):
    r, calls = build(tmp_path, "buildah", LOCAL_BASE_HERE=LOCAL_BASE, PIP_INDEX_URL="https://pypi.example/simple")
    assert r.returncode == 0, r.stderr
    assert f"base image {LOCAL_BASE} (Docker Hub unreachable; made earlier by make image-base)" in r.stderr
    assert ("torch from https://pypi.example/simple (PyTorch's CPU index unreachable; the configured pip index"
            in r.stderr), r.stderr
    worker, = [c for c in builds(calls) if "worker.Dockerfile" in c and " -f " in c]
    assert f"BASE_IMAGE={LOCAL_BASE}" in worker and "TORCH_INDEX_URL=https://pypi.example/simple" in worker
    assert all(f"BASE_IMAGE={LOCAL_BASE}" in c for c in builds(calls))


def test_with_docker_hub_and_pytorchs_index_the_dockerfiles_defaults_stand(tmp_path):
    r, calls = build(tmp_path, "docker", HUB="1", TORCH_INDEX_ANSWERS="1")
    assert r.returncode == 0, r.stderr
    assert "base image python:3.11-slim-bookworm (Docker Hub)" in r.stderr
    assert "torch from https://download.pytorch.org/whl/cpu (PyTorch's CPU index)" in r.stderr
    assert len(builds(calls)) == 2 and not any("BASE_IMAGE=" in c or "TORCH_INDEX_URL=" in c for c in builds(calls))


@pytest.mark.parametrize("setting", [{"BASE_IMAGE": "registry.example/py:3.11"}])
def test_a_base_given_is_used_as_it_is(tmp_path, setting):
    r, calls = build(tmp_path, "docker", TORCH_INDEX_URL="https://idx.example/cpu", **setting)
    assert r.returncode == 0 and "base image registry.example/py:3.11 (BASE_IMAGE)" in r.stderr, r.stderr
    assert not any(" pull " in c for c in calls)


def test_no_base_to_be_had_is_said_and_fails(tmp_path):
    r, calls = build(tmp_path, "docker")
    assert r.returncode == 1 and not builds(calls), r.stderr
    assert "no base image: python:3.11-slim-bookworm cannot be pulled" in r.stderr and "set BASE_IMAGE" in r.stderr
