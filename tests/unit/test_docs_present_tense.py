"""The docs say what TianJi is and does, in the present tense: history (which issue asked for
what, what was fixed, what something used to do) belongs to the commit log, not the docs."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", ROOT / "images" / "README.md", *(ROOT / "docs").glob("*.md")])

# Phrases that narrate a change instead of describing the system.
CHANGELOG = [
    r"\bissue\s*#?\d+", r"\bthe issue's\b", r"\bnow also\b", r"\bbefore this (rule|change|fix)\b",
    r"\bfixed:", r"\bdefect fixed\b", r"\bafter the fix(es)?\b", r"\bno longer\b", r"\bused to (read|be|run)\b",
    r"\bas before\b", r"\bthe old default\b", r"\bis now\b", r"\bnow (has|defaults|models|runs|reports|trains)\b",
]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_read_in_the_present_tense(doc):
    found = []
    for n, line in enumerate(doc.read_text().splitlines(), 1):
        for pattern in CHANGELOG:
            if m := re.search(pattern, line, re.I):
                found.append(f"{doc.relative_to(ROOT)}:{n}: {m.group(0)!r} in: {line.strip()[:120]}")
    assert not found, "\n".join(found)
