"""A small CNN fed by a Dataset that decodes and augments each image on the CPU, loaded on the training
thread (num_workers=0) from pageable memory: the GPU waits for data. `--expert`: 8 workers, pinned
memory, persistent workers, non-blocking copies."""

import argparse

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=100)
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--small", action="store_true", help="smaller images (CPU smoke test)")
parser.add_argument("--expert", action="store_true")
args = parser.parse_args()

SIZE = 32 if args.small else 128
CROP = SIZE - SIZE // 8


class Images(Dataset):
    def __len__(self):
        return 50_000

    def __getitem__(self, index):
        rng = np.random.default_rng(index)
        image = rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)  # "decoded"
        top, left = rng.integers(0, SIZE - CROP, 2)
        image = image[top : top + CROP, left : left + CROP].astype(np.float32) / 255.0
        if rng.random() < 0.5:
            image = image[:, ::-1]
        image = (image - image.mean(axis=(0, 1))) / (image.std(axis=(0, 1)) + 1e-6)
        return torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1))), index % 10


device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
    torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
    torch.nn.Flatten(), torch.nn.Linear(64, 10),
).to(device)  # fmt: skip
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
if args.expert:
    loader = DataLoader(Images(), batch_size=args.batch, shuffle=True, num_workers=8, pin_memory=True,
                        persistent_workers=True, prefetch_factor=4)  # fmt: skip
else:
    loader = DataLoader(Images(), batch_size=args.batch, shuffle=True)

for _epoch in range(args.epochs):
    for images, labels in loader:
        images = images.to(device, non_blocking=args.expert)
        labels = labels.to(device, non_blocking=args.expert)
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
