"""A plain training loop: torchvision ResNet-50, bf16 autocast, SGD, synthetic batches on the GPU."""

import argparse

import _window
import torch
import torchvision

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--small", action="store_true")
args = parser.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
size = 64 if args.small else 224
model = (torchvision.models.resnet18() if args.small else torchvision.models.resnet50()).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
x = torch.randn(args.batch, 3, size, size, device=device)
y = torch.randint(0, 1000, (args.batch,), device=device)
for _step in range(args.steps):
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    _window.tick()
