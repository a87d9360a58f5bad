"""timm's ConvNeXt-tiny (random weights, no download) trained in float32 in a custom loop, its images
decoded and augmented in the Dataset on the training thread (num_workers=0), AdamW — as its users
write it. `--expert`: bfloat16 autocast, channels_last, fused AdamW, 8 workers with pinned memory and
non-blocking copies, torch.compile."""

import argparse

import numpy as np
import timm
import torch
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=100)
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--small", action="store_true", help="small images and model (CPU smoke test)")
parser.add_argument("--expert", action="store_true")
args = parser.parse_args()

SIZE = 64 if args.small else 224


class Images(Dataset):
    def __len__(self):
        return 20_000

    def __getitem__(self, index):
        rng = np.random.default_rng(index)
        image = rng.integers(0, 256, (SIZE + 32, SIZE + 32, 3), dtype=np.uint8)  # "decoded"
        top, left = rng.integers(0, 32, 2)
        image = image[top : top + SIZE, left : left + SIZE].astype(np.float32) / 255.0
        if rng.random() < 0.5:
            image = image[:, ::-1]
        image = (image - 0.45) / 0.225
        return torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1))), int(index % 1000)


device = "cuda" if torch.cuda.is_available() else "cpu"
model = timm.create_model("convnext_atto" if args.small else "convnext_tiny", pretrained=False).to(device)
if args.expert:
    model = model.to(memory_format=torch.channels_last)
optimizer = torch.optim.AdamW(
    model.parameters(), lr=1e-3, weight_decay=0.05, fused=True if args.expert else None
)
if args.expert:
    loader = DataLoader(Images(), batch_size=args.batch, shuffle=True, num_workers=8, pin_memory=True,
                        persistent_workers=True, prefetch_factor=4)  # fmt: skip
    model.compile()
else:
    loader = DataLoader(Images(), batch_size=args.batch, shuffle=True)

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
