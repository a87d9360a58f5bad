"""ResNet-18 from torchvision (random weights) trained on images augmented by torchvision's random
transforms (RandomResizedCrop, RandomHorizontalFlip, ColorJitter: drawn from the global RNG) in the
Dataset, two loader workers, float32 — the tutorial's pipeline. `--expert`: 8 workers, pinned memory,
non-blocking copies, channels_last, bfloat16 autocast."""

import argparse

import torch
from torch.utils.data import DataLoader, Dataset
from torchvision import models
from torchvision.transforms import v2

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=100)
parser.add_argument("--batch", type=int, default=128)
parser.add_argument("--small", action="store_true", help="small images (CPU smoke test)")
parser.add_argument("--expert", action="store_true")
args = parser.parse_args()

SIZE = 64 if args.small else 160

augment = v2.Compose([
    v2.RandomResizedCrop(SIZE, antialias=True),
    v2.RandomHorizontalFlip(),
    v2.ColorJitter(0.4, 0.4, 0.4),
    v2.ToDtype(torch.float32, scale=True),
    v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
])  # fmt: skip


class Photos(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (256, 3, SIZE + SIZE // 4, SIZE + SIZE // 4), dtype=torch.uint8,
                                    generator=g)  # fmt: skip

    def __len__(self):
        return 50_000

    def __getitem__(self, index):
        return augment(self.images[index % len(self.images)]), index % 100


device = "cuda" if torch.cuda.is_available() else "cpu"
model = models.resnet18(num_classes=100).to(device)
if args.expert:
    model = model.to(memory_format=torch.channels_last)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
workers = 8 if args.expert else (0 if args.small else 2)
loader = DataLoader(Photos(), batch_size=args.batch, shuffle=True, num_workers=workers,
                    pin_memory=args.expert, persistent_workers=workers > 0)  # fmt: skip

for _epoch in range(args.epochs):
    for images, labels in loader:
        images = images.to(device, non_blocking=args.expert)
        labels = labels.to(device, non_blocking=args.expert)
        if args.expert:
            images = images.contiguous(memory_format=torch.channels_last)
            with torch.autocast(device, dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(images), labels)
        else:
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
