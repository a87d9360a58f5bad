"""`host_python`: the GPU waits while the host runs Python between the PyTorch ops — the training
script's own per-step work (logging, metrics, data preparation on the training thread), hooks and
module overhead — time that neither a faster launch path nor a CUDA graph removes. The typical
straggler of a data-parallel run: one rank's extra host work makes every rank wait in the all-reduce."""

from __future__ import annotations

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, pct, step_phrase, us
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding
from gpudoctor.rules.loop_advice import HOST_PYTHON_FIXES, host_python_fix, loop_of

MIN_SHARE = 0.25  # of the traced step: below this, Python between ops is the usual module overhead


__all__ = ["HOST_PYTHON_FIXES", "host_python"]  # the loop variants of its fix (rules.loop_advice)


def host_python(a: Analysis, f: Facts) -> Finding | None:
    python_us = f.host_python_us
    if python_us < MIN_SHARE * f.traced_step_us or f.traced_step_us <= 0:
        return None
    wait_us = f.launch_wait_us  # the GPU's real wait for a host that was not loading data or syncing
    saving_us = min(python_us, wait_us)
    if saving_us <= 0:
        return None
    evidence = [
        f"The host spends {us(python_us)} {_of_traced(f)} "
        f"({pct(100 * python_us / f.traced_step_us)}) in neither a PyTorch op, the DataLoader nor a call "
        "that waits for the GPU: Python between the ops.",
        f"Meanwhile the GPU waits for the host {us(wait_us)} {step_phrase(f)} ({pct(f.pct(wait_us))}); "
        f"it is busy {pct(100 * f.busy_fraction)} of the time.",
    ]
    where = [g for g in a.host_gaps if g.us_per_step >= 0.1 * python_us]
    if where:
        evidence.append(
            "Most of it in "
            + "; ".join(f"{g.frame}: {us(g.us_per_step)} {f.per}" for g in where[:3])
            + " (the user's frame open during those stretches)."
        )
    if len(a.trace.gpu_devices) == 1 and a.timeline.concurrent_kinds_us.get("communication", 0.0) > 0:
        evidence.append(
            "This rank communicates with others: while it runs this Python, they wait for it in "
            "their collectives (`gpudoctor analyze TRACE_DIR` shows the ranks side by side)."
        )
    return finding(
        "host_python",
        "The GPU waits while the host runs Python between ops",
        f.pct(saving_us),
        evidence,
        host_python_fix(loop_of(a, f)),
        {"host_python_us": python_us, "gpu_wait_us": wait_us, "traced_step_us": f.traced_step_us},
        # the code shown fits the loop: training, inference without a loader, generate (rules.loop_advice)
        sources=tuple(g.frame for g in where),
    )


def _of_traced(f: Facts) -> str:
    if f.whole_trace:
        return f"of the {us(f.traced_step_us)} traced"
    return f"of each traced {us(f.traced_step_us)} step"
