"""Planted: fragmentation. Inference on sequences of varying length (no padding to buckets), keeping
the last few outputs for smoothing: tensors of ever-changing sizes, some of them held while others
come and go, split the allocator's segments into pieces a later request cannot use."""

import argparse
import random

import torch
from lm import LM, batch, step_peaks

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--max-len", type=int, default=2048)
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--device", default="cuda")
parser.add_argument("--peaks", default=None)
args = parser.parse_args()

torch.manual_seed(0)
random.seed(0)
model = LM(layers=4, seq=args.max_len).to(args.device).eval()
recent = []
mark = step_peaks(args.peaks)
with torch.no_grad():
    for _ in range(args.steps):
        length = random.randrange(64, args.max_len + 1, 8)
        tokens = batch(args.batch_size, length, device=args.device)
        logits = model(tokens)
        recent.append(logits[:, -1].float().softmax(-1))  # a small result ...
        recent.append(logits.float())  # ... and, for smoothing, the whole output
        del recent[:-6]  # the last three steps' outputs
        mark()
