"""A small GPT-style language model and random token batches, shared by the planted memory cases (the
way a user keeps a model file beside the training script)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, need_weights=False, is_causal=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


class LM(nn.Module):
    def __init__(
        self, vocab: int = 8192, d: int = 512, layers: int = 8, heads: int = 8, seq: int = 1024
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def lm_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())


def batch(size: int, seq: int, vocab: int = 8192, device: str = "cuda") -> torch.Tensor:
    return torch.randint(0, vocab, (size, seq), device=device)


def step_peaks(path: str | None):
    """For the benchmark's truth: the script's own per-step `torch.cuda.max_memory_allocated()`
    (reset after each step), written to `path` at exit. Nothing without a path or a GPU."""
    import atexit
    import json

    peaks: list[int] = []
    if path and torch.cuda.is_available():
        atexit.register(lambda: Path(path).write_text(json.dumps(peaks)))

    def mark() -> None:
        if path and torch.cuda.is_available():
            peaks.append(torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()

    return mark
