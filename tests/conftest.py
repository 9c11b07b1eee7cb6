import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def pytest_addoption(parser):
    # Registered here (the root conftest) so `pytest tests --e2e` works too.
    parser.addoption("--e2e", action="store_true", default=False,
                     help="run the real-cluster end-to-end tests (needs a reachable cluster)")
