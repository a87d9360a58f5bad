"""No import circles between gpudoctor's modules, beside the layering of tests/test_layering.py: a
module that imports another, at any depth of its code (inside functions and under TYPE_CHECKING too),
is an edge, and no set of modules may reach each other — but the one circle the NVML backend's lazy
factory makes on purpose (the backend opens the NVML module that implements it, on first use)."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterable
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "gpudoctor"

ALLOWED_CIRCLES = [
    {
        "gpudoctor.monitor.backend",
        "gpudoctor.monitor.gpm",
        "gpudoctor.monitor.nvml",
        "gpudoctor.monitor.nvml_calls",
    }
]


def module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST, modules: set[str]) -> set[str]:
    """The package's modules this code imports: `from a.b import c` is a.b.c where that is a module,
    else a.b; a package's own __init__ only where it is named."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    return found & modules


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    files = {module_name(p, src): p for p in src.rglob("*.py")}
    modules = set(files)
    return {name: imported(ast.parse(p.read_text(), str(p)), modules) - {name} for name, p in files.items()}


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)
    return found


def test_no_import_circle_but_the_nvml_backends() -> None:
    found = circles(import_graph())
    new = [sorted(c) for c in found if c not in ALLOWED_CIRCLES]
    assert not new, f"import circles (break them: move what both need below both): {new}"


def test_a_circle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    # GIVEN a package whose a imports b at the top and b imports a inside a function (hidden at import)
    package = tmp_path / "gpudoctor"
    (package / "doctor").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "doctor" / "__init__.py").write_text("")
    (package / "doctor" / "a.py").write_text("from gpudoctor.doctor.b import g\n")
    (package / "doctor" / "b.py").write_text("def g():\n    from gpudoctor.doctor import a\n")
    (package / "doctor" / "c.py").write_text("from gpudoctor.doctor import a\n")
    # WHEN its graph is searched THEN a and b form the one circle (c only reaches into it)
    assert circles(import_graph(package)) == [{"gpudoctor.doctor.a", "gpudoctor.doctor.b"}]


def test_a_type_checking_import_counts(tmp_path: Path) -> None:
    package = tmp_path / "gpudoctor"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpudoctor.b import B\n"
    )
    (package / "b.py").write_text("from gpudoctor.a import f\n")
    assert circles(import_graph(package)) == [{"gpudoctor.a", "gpudoctor.b"}]


def test_lazily_exported_names_resolve() -> None:
    """The packages that export their names on first use (so that importing one module of theirs loads
    no other): every name in __all__ is in the table, and each resolves to what its module defines."""
    for name in ("gpudoctor.doctor", "gpudoctor.monitor"):
        package = importlib.import_module(name)
        table = package._EXPORTS
        assert sorted(package.__all__) == sorted(table), name
        for attr, module in table.items():
            assert getattr(package, attr) is getattr(importlib.import_module(module), attr)
