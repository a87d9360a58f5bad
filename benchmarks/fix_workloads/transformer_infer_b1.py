"""Batch-1 inference with GPT-2 (124M, built from its config): one sequence at a time from a DataLoader,
scored under no_grad. Launch-bound. `--expert`: torch.compile with CUDA graphs (reduce-overhead) and
bfloat16 autocast."""

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel

parser = argparse.ArgumentParser()
parser.add_argument("--seq", type=int, default=64)
parser.add_argument("--sequences", type=int, default=100_000)
parser.add_argument("--small", action="store_true", help="a tiny model (CPU smoke test)")
parser.add_argument("--expert", action="store_true")
args = parser.parse_args()

device = "cuda" if torch.cuda.is_available() else "cpu"
config = GPT2Config(n_layer=2, n_head=2, n_embd=64) if args.small else GPT2Config()
model = GPT2LMHeadModel(config).to(device).eval()
if args.expert:
    model = torch.compile(model, mode="reduce-overhead")
tokens = torch.randint(0, config.vocab_size, (args.sequences, args.seq))
loader = DataLoader(TensorDataset(tokens), batch_size=1)

scores = []
with torch.no_grad():
    for (input_ids,) in loader:
        input_ids = input_ids.to(device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=args.expert):
            logits = model(input_ids, use_cache=False).logits
        scores.append(logits[0, -1].float().max())
