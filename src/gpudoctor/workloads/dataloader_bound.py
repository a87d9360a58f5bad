"""`dataloader_bound`: a small CNN fed by a `DataLoader(num_workers=0, pin_memory=False)` whose dataset
decodes-and-augments each image on the CPU in the main process, so the GPU idles waiting for every batch."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from gpudoctor.workloads import models
from gpudoctor.workloads.base import Step, Workload, seed_everything

NAME = "dataloader_bound"
_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


class AugmentedImages(Dataset):
    """Random "decoded" HWC uint8 images, random-cropped, flipped, blurred and normalised with numpy."""

    def __init__(self, length: int, raw_size: int, crop: int, num_classes: int, seed: int = 0) -> None:
        self.length, self.raw_size, self.crop = length, raw_size, crop
        self.num_classes, self.seed = num_classes, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        rng = np.random.default_rng((self.seed, index))
        raw = rng.integers(0, 256, (self.raw_size, self.raw_size, 3), dtype=np.uint8)
        top, left = (int(v) for v in rng.integers(0, self.raw_size - self.crop + 1, size=2))
        img = raw[top : top + self.crop, left : left + self.crop].astype(np.float32) / 255.0
        if rng.random() < 0.5:
            img = img[:, ::-1]
        # A 3x3 box blur stands in for the colour jitter / resize work of a real augmentation pipeline.
        padded = np.pad(img, ((1, 1), (1, 1), (0, 0)), mode="edge")
        c = self.crop
        img = sum(padded[dy : dy + c, dx : dx + c] for dy in range(3) for dx in range(3)) / 9.0
        img = (img - _MEAN) / _STD
        chw = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))
        return chw, int(rng.integers(0, self.num_classes))


def _forever(loader: DataLoader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    while True:
        yield from loader


def build(device: torch.device, *, small: bool = False) -> Step:
    seed_everything(0)
    batch, raw, crop, classes = (4, 40, 32, 10) if small else (32, 256, 224, 100)
    dataset = AugmentedImages(length=100_000, raw_size=raw, crop=crop, num_classes=classes)
    loader = DataLoader(
        dataset,
        batch_size=batch,
        shuffle=True,
        num_workers=0,
        pin_memory=False,
        generator=torch.Generator().manual_seed(0),
    )
    batches = _forever(loader)
    model = models.small_cnn(num_classes=classes, width=8 if small else 32).to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def run() -> None:
        x, y = next(batches)
        x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    info = {
        "model": "builtin.small_cnn",
        "batch": batch,
        "image_size": crop,
        "num_workers": 0,
        "dtype": "fp32",
    }
    return Step(run=run, close=batches.close, info=info)


WORKLOAD = Workload(NAME, "small CNN starved by a num_workers=0 DataLoader doing numpy augmentation", build)
