"""The test tree's module names are unique across its folders.

pytest imports each tests/ folder's modules by basename (prepend import mode, no packages), so two
folders holding test_x.py stop the whole collection with "import file mismatch": one clash fails
every tier of `make test`, not just the two files.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SPECIAL = {"conftest.py", "__init__.py"}


def test_module_basenames_are_unique_across_test_folders() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("*.py"):
        rel = path.relative_to(TESTS)
        if path.name in SPECIAL or "fixtures" in rel.parts or "__pycache__" in rel.parts:
            continue
        seen[path.name].append(str(rel))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"rename one of each: {clashes}"
    assert "test_test_layout.py" in seen  # the walk saw this very file
