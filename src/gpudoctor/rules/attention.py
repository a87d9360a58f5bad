"""`attention_materialized`: attention computed as matmul → softmax → matmul over the S×S scores,
which writes and reads the whole score matrix; fused attention (FlashAttention) never stores it."""

from __future__ import annotations

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, pct, step_phrase, us
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix

SOFTMAX_OPS = ("aten::softmax", "aten::_softmax", "aten::_softmax_backward_data", "aten::_safe_softmax")
BATCHED_MATMUL_OPS = ("aten::bmm", "aten::baddbmm")
FUSED_OPS = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")

FIX = Fix(
    summary="Use torch.nn.functional.scaled_dot_product_attention, which dispatches to fused "
    "FlashAttention / cuDNN kernels that never store the score matrix.",
    snippet="""\
import torch.nn.functional as F

# instead of: scores = q @ k.transpose(-2, -1) / math.sqrt(d); out = scores.softmax(-1) @ v
out = F.scaled_dot_product_attention(q, k, v, is_causal=False)   # q, k, v: (batch, heads, seq, dim)""",
)


def attention_materialized(a: Analysis, f: Facts) -> Finding | None:
    if any(any(p in o.name for p in FUSED_OPS) for o in a.ops) or a.kernels.time_by_category_us.get(
        "attention"
    ):
        return None
    softmax = sum(o.gpu_total_us for o in a.ops if o.name in SOFTMAX_OPS) / f.steps
    bmm = sum(o.gpu_total_us for o in a.ops if o.name in BATCHED_MATMUL_OPS) / f.steps
    if not bmm or f.pct(softmax) < 2:
        return None
    # Fused attention removes the softmax passes over S×S and the score matrix's round trips through
    # memory in the batched matmuls; it keeps the matmuls' arithmetic, about half their time here.
    saving_us = softmax + 0.5 * bmm
    evidence = [
        f"softmax over attention scores takes {us(softmax)} of GPU time {step_phrase(f)} "
        f"({pct(f.pct(softmax))}) beside {us(bmm)} of batched matmuls (aten::bmm), and no fused "
        f"attention kernel runs.",
        "The S×S score matrix is written, read by softmax, written again and read by the second matmul "
        "(and again in the backward pass).",
    ]
    return finding(
        "attention_materialized",
        "Attention materializes the S×S score matrix",
        f.pct(saving_us),
        evidence,
        FIX,
        {"softmax_us": softmax, "bmm_us": bmm, "step_us": f.step_us},
    )
