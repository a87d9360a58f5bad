"""A loop of plain tensor ops, no nn.Module: a power iteration with a normalization every step."""

import argparse

import _window
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200000)
parser.add_argument("--n", type=int, default=2048)
parser.add_argument("--small", action="store_true")
args = parser.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
n = 256 if args.small else args.n
a = torch.randn(n, n, device=device)
a = a @ a.T
v = torch.randn(n, 1, device=device)
for _i in range(args.steps):
    w = a @ v
    v = w / w.norm()
    residual = (a @ v - (v.T @ a @ v) * v).abs().max()
    _window.tick()
