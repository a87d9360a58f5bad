"""`attention_materialized`: one causal self-attention layer (d_model 1024, 16 heads, seq 2048, batch 4)
trained under bf16 autocast with fused AdamW. Slow: attention written out as nanoGPT's fallback path does,
`softmax(q @ k^T / sqrt(d))` masked and multiplied by v, materialising 4 x 16 x 2048 x 2048 scores in forward
and backward. Fixed: `F.scaled_dot_product_attention(q, k, v, is_causal=True)` (a flash kernel)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from gpudoctor.workloads.base import Step, Workload, autocast, seed_everything
from gpudoctor.workloads.zoo._common import RoundRobin, fused_optimizer_kwargs
from gpudoctor.workloads.zoo.case import ZooCase

BATCH = 4


class SelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, seq_len: int, fused: bool) -> None:
        super().__init__()
        self.n_heads, self.fused = n_heads, fused
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        mask = torch.tril(torch.ones(seq_len, seq_len, dtype=torch.bool)).view(1, 1, seq_len, seq_len)
        self.register_buffer("causal", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(k.size(-1))
            scores = scores.masked_fill(~self.causal[:, :, :t, :t], float("-inf"))
            p = scores.softmax(-1)
            y = p @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


def _build(device: torch.device, small: bool, fused: bool) -> Step:
    seed_everything(0)
    batch, seq, d_model, heads = (2, 64, 64, 4) if small else (BATCH, 2048, 1024, 16)
    model = SelfAttention(d_model, heads, seq, fused).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, **fused_optimizer_kwargs(device))
    gen = torch.Generator(device="cpu").manual_seed(0)
    batches = RoundRobin(
        [(torch.randn(batch, seq, d_model, generator=gen).to(device),) * 2 for _ in range(2)]
    )

    def run() -> None:
        x, target = batches.next()
        with autocast(device):
            out = model(x)
        loss = F.mse_loss(out.float(), target)  # learn the identity: any differentiable loss would do
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    info = {
        "model": "zoo.self_attention",
        "batch": batch,
        "seq_len": seq,
        "d_model": d_model,
        "heads": heads,
        "dtype": "bf16-autocast",
        "attention": "sdpa" if fused else "matmul-softmax-matmul",
        "variant": "fixed" if fused else "slow",
    }
    return Step(run=run, close=batches.items.clear, info=info)


def build_slow(device: torch.device, *, small: bool = False) -> Step:
    return _build(device, small, fused=False)


def build_fixed(device: torch.device, *, small: bool = False) -> Step:
    return _build(device, small, fused=True)


CASE = ZooCase(
    rule="attention_materialized",
    title="attention as matmul -> softmax -> matmul over S x S scores",
    slow=Workload("attention_materialized.slow", "hand-written causal attention, seq 2048, bf16", build_slow),
    fixed=Workload(
        "attention_materialized.fixed", "F.scaled_dot_product_attention(is_causal=True)", build_fixed
    ),
    samples_per_step_slow=BATCH,
    samples_per_step_fixed=BATCH,
    note=(
        "Planted: q @ k^T, scale, masked_fill, softmax and p @ v over a 4 x 16 x 2048 x 2048 score tensor "
        "(softmax in fp32 under autocast: ~1 GB per pass, forward and backward). Fix: "
        "F.scaled_dot_product_attention(q, k, v, is_causal=True), which never materialises the scores."
    ),
)
