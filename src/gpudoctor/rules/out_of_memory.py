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
        "effective batch), activation checkpointing of the repeated blocks, or 16-bit autocast (bfloat16 "
        "from Ampere, sm_80; float16 with a GradScaler before).",
        snippet="""\
from torch.utils.checkpoint import checkpoint
x = checkpoint(block, x, use_reentrant=False)          # in the model's forward, for each big block
# or: half the batch, twice the steps per optimizer update
with torch.autocast("cuda", dtype=torch.bfloat16):     # activations in 2 bytes instead of 4 (float16 before sm_80)
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
    cause, advice = _what_fits(o, short, m.training)
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


def _what_fits(o: OomReport, short: int, training: bool) -> tuple[str, str]:
    """The category to act on and a sentence on what would make the allocation fit. A batch that fits
    is a bound, never a promise: the step may fail before allocating all it needs (the rest of the
    forward's activations, the backward's gradients, the first optimizer step's state)."""
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
        to_come, said = _still_to_allocate(o, training)
        keep = (scaling - short - to_come) / scaling
        share = f"{size(scaling)}, {pct(100 * scaling / max(o.allocated, 1))} of what was held"
        if keep <= 0:
            return top, (
                f"Activations, inputs and temporaries ({share}) grow with the batch, but {said}: no smaller "
                "batch is sure to fit; checkpoint activations, or run `gpudoctor batch SCRIPT` to find one."
            )
        return top, (
            f"Activations, inputs and temporaries ({share}) grow with the batch. A batch of at most "
            f"{pct(100 * keep)} of this one can fit, and that is an upper bound: {said}. Halve it, or run "
            "`gpudoctor batch SCRIPT`, which finds the largest that fits by running it; or keep the batch "
            "and checkpoint activations."
        )
    return top, (
        f"{CATEGORY_LABELS.get(top, top).capitalize()} hold the most ({size(held[top])}); freeing "
        f"{size(short)} of it makes this allocation fit."
    )


# Adam(W)'s state: two tensors the size of each parameter (the most common optimizer's; SGD with
# momentum keeps one, plain SGD none).
ADAM_STATE_PER_PARAMETER_BYTE = 2


def _still_to_allocate(o: OomReport, training: bool) -> tuple[int, str]:
    """What the step had yet to allocate when it failed, as far as the snapshot tells (bytes counted
    in the bound) and a sentence saying what that is and what is left out."""
    params = o.categories.get("parameters", 0)
    if not training or not params:
        return 0, (
            "the failure may have come before the step had allocated all it needs, and what it still "
            "needed is not known"
        )
    counted, parts = 0, []
    if not o.categories.get("gradients"):
        counted += params
        parts.append(f"the backward's gradients (about the parameters' {size(params)})")
    if not o.categories.get("optimizer_state"):
        counted += ADAM_STATE_PER_PARAMETER_BYTE * params
        parts.append(
            f"the first optimizer step's state (up to {size(ADAM_STATE_PER_PARAMETER_BYTE * params)} for Adam)"
        )
    if not parts:
        return 0, (
            "the failure may have come partway through the step, before the rest of its activations "
            "were allocated, which the snapshot cannot count"
        )
    return counted, (
        "the failure came before "
        + " and ".join(parts)
        + ", counted here, and partway through the forward, whose remaining activations are not"
    )
