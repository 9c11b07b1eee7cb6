"""What the README states about the checkout holds: the licence, the Go version the cluster
tier needs, what `make install` may run as root, the Kubernetes quick start's images and
paragraphs that render as paragraphs."""
from __future__ import annotations

import re
import subprocess

import yaml

from helpers import ROOT
from tianji.control.spec import parse_job

README = (ROOT / "README.md").read_text()


def version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def test_the_license_is_apache_2_as_pyproject_and_the_readme_say():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert re.search(r'^license = "Apache-2.0"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert "## License\n\nApache License 2.0: [LICENSE](LICENSE)." in README


def test_every_go_version_the_docs_ask_for_is_the_newest_go_directive():
    """`make cluster` builds every module in cluster/go/ (Prometheus's asks the most)."""
    mods = sorted((ROOT / "cluster" / "go").glob("*/go.mod"))
    wanted = [re.search(r"^go (\S+)$", p.read_text(), re.M).group(1) for p in mods]
    newest = max(wanted, key=version)
    said = {}
    for doc in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "Makefile", *(ROOT / "docs").glob("*.md")]:
        for v in re.findall(r"Go (?:≥|>=) (\d+\.\d+(?:\.\d+)?)", doc.read_text()):
            said.setdefault(v, []).append(doc.name)
    assert "README.md" in said.get(newest, []) and set(said) == {newest}, (newest, said)


def test_the_readme_and_the_testing_guide_give_the_same_install_size():
    readme = re.search(r"([\d.]+) GB\s+installed", README).group(1)
    testing = re.search(r"the whole\s+`\.venv` ([\d.]+) GB", (ROOT / "docs" / "testing.md").read_text()).group(1)
    assert readme == testing, (readme, testing)


def test_the_readme_says_make_install_may_run_apt_get():
    """`make install` is the stamp's recipe: the venv, made with Debian's python3-venv if need be."""
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^install: \$\(STAMP\)$", makefile, re.M)
    recipe = re.search(r"^\$\(STAMP\):.*?(?=^\S)", makefile, re.M | re.S).group(0)
    assert "apt-get install -y python3-venv" in recipe
    said = " ".join(README.split())
    assert "`make install` runs `apt-get update && apt-get install -y python3-venv` first, which needs root" in said


def test_every_picture_stands_apart_and_the_paragraph_after_it_starts_at_the_margin():
    lines, fenced = README.splitlines(), False
    pictures = 0
    for n, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("!["):
            continue
        pictures += 1
        assert lines[n - 1] == "" and lines[n + 1] == "", f"README.md:{n + 1}: a picture inside a paragraph"
        after = next(x for x in lines[n + 1:] if x.strip())
        assert after == after.lstrip(), f"README.md: the paragraph after {line!r} starts with a space: {after!r}"
    assert pictures, "the README's dashboard picture"


def test_the_kubernetes_quick_start_points_the_chart_and_the_job_at_the_pushed_images(tmp_path):
    """Build, push (or load into kind), then helm install and kubectl apply naming those images."""
    block = re.search(r"## Kubernetes quick start\n.*?```bash\n(.*?)```", README, re.S).group(1)
    steps = [line.split()[0] for line in block.splitlines() if line and not line.startswith(" ")]
    assert steps.index("make") < steps.index("for") < steps.index("helm") < steps.index("sed"), steps
    reg = "registry.example.com/ml"
    assert re.search(r"^REG=registry\.example\.com/ml\b", block, re.M)
    chart = yaml.safe_load((ROOT / "charts" / "tianji-operator" / "values.yaml").read_text())
    app = yaml.safe_load((ROOT / "charts" / "tianji-operator" / "Chart.yaml").read_text())["appVersion"]
    assert chart["image"]["repository"] == "tianji-operator"  # what --set image.repository replaces
    assert f"--set image.repository=$REG/tianji-operator --set image.tag={app}" in block
    assert f"kind load docker-image\ntianji-worker:{app} tianji-operator:{app}" in README
    (apply,) = [line for line in block.splitlines() if line.startswith("sed ")]
    command = apply.split(" | kubectl apply")[0]
    out = subprocess.run(["bash", "-c", f"REG={reg}; {command}"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    job = parse_job(yaml.safe_load(out))
    assert job.spec.image == f"{reg}/tianji-worker:{app}"
    assert parse_job(yaml.safe_load((ROOT / "examples" / "cartpole-ppo.yaml").read_text())).spec.image == \
        f"tianji-worker:{app}"  # the tag `make images` builds and `kind load` loads
