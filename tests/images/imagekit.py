"""Build the images once and reuse them: an image is rebuilt only when the hash of what goes
into it changed (its Dockerfile, .dockerignore, the files that .dockerignore lets in, the
build script, the build arguments and the base image's id). The hash is stored as the
image's label `dev.tianji.inputs`, so the cache is buildah's own storage.

Builds go through images/build.sh with buildah (no daemon; these machines have no Docker
engine). With no registry the base is made from Debian's packages by images/local-base.sh."""
from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
LABEL = "dev.tianji.inputs"
LOCAL_BASE = "localhost/tianji-base:bookworm-py3.11"


def buildah(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["buildah", *args], capture_output=True, text=True, check=check)


def image_config(tag: str) -> Optional[dict]:
    """The image's OCI config (Env, Entrypoint, User, WorkingDir, Labels), or None if absent."""
    r = buildah("inspect", "--type", "image", tag, check=False)
    if r.returncode != 0:
        return None
    return json.loads(r.stdout)["OCIv1"]["config"]


def image_id(tag: str) -> str:
    return json.loads(buildah("inspect", "--type", "image", tag).stdout)["FromImageID"]


def _context_files(name: str) -> list[Path]:
    """The files the build context sends for images/NAME.Dockerfile: its .dockerignore is
    `*`, then `!path` lines (allowed), then exclusion globs (**/__pycache__, ...)."""
    lines = [ln.strip() for ln in (IMAGES / f"{name}.Dockerfile.dockerignore").read_text().splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    allowed = [ln[1:].rstrip("/") for ln in lines if ln.startswith("!")]
    excluded = [ln.removeprefix("**/") for ln in lines if not ln.startswith("!") and ln != "*"]
    out = []
    for entry in allowed:
        path = ROOT / entry
        for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
            rel = f.relative_to(ROOT)
            if f.is_file() and not any(fnmatch.fnmatch(part, pat) for part in rel.parts for pat in excluded):
                out.append(f)
    return out


def _package_files(directory: str) -> list[Path]:
    """A user package's source files (USER_PACKAGE_DIR), without build leftovers."""
    junk = ("__pycache__", "build", "dist")
    return [f for f in sorted((ROOT / directory).rglob("*")) if f.is_file() and not f.suffix == ".pyc"
            and not any(p in junk or p.endswith(".egg-info") for p in f.relative_to(ROOT).parts)]


def inputs_hash(name: str, build_env: dict[str, str]) -> str:
    h = hashlib.sha256()
    package = _package_files(build_env["USER_PACKAGE_DIR"]) if build_env.get("USER_PACKAGE_DIR") else []
    for f in [IMAGES / f"{name}.Dockerfile", IMAGES / f"{name}.Dockerfile.dockerignore", IMAGES / "build.sh",
              *_context_files(name), *package]:
        h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    h.update(json.dumps(sorted(build_env.items())).encode())
    return h.hexdigest()[:32]


@dataclass
class Built:
    tag: str
    config: dict
    seconds: Optional[float]  # None: reused (inputs unchanged)


def ensure_base() -> str:
    """BASE_IMAGE from the environment, else the local debootstrap base (made once)."""
    base = os.environ.get("BASE_IMAGE")
    if base:
        return base
    if image_config(LOCAL_BASE) is None:
        subprocess.run([str(IMAGES / "local-base.sh"), LOCAL_BASE], check=True)
    return LOCAL_BASE


def ensure_image(name: str, tag: str, log: Path, **settings: str) -> Built:
    """`tag` built from images/NAME.Dockerfile, unless an image of that tag has the same inputs.
    `settings`: more of images/build.sh's variables (USER_PACKAGE_DIR, USER_IMPORTS)."""
    base = ensure_base()
    build_env = {"BASE_IMAGE": base, "BASE_ID": image_id(base), **settings}
    for var in ("TORCH_INDEX_URL", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST"):
        if os.environ.get(var):
            build_env[var] = os.environ[var]
    digest = inputs_hash(name, build_env)
    cfg = image_config(tag)
    if cfg is not None and (cfg.get("Labels") or {}).get(LABEL) == digest:
        return Built(tag, cfg, None)
    old_id = image_id(tag) if cfg is not None else ""
    env = {**os.environ, **build_env, "ENGINE": "buildah", "ONLY": name, f"{name.upper()}_TAG": tag,
           "BUILD_FLAGS": f"--label {LABEL}={digest}"}
    env.pop("BASE_ID")
    t0 = time.monotonic()
    with open(log, "wb") as out:
        r = subprocess.run(["nice", "-n", "10", str(IMAGES / "build.sh")], env=env, stdout=out,
                           stderr=subprocess.STDOUT)
    assert r.returncode == 0, f"building {tag} failed (exit {r.returncode}); log: {log}\n" + log.read_text()[-3000:]
    if cfg is not None and old_id != image_id(tag):  # the replaced image: 5 GB of storage for a worker
        buildah("rmi", old_id, check=False)  # (refused, and kept, while another tag names it)
    return Built(tag, image_config(tag), time.monotonic() - t0)
