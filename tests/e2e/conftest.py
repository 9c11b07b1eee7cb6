"""Real-cluster end-to-end tests: run only with `--e2e` (`make e2e`).

`make test` collects tests/ without the flag, so every test here is skipped with a
message saying how to run it. With `--e2e` and no reachable cluster (and no kind to
make one), the cluster fixture skips with the reason.
"""
from __future__ import annotations

import pytest

SKIP_REASON = ("real-cluster end-to-end test: run `make e2e` (pytest tests/e2e --e2e) with a cluster "
               "in the current kubeconfig, or with kind installed")


# `--e2e` itself is registered in tests/conftest.py (a root conftest loads early enough for
# `pytest tests --e2e` as well as `pytest tests/e2e --e2e`).


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: needs a real Kubernetes cluster; runs only with --e2e")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # getoption with a default: when pytest starts from the repository root this conftest is
    # loaded late (tests/e2e is not an initial path) and the option may not be parsed.
    if config.getoption("--e2e", default=False):
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if item.get_closest_marker("e2e") is not None:
            item.add_marker(skip)
