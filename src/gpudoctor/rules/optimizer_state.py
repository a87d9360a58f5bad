"""`optimizer_state_memory`: the optimizer's state (Adam: two fp32 tensors per parameter) is a large
share of the peak. Counted exactly from the optimizer objects. Lighter states: 8-bit Adam (a quarter),
Adafactor (factored second moments), SGD with momentum (half of Adam's); or sharded over several GPUs
(ZeRO-1 / FSDP: a 1/N share on each)."""

from __future__ import annotations

from gpudoctor.analysis.memory_run import MemoryAnalysis
from gpudoctor.rules.base import finding, pct, size
from gpudoctor.rules.finding import Finding, Fix
from gpudoctor.rules.memory_base import of_capacity, peak_of, severity_of_share

MIN_SHARE = 0.3  # of the peak
MIN_BYTES = 64 << 20
EIGHT_BIT_SAVES = 0.75  # 8-bit states are a quarter of fp32 ones

FIX = Fix(
    summary="Keep a lighter optimizer state: 8-bit AdamW (bitsandbytes), Adafactor or SGD with momentum; "
    "on several GPUs, shard it (ZeRO-1 / FSDP).",
    snippet="""\
import bitsandbytes as bnb
optimizer = bnb.optim.AdamW8bit(model.parameters(), lr=3e-4)        # a quarter of AdamW's state
# or: from transformers.optimization import Adafactor
# several GPUs: torch.distributed.optim.ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW)""",
)


def optimizer_state_memory(m: MemoryAnalysis) -> Finding | None:
    c = m.census
    peak = peak_of(m)
    if c is None or peak <= 0:
        return None
    state = c.optimizer_state
    if state < MIN_BYTES or state < MIN_SHARE * peak:
        return None
    name = ", ".join(c.optimizers) or "The optimizer"
    ratio = f" ({state / c.parameters:.1f}× the parameters' {size(c.parameters)})" if c.parameters else ""
    saved = int(EIGHT_BIT_SAVES * state)
    evidence = [
        f"{name}'s state is {size(state)}{ratio}, {pct(100 * state / peak)} of the {size(peak)} peak"
        f"{of_capacity(m, peak)} — counted from the optimizer's tensors.",
        f"8-bit states free about {size(saved)}; SGD with momentum keeps half of Adam's; sharding over "
        f"N GPUs (ZeRO-1 / FSDP) leaves {size(state)}/N on each.",
    ]
    return finding(
        "optimizer_state_memory",
        "The optimizer's state is a large share of the memory",
        0.0,
        evidence,
        FIX,
        {"optimizer_state": state, "parameters": c.parameters, "peak": peak, "saved": saved},
        severity=severity_of_share(saved / peak),
        memory_bytes=saved,
    )
