"""`gpudoctor analyze` imports only what reading and judging a trace needs: its start is most of what a
user waits for on a small trace. One process runs the command under `python -X importtime` and the
modules it loaded are checked against what the analyze path must never pull in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRACE = REPO / "tests" / "fixtures" / "traces" / "sync_every_step_stack.json.gz"

# What runs a user's script, samples a GPU or applies fixes, and the heavy libraries only those need.
NEVER = (
    "torch",
    "pydantic",  # typer >= 0.29 coerces every option through it (pyproject pins typer below it)
    "gpudoctor.runner.capture",
    "gpudoctor.runner.memory",
    "gpudoctor.runner.steps",
    "gpudoctor.runner.torchrun",
    "gpudoctor.monitor",  # a run's NVML samples: no trace holds them
    "gpudoctor.doctor.run",
    "gpudoctor.doctor.notebook",
    "gpudoctor.doctor.combine",
    "gpudoctor.fixes",
    "gpudoctor.timing",
    "gpudoctor.report.html",  # the terminal report needs no HTML
    "concurrent.futures.process",  # one trace is analyzed without a process pool
    # a plain `analyze` command line takes the fast path (cli.fast): no typer, click or other command
    "typer",
    "click",
    "gpudoctor.cli.app",
    "gpudoctor.cli.common",
    "gpudoctor.cli.analyze",
    "gpudoctor.cli.bench",
    "gpudoctor.cli.fix",
    "gpudoctor.cli.run",
    "gpudoctor.cli.report",
    "gpudoctor.cli.monitor",
)


def imported_modules(stderr: str) -> list[str]:
    """The module names of `-X importtime` lines ("import time: self | cumulative | name")."""
    names = []
    for line in stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            name = line.rsplit("|", 1)[1].strip()
            if name != "imported package":
                names.append(name)
    return names


def test_imported_modules_parses_the_importtime_lines() -> None:
    lines = (
        "import time: self [us] | cumulative | imported package\n"
        "import time:       120 |        120 |   gpudoctor.util.errors\n"
        "import time:        80 |        200 | gpudoctor.util\n"
        "a line of the command's own\n"
    )
    assert imported_modules(lines) == ["gpudoctor.util.errors", "gpudoctor.util"]


def test_analyze_loads_no_runner_monitor_fixes_or_torch() -> None:
    """The whole command, as a user runs it: parse, load, analyze, diagnose, print the report."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gpudoctor", "analyze", str(TRACE)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Diagnosis" in out.stdout  # the report was printed: the render path's imports are in
    loaded = imported_modules(out.stderr)
    assert "gpudoctor.trace.load" in loaded and "gpudoctor.rules.registry" in loaded
    pulled = sorted(m for m in loaded if any(m == n or m.startswith(n + ".") for n in NEVER))
    assert pulled == [], f"the analyze path imports {pulled}: import them where they are used"
