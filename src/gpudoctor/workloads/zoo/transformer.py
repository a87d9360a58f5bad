"""The zoo's transformer: `models.GPT` (pre-norm blocks, SDPA attention, tied head) trained under bf16
autocast with fused AdamW on token batches already on the device. `seq_lens` cycles the sequence length per
step (dynamic padding, as NLP loaders do) and `after_step` runs at the end of each step."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gpudoctor.workloads import models
from gpudoctor.workloads.base import Step, autocast, seed_everything
from gpudoctor.workloads.zoo._common import Forward, RoundRobin, fused_optimizer_kwargs


@dataclass(frozen=True)
class GptShape:
    layers: int
    d_model: int
    heads: int
    vocab: int
    batch: int
    seq_lens: tuple[int, ...]


SMALL = GptShape(layers=2, d_model=64, heads=4, vocab=256, batch=2, seq_lens=(32,))
# ~10 ms per step on an H100: 4 blocks of d_model 1024 over 8 x 1024 tokens, compute-bound.
CONTROL = GptShape(layers=4, d_model=1024, heads=16, vocab=32768, batch=8, seq_lens=(1024,))


def build_gpt_train(
    device: torch.device,
    shape: GptShape,
    *,
    after_step: Callable[[], None] | None = None,
    info: Mapping[str, object] | None = None,
    compile: bool = False,
) -> Step:
    seed_everything(0)
    model = models.GPT(shape.vocab, max(shape.seq_lens), shape.d_model, shape.heads, shape.layers)
    model = model.to(device).train()
    forward = Forward(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, **fused_optimizer_kwargs(device))
    gen = torch.Generator(device="cpu").manual_seed(0)
    batches = RoundRobin(
        [
            torch.randint(0, shape.vocab, (shape.batch, s + 1), generator=gen).to(device)
            for s in shape.seq_lens
        ]
    )

    def run() -> None:
        chunk = batches.next()
        inputs, targets = chunk[:, :-1], chunk[:, 1:]
        with autocast(device):
            logits = forward(inputs)
            loss = F.cross_entropy(logits.reshape(-1, shape.vocab), targets.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if after_step is not None:
            after_step()

    if compile and device.type == "cuda":  # compiled here, outside any timed or profiled step
        forward.compile(run, 2 * len(shape.seq_lens))
    full_info = {
        **forward.info(),
        "model": "builtin.gpt",
        "layers": shape.layers,
        "d_model": shape.d_model,
        "heads": shape.heads,
        "vocab": shape.vocab,
        "batch": shape.batch,
        "seq_lens": list(shape.seq_lens),
        "dtype": "bf16-autocast",
        "attention": "sdpa",
        "optimizer": "AdamW(fused)" if device.type == "cuda" else "AdamW(foreach)",
        **(info or {}),
    }
    return Step(run=run, close=batches.items.clear, info=full_info)
