"""`transformer_train`: a GPT-style decoder (6 layers, d_model 1024, 16 heads, seq 1024, batch 8) trained
under bf16 autocast with AdamW; attention through `F.scaled_dot_product_attention`; tokens on the device."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpudoctor.workloads import models
from gpudoctor.workloads.base import Step, Workload, autocast, seed_everything

NAME = "transformer_train"


def build(device: torch.device, *, small: bool = False) -> Step:
    seed_everything(0)
    if small:
        vocab, seq, d_model, heads, layers, batch = 256, 32, 64, 4, 2, 2
    else:
        vocab, seq, d_model, heads, layers, batch = 32768, 1024, 1024, 16, 6, 8
    model = models.GPT(vocab, seq, d_model, heads, layers).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    gen = torch.Generator(device="cpu").manual_seed(0)
    tokens = [torch.randint(0, vocab, (batch, seq + 1), generator=gen).to(device) for _ in range(2)]
    counter = [0]

    def run() -> None:
        chunk = tokens[counter[0] % len(tokens)]
        counter[0] += 1
        inputs, targets = chunk[:, :-1], chunk[:, 1:]
        with autocast(device):
            logits = model(inputs)
            loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    info = {
        "model": "builtin.gpt",
        "layers": layers,
        "d_model": d_model,
        "heads": heads,
        "seq_len": seq,
        "batch": batch,
        "vocab": vocab,
        "dtype": "bf16-autocast",
        "optimizer": "AdamW",
    }
    return Step(run=run, close=tokens.clear, info=info)


WORKLOAD = Workload(
    NAME, "GPT decoder training (6x1024, seq 1024, batch 8), bf16 autocast, AdamW, SDPA", build
)
