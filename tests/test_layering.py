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
