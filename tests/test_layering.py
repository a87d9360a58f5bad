"""The import layering of ../shared/DESIGN.md: a lower package never imports a higher one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "gpudoctor"

# package -> the gpudoctor packages it may import (itself always allowed)
ALLOWED: dict[str, set[str]] = {
    "util": set(),
    "device": {"util"},
    "timing": {"util", "device"},
    "monitor": {"util", "device"},
    "trace": {"util", "device"},
    "runner": {"util", "device", "timing", "monitor", "trace"},
    "analysis": {"util", "device", "trace"},
    "rules": {"util", "analysis"},
    "fixes": {"util", "timing", "runner", "trace", "analysis", "rules"},
    "report": {"util", "analysis", "rules", "device", "trace", "timing", "monitor", "fixes"},
    "cli": {
        "util",
        "device",
        "timing",
        "monitor",
        "trace",
        "runner",
        "analysis",
        "rules",
        "fixes",
        "report",
        "workloads",
    },
    "workloads": {"util"},
}


def gpudoctor_imports(path: Path) -> set[str]:
    """The gpudoctor sub-packages a module imports, at any depth of its code."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "gpudoctor" and len(parts) > 1:
                found.add(parts[1])
    return found


MODULES = sorted(p for p in SRC.rglob("*.py") if p.parent != SRC)


def test_every_package_is_in_the_table() -> None:
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(ALLOWED)


@pytest.mark.parametrize("module", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_module_imports_only_lower_packages(module: Path) -> None:
    package = module.relative_to(SRC).parts[0]
    bad = gpudoctor_imports(module) - ALLOWED[package] - {package}
    assert not bad, f"{module.relative_to(SRC)} ({package}) imports {sorted(bad)}"


def test_the_check_catches_a_violation(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from gpudoctor.cli import main\n")
    assert gpudoctor_imports(module) == {"cli"}


def _is_serializer_copy(fn: ast.FunctionDef) -> bool:
    """A `to_json` that only returns `to_jsonable(self)`, or a `from_json` that only checks the schema
    and returns `from_jsonable(cls, data)`: the block `util.serial.Serialized` holds once."""
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if not body or not isinstance(body[-1], ast.Return) or not isinstance(body[-1].value, ast.Call):
        return False
    call = body[-1].value.func
    name = call.id if isinstance(call, ast.Name) else None
    if fn.name == "to_json":
        return len(body) == 1 and name == "to_jsonable"
    if fn.name == "from_json":
        return name == "from_jsonable" and all(isinstance(s, ast.If) for s in body[:-1]) and len(body) <= 2
    return False


def test_no_copy_of_the_serializer_block_remains() -> None:
    copies = []
    for module in SRC.rglob("*.py"):
        if module.name == "serial.py" and module.parent.name == "util":
            continue
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.FunctionDef) and _is_serializer_copy(node):
                copies.append(f"{module.relative_to(SRC)}:{node.lineno} {node.name}")
    assert not copies, f"use util.serial.Serialized: {copies}"


def test_the_serializer_check_catches_a_copy() -> None:
    source = (
        "class A:\n    def to_json(self):\n        return to_jsonable(self)\n"
        "    @classmethod\n    def from_json(cls, data):\n"
        "        if data.get('schema') != SCHEMA:\n            raise UsageError('x')\n"
        "        return from_jsonable(cls, data)\n"
    )
    fns = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)]
    assert [_is_serializer_copy(f) for f in fns] == [True, True]
