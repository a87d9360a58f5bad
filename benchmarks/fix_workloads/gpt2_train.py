"""GPT-2 (124M, built from its config) trained on random tokens, as a user writes it: float32, AdamW with
its defaults. `--expert`: what an expert writes by hand — bfloat16 autocast, TF32, fused AdamW,
torch.compile."""

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100_000)
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--seq", type=int, default=256)
parser.add_argument("--small", action="store_true", help="a tiny model (CPU smoke test)")
parser.add_argument("--expert", action="store_true")
args = parser.parse_args()

device = "cuda" if torch.cuda.is_available() else "cpu"
config = GPT2Config(n_layer=2, n_head=2, n_embd=64) if args.small else GPT2Config()
if args.expert:
    torch.set_float32_matmul_precision("high")
model = GPT2LMHeadModel(config).to(device)
model.train()
optimizer = torch.optim.AdamW(
    model.parameters(), lr=3e-4, weight_decay=0.1, fused=True if args.expert else None
)
if args.expert:
    model.compile()

for step in range(args.steps):
    input_ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=device)
    if args.expert:
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids, labels=input_ids).loss
    else:
        loss = model(input_ids, labels=input_ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if step % 100 == 0:
        print(f"step {step} loss {loss.item():.4f}")
