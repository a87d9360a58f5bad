"""`python -m gpudoctor.doctor.diagnosis_process --out RUN_DIR --result FILE [phases] [-m] -- script
[args...]`: the doctor run in a fresh process through the runner's child protocol (`runner.child`), for
`gpudoctor fix`'s diagnosis, so that nothing the script loads stays in the caller. It runs
`run_and_diagnose` into RUN_DIR and writes FILE (through the one writer): the findings, the script's
command line, and why there are no findings where there are none. Not a command line for people: the
CLI is `gpudoctor run`."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudoctor.rules.finding import Diagnosis
from gpudoctor.runner import rundir
from gpudoctor.runner.phases import LiveOptions
from gpudoctor.runner.record import RunRecord
from gpudoctor.util.errors import GpudoctorError


@dataclass(frozen=True)
class ChildDiagnosis:
    """What the child sends back: the findings (None: `note` says why), the command line run, and where
    the script itself failed (raised, or exited with a non-zero status) why, at which step."""

    diagnosis: Diagnosis | None
    argv: tuple[str, ...]
    note: str | None = None
    script_error: str | None = None  # "ValueError: bad batch after 4 steps"; None where it did not fail

    def to_json(self) -> dict[str, Any]:
        return {
            "diagnosis": self.diagnosis.to_json() if self.diagnosis else None,
            "argv": list(self.argv),
            "note": self.note,
            "script_error": self.script_error,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChildDiagnosis:
        diagnosis = Diagnosis.from_json(data["diagnosis"]) if data.get("diagnosis") else None
        return cls(diagnosis, tuple(data.get("argv") or ()), data.get("note"), data.get("script_error"))


def child_argv(
    out: Path, result: Path, *, module: bool, warmup: int, light_steps: int, steps: int, command: list[str]
) -> list[str]:
    """The arguments of `python -m gpudoctor.doctor.diagnosis_process` for a diagnosis run with stacks, no NVML."""
    return [
        "--out", str(out), "--result", str(result), "--warmup", str(warmup), "--light-steps", str(light_steps),
        "--steps", str(steps), *(["-m"] if module else []), "--", *command,
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpudoctor.doctor.diagnosis_process")
    parser.add_argument("--out", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--light-steps", type=int, default=10)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("-m", dest="module", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    ns = parser.parse_args(sys.argv[1:] if argv is None else argv)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not command:
        parser.error("no script given")
    result = diagnose_in_child(Path(ns.out), command, ns.module, ns.warmup, ns.light_steps, ns.steps)
    rundir.write_child_result(ns.result, result.to_json())
    return 0


def diagnose_in_child(
    out: Path, command: list[str], module: bool, warmup: int, light_steps: int, steps: int
) -> ChildDiagnosis:
    from gpudoctor.doctor.run import RunOptions, run_and_diagnose

    live = LiveOptions(warmup=warmup, light_steps=light_steps, steps=steps, with_stack=True, nvml=False)
    argv = tuple(command)
    try:
        report = run_and_diagnose(command[0], command[1:], RunOptions(live, module=module, out=out))
    except GpudoctorError as err:
        return ChildDiagnosis(None, argv, str(err))
    failed = script_failure(report.record)
    if report.diagnosis is None:
        why = next(iter(report.notes), None) or f"{out} has no analysis.json (the run traced no steps)"
        return ChildDiagnosis(None, argv, why, failed)
    return ChildDiagnosis(report.diagnosis, argv, script_error=failed)


EXITED = "it exited with status"


def script_failure(record: RunRecord | None) -> str | None:
    """Where the script itself failed under the doctor — raised, or exited with a non-zero status —
    what it said and after how many steps; None where it ran (or was stopped by gpudoctor)."""
    if record is None:
        return None
    steps = f"after {record.steps_seen} step{'s' if record.steps_seen != 1 else ''}"
    if record.outcome == "exception":
        return f"{record.error or 'an exception'} {steps}"
    if record.outcome == "exit" and record.exit_code:
        return f"{EXITED} {record.exit_code} {steps}"
    return None


if __name__ == "__main__":
    sys.exit(main())
