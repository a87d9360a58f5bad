"""`memory_held`: the script keeps tensors of one step alive into the next — outputs, losses with
their graphs, intermediate results in a variable or a list — so the next step's peak sits on top of
them. From the allocator's history of the detail step: what it allocated and still held at its end,
other than parameters, gradients, optimizer state and the inputs of the next step."""

from __future__ import annotations

from gpudoctor.analysis.memory_frames import CATEGORY_LABELS
from gpudoctor.analysis.memory_run import MemoryAnalysis
from gpudoctor.rules.base import finding, pct, size
from gpudoctor.rules.finding import Finding, Fix
from gpudoctor.rules.memory_base import peak_of, severity_of_share, where

MIN_BYTES = 8 << 20
MIN_SHARE = 0.02  # of the peak

FIX = Fix(
    summary="Drop what the next step does not need before it starts: `del` outputs after the loss, "
    "log `loss.item()` rather than the tensor, and detach anything you keep.",
    snippet="""\
out = model(x)
loss = criterion(out, y)
loss.backward()
del out                      # its activations and graph are not held into the next forward
last_loss = loss.item()      # a number""",
)


def memory_held(m: MemoryAnalysis) -> Finding | None:
    b = m.breakdown
    if b is None or not b.held:
        return None
    leaking = {s.site for s in m.leak.sites} if m.leak else set()
    held = [h for h in b.held if h.category != "inputs" and not {h.site, h.script_line} & leaking]
    total = sum(h.bytes for h in held)
    peak = peak_of(m)
    if total < MIN_BYTES or total < MIN_SHARE * peak:
        return None
    evidence = [
        f"Step {b.step} leaves {size(total)} alive for the next one ({pct(100 * total / max(peak, 1))} of "
        f"the {size(peak)} peak) that is neither parameters, gradients nor optimizer state:",
        "; ".join(
            f"{where(h)} {size(h.bytes)} ({CATEGORY_LABELS.get(h.category, h.category)}, {h.blocks} tensors)"
            for h in held[:4]
        )
        + ".",
        "While they are held, the next step's forward allocates on top of them: its peak is higher by "
        "up to that much.",
    ]
    return finding(
        "memory_held",
        "Tensors of one step are held into the next",
        0.0,
        evidence,
        FIX,
        {"held_bytes": total, "peak": peak},
        sources=tuple(h.site for h in held[:4]),
        severity=severity_of_share(total / max(peak, 1)),
        memory_bytes=total,
    )
