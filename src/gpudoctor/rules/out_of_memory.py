"""`out_of_memory`: the script ran out of GPU memory. From the allocator's snapshot taken at that
moment: what held the memory (by category and by line), how much was missing, and the change that
makes the most of it fit."""

from __future__ import annotations

from gpudoctor.analysis.memory_frames import CATEGORY_LABELS
from gpudoctor.analysis.memory_run import MemoryAnalysis, OomReport
from gpudoctor.rules.base import finding, pct, size
from gpudoctor.rules.finding import Finding, Fix, Severity
from gpudoctor.rules.memory_base import categories_text, where

FIXES = {
    "fragmentation": Fix(
        summary="The free memory is there but split into pieces too small: let the allocator grow "
        "segments instead (set before the first CUDA call).",
        snippet='import os\nos.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"   # before importing torch',
    ),
    "activations": Fix(
        summary="Activations fill the memory: a smaller batch (with gradient accumulation to keep the "
        "effective batch), activation checkpointing of the repeated blocks, or bfloat16 autocast.",
        snippet="""\
from torch.utils.checkpoint import checkpoint
x = checkpoint(block, x, use_reentrant=False)          # in the model's forward, for each big block
# or: half the batch, twice the steps per optimizer update
with torch.autocast("cuda", dtype=torch.bfloat16):     # activations in 2 bytes instead of 4
    loss = model(batch).loss""",
    ),
    "optimizer_state": Fix(
        summary="The optimizer's state fills the memory: a lighter optimizer state (8-bit Adam, "
        "Adafactor, SGD with momentum) or sharding it over several GPUs (ZeRO / FSDP).",
        snippet="""\
import bitsandbytes as bnb
optimizer = bnb.optim.AdamW8bit(model.parameters(), lr=3e-4)   # a quarter of Adam's state""",
    ),
    "other": Fix(
        summary="Memory held from earlier steps fills the device: free what the loop keeps (tensors in "
        "lists, outputs, losses with their graphs) and check for a leak.",
        snippet="losses.append(loss.item())   # a number, not the tensor and its graph\ndel outputs",
    ),
}
FIXES["inputs"] = FIXES["activations"]
FIXES["temporaries"] = FIXES["activations"]
FIXES["gradients"] = FIXES["optimizer_state"]
FIXES["parameters"] = FIXES["optimizer_state"]
FIXES["unattributed"] = FIXES["other"]


def out_of_memory(m: MemoryAnalysis) -> Finding | None:
    o = m.oom
    if o is None:
        return None
    short = max(o.requested - (o.device_free or 0), 0)
    at = f" at {o.failing_line}" if o.failing_line else ""
    if o.script_line and o.script_line != o.failing_line:
        at += f" (from {o.script_line})"
    evidence = [
        f"An allocation of {size(o.requested)} failed{at} (step {o.step}): the device had "
        f"{size(o.device_free or 0)} free"
        + (f" of {size(o.capacity)}" if o.capacity else "")
        + f", {size(short)} short; tensors held {size(o.allocated)}, the allocator {size(o.reserved)}.",
    ]
    if any(o.categories.values()):
        evidence.append(f"What held the memory: {categories_text(o.categories)}.")
    if o.sites:
        evidence.append(
            "Allocated at: "
            + "; ".join(
                f"{where(s)} {size(s.bytes)} ({CATEGORY_LABELS.get(s.category, s.category)})"
                for s in o.sites[:4]
            )
            + "."
        )
    cause, advice = _what_fits(o, short)
    evidence.append(advice)
    return finding(
        "out_of_memory",
        "Out of GPU memory",
        0.0,
        evidence,
        FIXES[cause],
        {
            "requested": o.requested,
            "short": short,
            "allocated": o.allocated,
            "reserved": o.reserved,
            **{f"held_{c}": b for c, b in o.categories.items() if b},
        },
        sources=tuple(s.site for s in o.sites[:4]) + ((o.failing_line,) if o.failing_line else ()),
        severity=Severity.CRITICAL,
        memory_bytes=short,
    )


def _what_fits(o: OomReport, short: int) -> tuple[str, str]:
    """The category to act on and a sentence on what would make the allocation fit."""
    cached_free = o.reserved - o.allocated
    if cached_free >= o.requested and o.largest_free_block < o.requested:
        return "fragmentation", (
            f"{size(cached_free)} of the allocator's memory was free but in pieces, the largest "
            f"{size(o.largest_free_block)}: with expandable segments the {size(o.requested)} fits."
        )
    held = {c: b for c, b in o.categories.items() if b > 0}
    if not held:
        return "other", f"Free {size(short)} of device memory and it fits."
    top = max(held, key=lambda c: held[c])
    scaling = held.get("activations", 0) + held.get("inputs", 0) + held.get("temporaries", 0)
    if top in ("activations", "inputs", "temporaries") and scaling > short:
        keep = 1 - short / scaling
        return top, (
            f"Activations, inputs and temporaries ({size(scaling)}, {pct(100 * scaling / max(o.allocated, 1))} of what "
            f"was held) grow with the batch: a batch at most {pct(100 * keep)} of this one should fit "
            "(halve it to be safe), or keep the batch and checkpoint activations."
        )
    return top, (
        f"{CATEGORY_LABELS.get(top, top).capitalize()} hold the most ({size(held[top])}); freeing "
        f"{size(short)} of it makes this allocation fit."
    )
