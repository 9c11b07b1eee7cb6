"""What the image builds rely on, checked without building (the image tier builds them:
tests/images, make test-images): the worker Dockerfile's exact compileall command passes over
this venv's packages (the image installs the same pins) and skips only files this Python cannot
parse; every COPY source exists and its .dockerignore lets it in."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from chart_support import IMAGES, ROOT

COPY = re.compile(r"^COPY\s+(?!--from)(.+?)\s+(\S+)\s*$", re.M)


def _compileall_commands(name: str) -> list[list[str]]:
    text = (IMAGES / f"{name}.Dockerfile").read_text()
    return [shlex.split(m) for m in re.findall(r"(python -m compileall [^;\\\n]+)", text)]


def test_the_worker_compileall_command_passes_over_the_pinned_packages(tmp_path):
    cmds = _compileall_commands("worker")
    assert len(cmds) == 2 and cmds[0] == cmds[1], cmds  # after TianJi, and after a user package
    cmd = cmds[0]
    assert cmd[-1] == "/opt/venv" and "-x" in cmd, cmd
    skip = re.compile(cmd[cmd.index("-x") + 1])
    site = Path(sysconfig.get_paths()["purelib"])
    # Exactly the files Python 3.11 cannot parse are skipped: each one skipped fails to compile.
    skipped = [p for p in site.rglob("*.py") if skip.search(str(p))]
    assert [p.relative_to(site).as_posix() for p in skipped] == ["torch/testing/_internal/py312_intrinsics.py"]
    if sys.version_info < (3, 12):
        with pytest.raises(SyntaxError):
            compile(skipped[0].read_bytes(), str(skipped[0]), "exec")
    # The command itself, on this venv's packages; bytecode goes to a cache of its own (reruns are
    # quick; the shared venv stays untouched).
    prefix = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tianji" / "pyc-check"
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(prefix)}
    argv = [sys.executable, *cmd[1:-1], "-j0", str(site)]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]


def _let_in(name: str, path: str) -> bool:
    """Does images/NAME.Dockerfile.dockerignore (`*`, then `!allowed`, then exclusions) send `path`?"""
    lines = [ln.strip() for ln in (IMAGES / f"{name}.Dockerfile.dockerignore").read_text().splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    allowed = [ln[1:].rstrip("/") for ln in lines if ln.startswith("!")]
    return any(path == a or path.startswith(a + "/") for a in allowed)


@pytest.mark.parametrize("name", ["worker", "operator"])
def test_copy_sources_exist_and_reach_the_build(name):
    text = (IMAGES / f"{name}.Dockerfile").read_text()
    sources = [s for srcs, _dst in COPY.findall(text) for s in srcs.split()]
    assert "pyproject.toml" in sources and "worker" in sources
    for src in sources:
        assert (ROOT / src).exists(), f"{name}.Dockerfile copies {src}, which the repository lacks"
        assert _let_in(name, src), f"{name}.Dockerfile copies {src}, which its .dockerignore leaves out"


def test_build_script_names_what_is_missing(tmp_path):
    """No Docker engine and no buildah: `make images` says so and fails, it does not pass silently."""
    (tmp_path / "dirname").symlink_to("/usr/bin/dirname")
    r = subprocess.run(["/bin/sh", str(IMAGES / "build.sh")], env={"PATH": str(tmp_path)},
                       capture_output=True, text=True)
    assert r.returncode == 1 and "no Docker engine answers" in r.stderr and "make image-tools" in r.stderr, r
    r = subprocess.run(["/bin/sh", str(IMAGES / "build.sh")], env={"PATH": str(tmp_path), "ENGINE": "podman"},
                       capture_output=True, text=True)
    assert r.returncode == 2 and "ENGINE must be docker or buildah" in r.stderr, r
    for script in ("build.sh", "local-base.sh"):
        assert os.access(IMAGES / script, os.X_OK), script
