"""ResNet-50 (torchvision, random weights) trained in NCHW float32 with SGD, as a user writes it.
`--expert`: channels_last, bfloat16 autocast, cudnn.benchmark."""

import argparse

import torch
import torchvision

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100_000)
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--small", action="store_true", help="a tiny model (CPU smoke test)")
parser.add_argument("--expert", action="store_true")
args = parser.parse_args()

device = "cuda" if torch.cuda.is_available() else "cpu"
size = 32 if args.small else 224
model = (torchvision.models.resnet18(num_classes=10) if args.small else torchvision.models.resnet50()).to(
    device
)
if args.expert:
    torch.backends.cudnn.benchmark = True
    model = model.to(memory_format=torch.channels_last)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
criterion = torch.nn.CrossEntropyLoss()

for _ in range(args.steps):
    images = torch.randn(args.batch, 3, size, size, device=device)
    labels = torch.randint(0, 10 if args.small else 1000, (args.batch,), device=device)
    if args.expert:
        images = images.to(memory_format=torch.channels_last)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=args.expert):
        loss = criterion(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
