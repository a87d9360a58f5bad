"""For the batch sweep: a transformer inference loop at batch 1 (a user serving requests one by one)."""

import argparse

import torch
from lm import LM, batch

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=1)
parser.add_argument("--seq-len", type=int, default=512)
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--device", default="cuda")
args = parser.parse_args()

torch.manual_seed(0)
model = LM(d=1024, layers=12, heads=16, seq=args.seq_len).to(args.device).eval()
with torch.inference_mode():
    for _ in range(args.steps):
        tokens = batch(args.batch_size, args.seq_len, device=args.device)
        logits = model(tokens)
