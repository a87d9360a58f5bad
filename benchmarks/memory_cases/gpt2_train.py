"""Planted: a Hugging Face GPT-2 (124M, built from GPT2Config: no download) training step."""

import argparse

import torch
from lm import step_peaks
from transformers import GPT2Config, GPT2LMHeadModel

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--seq-len", type=int, default=1024)
parser.add_argument("--layers", type=int, default=12)
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--device", default="cuda")
parser.add_argument("--peaks", default=None)
args = parser.parse_args()

torch.manual_seed(0)
config = GPT2Config(n_layer=args.layers, n_positions=args.seq_len)
model = GPT2LMHeadModel(config).to(args.device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
mark = step_peaks(args.peaks)
for _ in range(args.steps):
    tokens = torch.randint(0, config.vocab_size, (args.batch_size, args.seq_len), device=args.device)
    loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    mark()
