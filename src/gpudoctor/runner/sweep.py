"""Measuring one batch size of a sweep in a fresh process: `measure_in_process(...)` gives the function
`analysis.batch_plan.sweep` calls for each size; it runs `python -m gpudoctor.runner.batch` through the
child protocol (`runner.child`) and returns the point that process wrote (or why there is none: a
timeout, a crash)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpudoctor.runner.child import run_child

Measure = Callable[[int], dict[str, Any]]


def measure_in_process(
    target: str, args: list[str], *, module: bool, timeout_s: float, child_args: Sequence[str] = ()
) -> Measure:
    """A `Measure` that runs each size in a fresh `python -m gpudoctor.runner.batch`."""

    def measure(batch: int) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="gpudoctor-sweep-") as tmp:
            result, log = Path(tmp) / "point.json", Path(tmp) / "point.log"
            argv = ["--batch", str(batch), "--result", str(result), *child_args, *(["-m"] if module else []),
                    "--", target, *args]  # fmt: skip
            run = run_child("gpudoctor.runner.batch", argv, result=result, log=log, timeout_s=timeout_s)
            if run.timed_out:
                return {"batch": batch, "status": "error", "error": f"timed out after {timeout_s:.0f} s"}
            if run.result is None:
                tail = run.log_tail.strip().splitlines()[-1:] or ["no output"]
                return {"batch": batch, "status": "error", "error": f"exit {run.exit_code}: {tail[0]}"}
            if run.result.get("status") == "no_steps" and not run.result.get("error"):
                # the script ended before a step (an argparse error, an exit): what it said last is why
                tail = run.log_tail.strip().splitlines()[-1:] or ["no output"]
                return {**run.result, "error": f"no step was timed; its last output: {tail[0]}"}
            return run.result

    return measure
