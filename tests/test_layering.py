"""The import layering of docs/design.md: a lower package never imports a higher one."""

from __future__ import annotations

import ast
import re
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
    "doctor": {"util", "device", "timing", "monitor", "trace", "runner", "analysis", "rules"},
    "fixes": {"util", "timing", "runner", "trace", "analysis", "rules", "doctor"},
    "report": {
        "util",
        "analysis",
        "rules",
        "device",
        "trace",
        "timing",
        "monitor",
        "fixes",
        "doctor",
        "runner",
    },
    "cli": {
        "util",
        "device",
        "timing",
        "monitor",
        "trace",
        "runner",
        "analysis",
        "rules",
        "doctor",
        "fixes",
        "report",
        "workloads",
    },
    "workloads": {"util"},
}
REPO = SRC.parent.parent


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


def _outside_modules() -> list[Path]:
    return sorted(p for folder in ("benchmarks", "tools") for p in (REPO / folder).rglob("*.py"))


@pytest.mark.parametrize("module", _outside_modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_benchmarks_and_tools_import_the_library_never_the_cli(module: Path) -> None:
    assert "cli" not in gpudoctor_imports(module), f"{module.relative_to(REPO)} imports gpudoctor.cli"


def test_nothing_imports_the_cli_but_main() -> None:
    importers = sorted(
        str(m.relative_to(SRC))
        for m in SRC.rglob("*.py")
        if m.parent.name != "cli" and "cli" in gpudoctor_imports(m)
    )
    assert importers == ["__main__.py"]


def _top_level_imports(path: Path) -> list[int]:
    """Lines that import the `gpudoctor` package itself (`import gpudoctor`, `from gpudoctor import
    step`), not one of its sub-packages."""
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}

    def itself(node: ast.AST) -> bool:
        if isinstance(node, ast.Import):
            return any(a.name == "gpudoctor" for a in node.names)
        if isinstance(node, ast.ImportFrom) and node.module == "gpudoctor" and node.level == 0:
            return any(a.name not in packages for a in node.names)
        return False

    return [node.lineno for node in ast.walk(ast.parse(path.read_text())) if itself(node)]


def test_no_module_of_the_package_imports_the_package_itself() -> None:
    """The package's top level is the composition root of the Python API (it wires `doctor` to
    `report`): a module below importing it would climb over the layers."""
    found = {str(m.relative_to(SRC)): _top_level_imports(m) for m in MODULES}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_top_level_check_catches_a_bare_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import gpudoctor\nfrom gpudoctor import step\nfrom gpudoctor import workloads\n")
    assert _top_level_imports(module) == [1, 2]


def _calls(path: Path, names: set[str]) -> set[str]:
    return {
        node.func.id
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names
    }


def test_the_pipeline_is_put_together_in_one_place() -> None:
    """`analysis.summary.analyze` and `rules.diagnose` are called by `doctor.pipeline` alone: every way
    in (analyze, report, run, the rank pool, fix, notebooks) goes through it."""
    callers = sorted(
        str(m.relative_to(SRC))
        for m in MODULES
        if m.parent.name not in ("analysis", "rules") and _calls(m, {"analyze", "diagnose"})
    )
    assert callers == ["doctor/pipeline.py"]


def test_the_way_from_analyze_to_its_output_never_climbs_back(tmp_path: Path) -> None:
    """The doctor diagnoses a trace with neither `cli` nor `report` loaded: nothing below them calls up."""
    import subprocess
    import sys

    trace = REPO / "tests" / "fixtures" / "traces" / "sync_every_step.json.gz"
    code = (
        "import sys; from gpudoctor.doctor import diagnose_ranks, diagnose_trace\n"
        f"r = diagnose_trace({str(trace)!r}, timeline=True); assert r.diagnosis.findings\n"
        f"diagnose_ranks({str(REPO / 'tests' / 'fixtures' / 'ddp')!r}, engine='serial')\n"
        "print(sorted(m for m in sys.modules if m.startswith(('gpudoctor.cli', 'gpudoctor.report'))))\n"
    )
    env = {"PYTHONPATH": str(SRC.parent), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


# Where a process may be started: the runner's one protocol (runner.child), the fork server inside it,
# the profiler's stderr filter (not the user's script), `gpudoctor monitor -- CMD`, which samples NVML
# while the command it started runs beside it, and the helper that parses part of a large trace file
# (trace.split; no user code).
STARTS_PROCESSES = {
    "runner/child.py", "runner/proflog.py", "fixes/forkserver.py", "cli/monitor_run.py", "trace/split.py"
}  # fmt: skip
PROCESS_START = re.compile(
    r"subprocess\.(?:Popen|run|call|check_call|check_output)\(|os\.(?:system|spawn\w*|exec\w*|fork)\("
)


def test_every_process_for_the_users_script_starts_through_the_runner() -> None:
    starting = {
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if PROCESS_START.search(p.read_text(encoding="utf-8"))
    }
    assert starting <= STARTS_PROCESSES, (
        f"processes started outside runner.child: {starting - STARTS_PROCESSES}"
    )
