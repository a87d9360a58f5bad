"""Planted: an activation-heavy transformer training loop (no checkpointing, long sequences). With a
batch far too large for the GPU it is the out-of-memory case (`--batch-size 512`)."""

import argparse

import torch
from lm import LM, batch, lm_loss, step_peaks

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--seq-len", type=int, default=1024)
parser.add_argument("--layers", type=int, default=8)
parser.add_argument("--d-model", type=int, default=512)
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--device", default="cuda")
parser.add_argument("--peaks", default=None, help="write the per-step peaks here (the benchmark's truth)")
args = parser.parse_args()

torch.manual_seed(0)
model = LM(d=args.d_model, layers=args.layers, seq=args.seq_len).to(args.device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
mark = step_peaks(args.peaks)
for _ in range(args.steps):
    tokens = batch(args.batch_size, args.seq_len, device=args.device)
    loss = lm_loss(model(tokens), tokens)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    mark()
