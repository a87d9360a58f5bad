"""Planted: a leak. Each step also computes a loss on a held-out batch for logging, without
torch.no_grad(), and keeps the tensor: every logged loss holds its whole forward graph alive."""

import argparse

import torch
from lm import LM, batch, lm_loss, step_peaks

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--seq-len", type=int, default=512)
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--device", default="cuda")
parser.add_argument("--peaks", default=None)
args = parser.parse_args()

torch.manual_seed(0)
model = LM(layers=4, seq=args.seq_len).to(args.device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
held_out = batch(4, args.seq_len, device=args.device)
logged = []
mark = step_peaks(args.peaks)
for _ in range(args.steps):
    tokens = batch(args.batch_size, args.seq_len, device=args.device)
    loss = lm_loss(model(tokens), tokens)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    val_loss = lm_loss(model(held_out), held_out)  # for the log: no torch.no_grad(), no .item()
    logged.append(val_loss)
    mark()
