"""Does bf16 autocast move `encoder_head`'s first losses by 13% (the numerics guard allows 5%) because of
its arithmetic, or because dropout draws other masks under bfloat16? Same seed, same batches: the
first losses of float32 against those under bfloat16 autocast, with the model's dropout on (as the
workload has it) and off, and with scaled_dot_product_attention left to choose its kernel or held to
the math one (whose dropout is an ordinary one). float32 against float32 is the control: it must be 0.

    PYTHONPATH=src python lab/bf16_dropout_numerics.py [--steps 5] [--out results.json]

A BERT-base encoder from its config (random weights, no download) and a head of one's own composed as
`benchmarks/fix_workloads/encoder_head.py` composes them, AdamW; `--small` for a tiny one (CPU check).
"""

from __future__ import annotations

import argparse
import contextlib
import json

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoModel, BertConfig

LABELS = 4


def losses(dtype: torch.dtype | None, dropout: bool, math_sdpa: bool, a: argparse.Namespace) -> list[float]:
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    p = 0.1 if dropout else 0.0
    size = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
    config = BertConfig(hidden_dropout_prob=p, attention_probs_dropout_prob=p, **(size if a.small else {}))
    encoder = AutoModel.from_config(config, attn_implementation="sdpa").to(device)
    head = nn.Sequential(nn.Dropout(p), nn.Linear(config.hidden_size, LABELS)).to(device)
    params = [*encoder.parameters(), *head.parameters()]
    optimizer = torch.optim.AdamW(params, lr=2e-5)
    gen = torch.Generator().manual_seed(1)
    out = []
    for _ in range(a.steps):
        ids = torch.randint(0, config.vocab_size, (a.batch, a.seq), generator=gen).to(device)
        labels = torch.randint(0, LABELS, (a.batch,), generator=gen).to(device)
        amp = torch.autocast(device, dtype=dtype) if dtype else contextlib.nullcontext()
        kernel = sdpa_kernel(SDPBackend.MATH) if math_sdpa else contextlib.nullcontext()
        with amp, kernel:
            logits = head(encoder(input_ids=ids).last_hidden_state[:, 0])
        loss = nn.functional.cross_entropy(logits.float(), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        out.append(loss.item())
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--out")
    a = parser.parse_args()
    rows = []
    for dropout in (True, False):
        for math_sdpa in (False, True):
            base = losses(None, dropout, math_sdpa, a)
            again = losses(None, dropout, math_sdpa, a)
            half = losses(torch.bfloat16, dropout, math_sdpa, a)

            def moved(xs: list[float], ys: list[float]) -> float:
                return max(abs(x - y) / abs(y) for x, y in zip(xs, ys, strict=True))

            row = {"dropout": dropout, "sdpa": "math" if math_sdpa else "default",
                   "fp32_vs_fp32": moved(again, base), "bf16_vs_fp32": moved(half, base),
                   "fp32": base, "bf16": half}  # fmt: skip
            rows.append(row)
            print(f"dropout {'on ' if dropout else 'off'}  sdpa {row['sdpa']:7}  float32 again "
                  f"{100 * row['fp32_vs_fp32']:6.3f}%  bf16 {100 * row['bf16_vs_fp32']:6.3f}%", flush=True)  # fmt: skip
    if a.out:
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        with open(a.out, "w") as f:
            json.dump(
                {"environment": {"device": device, "torch": torch.__version__}, "rows": rows}, f, indent=1
            )


if __name__ == "__main__":
    main()
