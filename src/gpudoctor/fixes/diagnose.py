"""The doctor's diagnosis for `gpudoctor fix`: `gpudoctor run --with-stack` on the script in a fresh
process through the runner's child protocol (`runner.child`: its own process group, a time limit, what
it leaves running ended), so that nothing it loads stays in this one; or a run directory already made.
Read back from the run directory it writes: the findings (`analysis.json`) and the script's command line
(`record.json`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.rules.finding import Diagnosis
from gpudoctor.runner.child import run_child
from gpudoctor.util.errors import UsageError


@dataclass(frozen=True)
class RunInputs:
    diagnosis: Diagnosis | None
    argv: tuple[str, ...]  # the script's command line, as the run recorded it
    note: str | None = None  # why there is no diagnosis


def diagnose_script(
    target: str,
    args: list[str],
    *,
    module: bool,
    out: Path,
    warmup: int,
    light_steps: int,
    steps: int,
    timeout_s: float,
) -> RunInputs:
    """Run `gpudoctor run` on the script into `out` (its output in `out`.log) and read the diagnosis."""
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        "run", "--out", str(out), "--with-stack", "--no-nvml", "--warmup", str(warmup),
        "--light-steps", str(light_steps), "--steps", str(steps), *(["-m"] if module else []), target, *args,
    ]  # fmt: skip
    log = out.with_name(out.name + ".log")
    run = run_child("gpudoctor", argv, result=out / "record.json", log=log, timeout_s=timeout_s)
    if run.timed_out:
        return RunInputs(None, (target, *args), f"the diagnosis run ran past {timeout_s:.0f} s")
    inputs = load_run(out, required=False)
    if inputs.diagnosis is None:
        tail = run.log_tail.strip().splitlines()[-1:]
        note = inputs.note or "no diagnosis"
        return RunInputs(None, (target, *args), note + (f" ({tail[0][:200]})" if tail else ""))
    return RunInputs(inputs.diagnosis, (target, *args))


def load_run(run_dir: Path, *, required: bool = True) -> RunInputs:
    """The diagnosis and command line of a `gpudoctor run` directory."""
    record, analysis = run_dir / "record.json", run_dir / "analysis.json"
    argv: tuple[str, ...] = ()
    if record.exists():
        try:
            argv = tuple(json.loads(record.read_text()).get("argv") or ())
        except (OSError, ValueError) as err:
            raise UsageError(f"{record} cannot be read: {err}") from None
    elif required:
        raise UsageError(f"{run_dir} is not a gpudoctor run directory (no record.json)")
    if not analysis.exists():
        return RunInputs(None, argv, f"{run_dir} has no analysis.json (the run traced no steps)")
    try:
        doc = json.loads(analysis.read_text())
        if doc.get("schema") == "gpudoctor.ranks/1":
            doc = doc["ranks"][0]
        diagnosis = Diagnosis.from_json({k: v for k, v in doc.items() if k != "analysis"})
    except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
        raise UsageError(f"{analysis} cannot be read: {err}") from None
    return RunInputs(diagnosis, argv)
