"""A deep residual MLP (hundreds of small parameters) trained with Adam(foreach=False): the optimizer
step launches a few kernels per parameter. `--expert`: Adam(fused=True)."""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100_000)
parser.add_argument("--small", action="store_true", help="fewer blocks (CPU smoke test)")
parser.add_argument("--expert", action="store_true")
args = parser.parse_args()


class Block(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.fc = torch.nn.Linear(dim, dim)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.fc(self.norm(x)))


device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Sequential(
    *[Block(256) for _ in range(8 if args.small else 64)], torch.nn.Linear(256, 1)
).to(device)
if args.expert:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)
else:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=False)

for _ in range(args.steps):
    x = torch.randn(64, 256, device=device)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
