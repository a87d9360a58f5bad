"""GPT-2 (124M, from its config) `generate` in a loop: greedy decoding of 32 new tokens per prompt."""

import argparse

import _window
import torch
from transformers import GPT2Config, GPT2LMHeadModel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--small", action="store_true")
args = parser.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
config = GPT2Config(n_layer=2, n_head=2, n_embd=64) if args.small else GPT2Config()
model = GPT2LMHeadModel(config).to(device).eval()
for _i in range(args.steps):
    prompt = torch.randint(0, config.vocab_size, (1, 16), device=device)
    tokens = model.generate(prompt, max_new_tokens=32, do_sample=False, pad_token_id=config.eos_token_id)
    _window.tick()
