"""`tianji --version`: the installed package's version, the one pyproject.toml declares."""
import re

from helpers import ROOT, run_tianji


def test_tianji_version_prints_the_package_version():
    declared = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    r = run_tianji("--version", timeout=60)
    assert r.returncode == 0 and r.stdout == f"tianji {declared}\n", (r.stdout, r.stderr)
