"""`activation_checkpointing`: activations dominate a training step's peak. Checkpointing the modules
that store them keeps only their inputs and runs their forward again in backward: the memory freed is
what their forward keeps alive minus their inputs (measured by forward hooks in the detail step), the
time paid their forward time (CUDA events around it in the same step)."""

from __future__ import annotations

from gpudoctor.analysis.memory_breakdown import ModuleMemory, compact_names, repeated_blocks, split_level
from gpudoctor.analysis.memory_run import MemoryAnalysis
from gpudoctor.rules.base import finding, pct, size, us
from gpudoctor.rules.finding import Finding, Fix
from gpudoctor.rules.memory_base import of_capacity, severity_of_share

MIN_SHARE = 0.5  # of the step's peak
MIN_BYTES = 64 << 20

FIX = Fix(
    summary="Checkpoint the blocks that store the activations: their forward runs again in backward "
    "instead of keeping its intermediate tensors.",
    snippet="""\
from torch.utils.checkpoint import checkpoint

class Model(torch.nn.Module):
    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)   # keeps x, recomputes the block in backward
        return self.head(x)
# Hugging Face models: model.gradient_checkpointing_enable()""",
)


def activation_checkpointing(m: MemoryAnalysis) -> Finding | None:
    b = m.breakdown
    if b is None or not m.training or b.peak <= 0:
        return None
    acts = b.categories.get("activations", 0)
    if acts < MIN_BYTES or acts < MIN_SHARE * b.peak:
        return None
    chosen = candidates(b.modules)
    evidence = [
        f"Activations are {size(acts)} of the {size(b.peak)} peak of {_step(b.step)} ({pct(100 * acts / b.peak)})"
        f"{of_capacity(m, b.peak)}.",
    ]
    saved = int(0.8 * acts)  # without module figures: most of them (their inputs stay)
    values: dict[str, float] = {"activations": acts, "peak": b.peak}
    if chosen:
        stored = sum(c.activations for c in chosen)
        saved = max(sum(max(c.activations - c.inputs, 0) for c in chosen), 0)
        names = compact_names(sorted((c.name for c in chosen), key=_natural))
        inputs = sum(c.inputs for c in chosen)
        evidence.append(
            f"The forward of {len(chosen)} {chosen[0].type or 'module'} modules ({names}) keeps "
            f"{size(stored)} alive, about {size(stored // len(chosen))} each"
            + (f"; their inputs are {size(inputs)}." if inputs else ".")
        )
        recompute = _recompute_us(chosen)
        cost = ""
        if recompute is not None:
            values["recompute_us"] = recompute
            cost = f", for about {us(recompute)} more per step (their forward again in backward"
            if m.step_us:
                values["recompute_pct"] = 100 * recompute / m.step_us
                cost += f": {pct(100 * recompute / m.step_us)} of the {us(m.step_us)} unprofiled step"
            cost += ")"
        evidence.append(
            f"Checkpointing them frees about {size(saved)} at the peak{cost}; the peak would be about "
            f"{size(b.peak - saved)}{of_capacity(m, b.peak - saved)}."
        )
    else:
        evidence.append(
            "No module figures (forward hooks run in the detail step on a GPU): checkpoint the repeated blocks."
        )
    values["saved"] = saved
    return finding(
        "activation_checkpointing",
        "Activations dominate the peak: checkpoint the blocks that store them",
        0.0,
        evidence,
        FIX,
        values,
        sources=tuple(c.name for c in chosen[:4]),
        severity=severity_of_share(saved / b.peak),
        memory_bytes=saved,
    )


def candidates(modules: tuple[ModuleMemory, ...]) -> list[ModuleMemory]:
    """The modules to checkpoint: the siblings of one type that keep the most (a model's blocks), else
    the modules where the activations split that hold 80% of them, largest first."""
    if not modules:
        return []
    blocks = repeated_blocks(modules)
    if blocks:
        return list(blocks)
    level = split_level(modules)
    total = sum(m.activations for m in level)
    chosen, held = [], 0
    for m in level:
        if held >= 0.8 * total:
            break
        chosen.append(m)
        held += m.activations
    return chosen


def _step(step: int | None) -> str:
    return f"step {step}" if step is not None else "the traced steps"


def _recompute_us(chosen: list[ModuleMemory]) -> float | None:
    times = [c.forward_us for c in chosen]
    return None if any(t is None for t in times) else sum(t or 0.0 for t in times)


def _natural(name: str) -> tuple[str, int]:
    head, _, tail = name.rpartition(".")
    return (head, int(tail)) if tail.isdigit() else (name, -1)
