"""The container images: multi-stage, slim and non-root; the worker image pins the torch the
project pins; images/constraints.txt pins every dependency; the slim operator image installs
every distribution the operator imports (and no torch)."""
from __future__ import annotations

import importlib.metadata as md
import json
import re
import subprocess
import sys

import pytest

from chart_support import IMAGES, ROOT, default_values
from helpers import operator_image_requirements  # noqa: E402


def _dockerfile(name: str) -> str:
    return (IMAGES / f"{name}.Dockerfile").read_text()


def _arg_default(text: str, arg: str) -> str:
    m = re.search(rf"^ARG {arg}=(\S+)$", text, re.M)
    assert m, f"ARG {arg}=... missing"
    return m.group(1)


def _pyproject_torch() -> str:
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch,) = [d for d in deps if re.match(r"torch\b", d)]
    return torch.split("==")[1]


@pytest.mark.parametrize("name", ["worker", "operator"])
def test_images_are_multistage_slim_and_non_root(name):
    text = _dockerfile(name)
    froms = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M | re.I)
    assert len(froms) >= 2 and froms[-1][1] == "runtime", froms
    assert _arg_default(text, "BASE_IMAGE").startswith("python:3.11-slim")
    assert "COPY --from=build /opt/venv /opt/venv" in text
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and all(u.split(":")[0] not in ("0", "root") for u in users)
    uid = int(users[-1].split(":")[0])
    assert uid > 0
    assert default_values()["runAsUser"] == uid or name == "worker"
    assert "pip install -c /tmp/constraints.txt" in text
    # The build context is the repository root: everything but the sources stays out (.venv!).
    ignore = [line.strip() for line in (IMAGES / f"{name}.Dockerfile.dockerignore").read_text().splitlines()]
    assert "*" in ignore and not any(line.startswith("!.venv") for line in ignore)


def test_worker_image_pins_cpu_torch_with_a_cuda_option():
    text = _dockerfile("worker")
    assert _arg_default(text, "TORCH_VERSION") == _pyproject_torch() == "2.13.0"
    assert _arg_default(text, "TORCH_INDEX_URL") == "https://download.pytorch.org/whl/cpu"
    assert '"torch==${TORCH_VERSION}"' in text and '--index-url "${TORCH_INDEX_URL}"' in text
    assert re.search(r"^ENTRYPOINT \[\"tianji\"\]$", text, re.M)
    pins = _constraints()
    assert pins["torch"] == _pyproject_torch()


def test_operator_image_entrypoint():
    text = _dockerfile("operator")
    assert re.search(r'^ENTRYPOINT \["python", "-m", "tianji_operator"\]$', text, re.M)
    assert "torch" not in re.sub(r"#.*", "", text)


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _constraints() -> dict[str, str]:
    out = {}
    for line in (IMAGES / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            out[_canon(name)] = version
    return out


def _closure(requirements: list[str]) -> set[str]:
    from packaging.requirements import Requirement

    seen: set[str] = set()
    stack = [Requirement(r) for r in requirements]
    while stack:
        req = stack.pop()
        name = _canon(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            continue
        for r in dist.requires or []:
            r = Requirement(r)
            extras = [""] + sorted(req.extras)
            if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in extras):
                stack.append(r)
    return seen


def test_image_constraints_pin_every_dependency():
    pins = _constraints()
    assert all(re.fullmatch(r"[0-9][0-9A-Za-z.]*", v) for v in pins.values()), pins
    worker = _closure(["tianji"]) - {"tianji"}
    operator = _closure(operator_image_requirements())
    # Platform-conditional packages (nvidia-*, triton) are pinned exactly by torch itself.
    missing = sorted(n for n in (worker | operator) if n not in pins and not n.startswith(("nvidia-", "triton")))
    assert not missing, f"images/constraints.txt does not pin {missing}"


def test_operator_image_installs_everything_the_operator_imports():
    """The operator image installs tianji --no-deps plus operator-requirements.txt. Simulate it:
    import the operator in a subprocess where every third-party distribution outside that set
    is unimportable (optional imports then fall back exactly as they would in the image)."""
    allowed = sorted(_closure(operator_image_requirements()))
    code = r"""
import importlib.abc, importlib.metadata as md, json, re, sys
allowed = set(json.loads(sys.argv[1]))
owners = md.packages_distributions()
blocked = set()
class NotInImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in sys.stdlib_module_names or top in ("tianji", "tianji_operator"):
            return None
        dists = {re.sub(r"[-_.]+", "-", d).lower() for d in owners.get(top, [])}
        if dists and not dists & allowed:
            blocked.add(top)
            raise ModuleNotFoundError(f"No module named {name!r} (not in the operator image)", name=name)
        return None
sys.meta_path.insert(0, NotInImage())
import tianji_operator.__main__, tianji_operator.handlers, tianji_operator.timers.autoscaler, tianji_operator.rbac
tianji_operator.__main__.build_parser().parse_args([])
print(json.dumps({"torch": "torch" in sys.modules, "blocked": sorted(blocked)}))
"""
    res = subprocess.run([sys.executable, "-c", code, json.dumps(allowed)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, f"the operator does not import with only its image's packages:\n{res.stderr[-3000:]}"
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert not out["torch"], "the operator imports torch: its image would need it (see operator.Dockerfile)"


def test_worker_image_installs_a_users_package_under_the_same_pins(tmp_path):
    """USER_PACKAGE goes in after TianJi, constrained (it cannot move torch), its modules imported
    at build time; by default the image installs nothing more. The example package it is shown
    with (examples/custom-env) builds as a wheel."""
    text = _dockerfile("worker")
    for arg in ("USER_PACKAGE", "EXTRA_PIP", "USER_IMPORTS"):
        assert re.search(rf'^ARG {arg}=""$', text, re.M), arg
    assert re.search(r"^FROM scratch AS user_package$", text, re.M)  # the named context it replaces
    install = 'pip install -c /tmp/constraints.txt ${EXTRA_PIP} "${USER_PACKAGE}"'
    assert text.index("pip install -c /tmp/constraints.txt /src") < text.index(install)
    assert 'if [ -n "${USER_PACKAGE}" ]' in text and "importlib.import_module(m)" in text
    assert text.index(install) < text.index("FROM base AS runtime")  # built into the copied venv
    import shutil

    src = shutil.copytree(ROOT / "examples" / "custom-env", tmp_path / "src")  # builds leave files behind
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (wheel,) = tmp_path.glob("reach_goal-0.1.0-*.whl")
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert {"reach_goal/__init__.py", "reach_goal/envs.py", "reach_goal/models.py"} <= set(names)
