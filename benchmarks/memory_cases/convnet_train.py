"""For the batch sweep: a conv-net training loop whose batch size is fixed in its DataLoader (no
command-line option: `gpudoctor batch` patches the DataLoader). ResNet-50 on 128×128 images kept as
uint8 (as decoded images are), made float on the GPU: the GPU, not the loader, limits the step, so the
throughput curve has a knee to find."""

import argparse

import torch
import torchvision
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cuda")
parser.add_argument("--samples", type=int, default=16384)
parser.add_argument("--size", type=int, default=128)
parser.add_argument("--workers", type=int, default=4)
args = parser.parse_args()

torch.manual_seed(0)
images = torch.randint(0, 256, (args.samples, 3, args.size, args.size), dtype=torch.uint8)
labels = torch.randint(0, 100, (args.samples,))
loader = DataLoader(
    TensorDataset(images, labels),
    batch_size=32,
    shuffle=True,
    drop_last=True,
    pin_memory=args.device != "cpu",
    num_workers=args.workers,
    persistent_workers=args.workers > 0,
)
model = torchvision.models.resnet50(num_classes=100).to(args.device).to(memory_format=torch.channels_last)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for _epoch in range(100):
    for x, y in loader:
        x = x.to(args.device, non_blocking=True).float().div_(255).to(memory_format=torch.channels_last)
        y = y.to(args.device, non_blocking=True)
        with torch.autocast(args.device if args.device != "cpu" else "cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
