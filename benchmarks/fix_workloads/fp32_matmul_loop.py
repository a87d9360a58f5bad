"""A wide MLP regression in float32: four 4096×4096 matmuls forward, eight backward, per step, with
TF32 off (PyTorch's default for matmuls). `--expert`: bfloat16 autocast and TF32."""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100_000)
parser.add_argument("--small", action="store_true", help="narrow layers (CPU smoke test)")
parser.add_argument("--expert", action="store_true")
args = parser.parse_args()

device = "cuda" if torch.cuda.is_available() else "cpu"
width, batch = (64, 32) if args.small else (4096, 4096)
if args.expert:
    torch.set_float32_matmul_precision("high")
layers = []
for _ in range(4):
    layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

for _ in range(args.steps):
    x = torch.randn(batch, width, device=device)
    y = x[:, :1].clone()
    with torch.autocast(device, dtype=torch.bfloat16, enabled=args.expert):
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
