"""The image tier (`make test-images`, marker `images`): builds both images with buildah (cached:
see imagekit) and runs pods from them with crun. Building the CUDA worker image takes minutes
and gigabytes, so this tier runs only when asked: TIANJI_TEST_IMAGES=1 (make test-images sets
it); `make test` skips it. Missing tools fail the tier once asked (make image-tools)."""
from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from imagekit import buildah, ensure_image

TAGS = {"worker": "localhost/tianji-worker:test", "operator": "localhost/tianji-operator:test",
        "reach-goal": "localhost/reach-goal-worker:test"}
# The user-package path of docs/custom-envs.md: examples/custom-env in the worker image.
REACH_GOAL = {"USER_PACKAGE_DIR": "examples/custom-env", "USER_IMPORTS": "reach_goal reach_goal.models"}


def pytest_configure(config):
    config.addinivalue_line("markers", "images: builds the container images and runs pods from them "
                                       "(tests/images, make test-images)")


def pytest_collection_modifyitems(config, items):
    on = os.environ.get("TIANJI_TEST_IMAGES") == "1"
    for item in items:
        if "tests/images/test_images_" in str(item.fspath):
            item.add_marker(pytest.mark.images)
            if not on:
                item.add_marker(pytest.mark.skip(reason="the image tier: make test-images (TIANJI_TEST_IMAGES=1)"))


@pytest.fixture(scope="session")
def image_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("image-builds")


def _image(name: str, logs: Path, dockerfile: str = "", **settings: str):
    missing = [t for t in ("buildah", "crun", "debootstrap") if shutil.which(t) is None]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: make image-tools")
    built = ensure_image(dockerfile or name, TAGS[name], logs / f"{name}.log", **settings)
    how = "reused (inputs unchanged)" if built.seconds is None else f"built in {built.seconds:.0f} s"
    print(f"\n{TAGS[name]}: {how}")
    return built


@pytest.fixture(scope="session")
def worker_image(image_logs):
    return _image("worker", image_logs)


@pytest.fixture(scope="session")
def reach_goal_image(image_logs):
    return _image("reach-goal", image_logs, "worker", **REACH_GOAL)


@pytest.fixture(scope="session")
def operator_image(image_logs):
    return _image("operator", image_logs)


def _rootfs(tag: str):
    """A working container of the image, mounted: the root filesystem every container shares."""
    name = f"tianji-images-{uuid.uuid4().hex[:8]}"
    buildah("from", "--pull-never", "--name", name, tag)
    try:
        yield buildah("mount", name).stdout.strip()
    finally:
        subprocess.run(["buildah", "rm", name], capture_output=True)


@pytest.fixture(scope="session")
def worker_rootfs(worker_image):
    yield from _rootfs(worker_image.tag)


@pytest.fixture(scope="session")
def reach_goal_rootfs(reach_goal_image):
    yield from _rootfs(reach_goal_image.tag)


@pytest.fixture(scope="session")
def operator_rootfs(operator_image):
    yield from _rootfs(operator_image.tag)
