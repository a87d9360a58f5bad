"""Measuring one batch size of a sweep in a fresh process: `measure_in_process(...)` gives the function
`analysis.batch_plan.sweep` calls for each size; it runs `python -m gpudoctor.runner.batch` and returns
the point that process wrote (or why there is none: a timeout, a crash)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Measure = Callable[[int], dict[str, Any]]


def measure_in_process(
    target: str, args: list[str], *, module: bool, timeout_s: float, child_args: Sequence[str] = ()
) -> Measure:
    """A `Measure` that runs each size in a fresh `python -m gpudoctor.runner.batch`."""

    def measure(batch: int) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="gpudoctor-sweep-") as tmp:
            result = Path(tmp) / "point.json"
            cmd = [
                sys.executable,
                "-m",
                "gpudoctor.runner.batch",
                "--batch",
                str(batch),
                "--result",
                str(result),
            ]
            cmd += [*child_args, *(["-m"] if module else []), "--", target, *args]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
            try:
                done = subprocess.run(
                    cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False
                )
            except subprocess.TimeoutExpired:
                return {"batch": batch, "status": "error", "error": f"timed out after {timeout_s:.0f} s"}
            if not result.is_file():
                tail = (done.stderr or done.stdout or "").strip().splitlines()[-1:] or ["no output"]
                return {"batch": batch, "status": "error", "error": f"exit {done.returncode}: {tail[0]}"}
            return json.loads(result.read_text())

    return measure
