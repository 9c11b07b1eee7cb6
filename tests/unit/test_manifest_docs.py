"""docs/manifest.md's field reference is generated from the spec and kept current: every field
the CRD has (itself generated from the same models) is in it, with a type, default and description."""
from __future__ import annotations

import re
from pathlib import Path

from tianji.control.spec.crd import spec_schema
from tianji.control.spec.docs import BEGIN, END, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "manifest.md"


def crd_paths(node: dict, path: str) -> list[str]:
    """Every field path under `node` of the CRD's structural schema (array items as `path[]`)."""
    out = []
    for key, sub in (node.get("properties") or {}).items():
        p = f"{path}.{key}"
        out.append(p)
        if sub.get("type") == "array":
            out += crd_paths(sub.get("items") or {}, p + "[]")
        else:
            out += crd_paths(sub, p)
    return out


def documented() -> dict[str, list[str]]:
    text = DOC.read_text()
    block = text[text.index(BEGIN):text.index(END)]
    rows = [line.split(" | ") for line in block.splitlines() if line.startswith("| `")]
    out = {}
    for r in rows:
        # `spec.algorithm (ppo).lr` documents spec.algorithm.lr; `spec.pods.{all,actor}.env` both overlays' env
        path = re.sub(r" \((ppo|dqn)\)", "", r[0].strip("| `"))
        m = re.search(r"\{([^}]*)\}", path)
        for alt in m.group(1).split(",") if m else [None]:
            out[path if alt is None else path[:m.start()] + alt + path[m.end():]] = r[1:]
    return out


def test_the_reference_is_current():
    assert render(DOC.read_text()) == DOC.read_text(), \
        "docs/manifest.md's field reference is stale: run `python -m tianji.control.spec.docs`"


def test_every_field_of_the_crd_is_documented_with_type_default_and_description():
    rows = documented()
    fields = crd_paths(spec_schema(), "spec")
    missing = [p for p in fields if p not in rows]
    assert not missing, f"not in docs/manifest.md: {missing}"
    for must in ("spec.plan.minMarginalGain", "spec.dependencies", "spec.stop.meanReturn", "metadata.name", "kind"):
        assert must in rows, must
    for path, (kind, default, description) in rows.items():
        assert kind.strip() and default.strip() and description.strip(" |"), (path, kind, default, description)
