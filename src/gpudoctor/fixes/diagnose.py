"""The doctor's diagnosis for `gpudoctor fix`: `gpudoctor run --with-stack` on the script in a fresh
process (so that nothing it loads stays in this one), or a run directory already made; read back as the
findings (`analysis.json`) and the script's command line (`record.json`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.rules.finding import Diagnosis
from gpudoctor.util.errors import UsageError


@dataclass(frozen=True)
class RunInputs:
    diagnosis: Diagnosis | None
    argv: tuple[str, ...]  # the script's command line, as the run recorded it
    note: str | None = None  # why there is no diagnosis


def child_env() -> dict[str, str]:
    """This environment, with gpudoctor importable in a child even where it is not installed."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    return env


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
    cmd = [
        sys.executable,
        "-m",
        "gpudoctor",
        "run",
        "--out",
        str(out),
        "--with-stack",
        "--no-nvml",
        "--warmup",
        str(warmup),
        "--light-steps",
        str(light_steps),
        "--steps",
        str(steps),
        *(["-m"] if module else []),
        target,
        *args,
    ]
    log = out.with_name(out.name + ".log")
    try:
        with log.open("w") as f:
            subprocess.run(
                cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s, env=child_env(), check=False
            )
    except subprocess.TimeoutExpired:
        return RunInputs(None, (target, *args), f"the diagnosis run ran past {timeout_s:.0f} s")
    inputs = load_run(out, required=False)
    if inputs.diagnosis is None:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
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
