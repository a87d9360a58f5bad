"""An `accelerate` training loop: a GPT-2 (124M, from its config) language model on 512-token batches of
8, bf16 mixed precision, AdamW."""

import argparse

import _window
import torch
from accelerate import Accelerator
from transformers import GPT2Config, GPT2LMHeadModel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--small", action="store_true")
args = parser.parse_args()
accelerator = Accelerator(mixed_precision="bf16" if torch.cuda.is_available() else "no")
config = GPT2Config(n_layer=2, n_head=2, n_embd=64) if args.small else GPT2Config()
model = GPT2LMHeadModel(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
tokens = torch.randint(0, config.vocab_size, (8 * args.steps, 512 if not args.small else 64))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens), batch_size=8, shuffle=True)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
model.train()
for (batch,) in loader:
    loss = model(input_ids=batch, labels=batch).loss
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    _window.tick()
