"""Hugging Face BERT-base inference at batch 1 (built from its config: no download), as a serving loop."""

import argparse

import _window
import torch
from transformers import BertConfig, BertModel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3000)
parser.add_argument("--small", action="store_true")
args = parser.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
config = (
    BertConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=256)
    if args.small
    else BertConfig()
)
model = BertModel(config).to(device).eval()
for _i in range(args.steps):
    input_ids = torch.randint(0, config.vocab_size, (1, 128), device=device)
    with torch.no_grad():
        out = model(input_ids=input_ids)
    embedding = out.last_hidden_state[:, 0]
    _window.tick()
