"""A `torch.compile`d model: a 6-layer transformer encoder (d=1024) classifier trained in bf16 autocast."""

import argparse

import _window
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1000)
parser.add_argument("--small", action="store_true")
args = parser.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
d = 64 if args.small else 1024


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(d, 8 if not args.small else 2, 4 * d, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 6 if not args.small else 1)
        self.head = torch.nn.Linear(d, 10)

    def forward(self, x):
        return self.head(self.encoder(x).mean(dim=1))


model = torch.compile(Classifier().to(device))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
x = torch.randn(32, 256, d, device=device)
y = torch.randint(0, 10, (32,), device=device)
for _step in range(args.steps):
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    _window.tick()
