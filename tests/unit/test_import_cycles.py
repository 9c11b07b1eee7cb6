"""No import circle among TianJi's modules: imports inside functions count too (a lazy import
still ties two modules together; it only hides the circle until the function runs)."""
from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (ROOT / "worker" / "tianji", ROOT / "operator" / "tianji_operator")


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in pkg.rglob("*.py"):
            parts = f.relative_to(pkg.parent).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def imported(tree: ast.AST, known: dict) -> set[str]:
    """The known modules a module's import statements name (`from a import b`: a.b if it is one)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                      for a in node.names}
    out = set()
    for n in names:
        while n and n not in known:
            n = n.rpartition(".")[0]
        if n:
            out.add(n)
    return out


def graph(known: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules it imports; a package's own __init__ is not an edge of its modules
    (importing tianji.x.y runs tianji.x first anyway: that is not a circle between them)."""
    return {m: {d for d in imported(ast.parse(f.read_text()), known) if d != m and not m.startswith(d + ".")}
            for m, f in known.items()}


def cycle(g: dict[str, set[str]]):
    try:
        tuple(TopologicalSorter(g).static_order())
    except CycleError as e:
        return e.args[1]
    return None


def test_no_import_circle():
    assert cycle(graph(modules())) is None


def test_the_check_sees_a_circle_through_a_lazy_import():
    known = {"tianji.a": None, "tianji.b": None, "tianji.c": None}
    a = ast.parse("from tianji import b\n")
    b = ast.parse("import tianji.c\n")
    c = ast.parse("def f():\n    from tianji.a import thing\n")
    g = {"tianji.a": imported(a, known), "tianji.b": imported(b, known), "tianji.c": imported(c, known)}
    assert g == {"tianji.a": {"tianji.b"}, "tianji.b": {"tianji.c"}, "tianji.c": {"tianji.a"}}
    assert set(cycle(g)) == {"tianji.a", "tianji.b", "tianji.c"}
