"""`gpudoctor run` options for the CPU tests' small scripts: one warm-up step, three timed and two traced,
no floor of seconds on either phase (the scripts run a set number of tiny steps)."""

from __future__ import annotations

from typing import Any


def traced_steps(analysis: Any) -> int:
    """The traced steps found: those analysed and, on a loaded machine, a first step slow enough to be
    set apart as warm-up (`trace.steps.leading_warmup`)."""
    return len(analysis.warmup_steps) + len(analysis.steps)


FAST = [
    "--warmup",
    "1",
    "--warmup-seconds",
    "0",
    "--light-steps",
    "3",
    "--light-seconds",
    "0",
    "--steps",
    "2",
]
