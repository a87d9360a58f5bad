"""`input_pipeline`: the zoo CNN fed by a DataLoader whose dataset crops, flips and colour-jitters every image
with numpy. Slow: `num_workers=0, pin_memory=False` and a blocking `.to(device)`, so the host augments each
batch while the GPU idles. Fixed: 4 persistent workers prefetching 4 batches each into pinned memory, and
`.to(device, non_blocking=True)`. Images stay uint8 on the host and are normalised on the GPU."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from gpudoctor.workloads.base import Step, Workload, seed_everything
from gpudoctor.workloads.zoo import cnn
from gpudoctor.workloads.zoo._common import close_all
from gpudoctor.workloads.zoo.case import ZooCase

BATCH = 128
WIDTH = 128  # a ResNet base width that gives the GPU ~6 ms per batch, so 4 workers keep up with room to spare
_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


class JitteredImages(Dataset):
    """Random crops of a few pre-decoded uint8 HWC images, flipped and colour-jittered in float32 per sample
    (~80 µs of numpy per 128x128 crop), returned as uint8 CHW tensors."""

    def __init__(self, length: int, raw: int, crop: int, num_classes: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.decoded = rng.integers(0, 256, (16, raw, raw, 3), dtype=np.uint8)
        self.length, self.crop, self.num_classes, self.seed = length, crop, num_classes, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        rng = np.random.default_rng((self.seed, index))
        raw = self.decoded[index % len(self.decoded)]
        top, left = (int(v) for v in rng.integers(0, raw.shape[0] - self.crop + 1, size=2))
        chw = np.ascontiguousarray(raw[top : top + self.crop, left : left + self.crop].transpose(2, 0, 1))
        img = chw.astype(np.float32)
        img *= rng.uniform(0.6, 1.4, size=(3, 1, 1)).astype(np.float32)  # per-channel colour jitter
        img += np.float32(rng.uniform(-30, 30))  # brightness
        if rng.random() < 0.5:
            img = img[:, :, ::-1]
        out = np.clip(img, 0, 255).astype(np.uint8)
        return torch.from_numpy(np.ascontiguousarray(out)), int(rng.integers(0, self.num_classes))


def _build(device: torch.device, small: bool, tuned: bool) -> Step:
    seed_everything(0)
    batch, raw, crop, classes = (4, 40, 32, 10) if small else (BATCH, 160, 128, 1000)
    dataset = JitteredImages(length=100_000, raw=raw, crop=crop, num_classes=classes)
    pin = tuned and device.type == "cuda"
    loader = DataLoader(
        dataset,
        batch_size=batch,
        shuffle=True,
        drop_last=True,
        num_workers=4 if tuned else 0,
        pin_memory=pin,
        persistent_workers=tuned,
        prefetch_factor=4 if tuned else None,
        generator=torch.Generator().manual_seed(0),
    )
    model, opt, restore = cnn.make_trainer(
        device, small=small, num_classes=classes, channels_last=True, base=WIDTH
    )
    mean = torch.tensor(_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(_STD, device=device).view(1, 3, 1, 1)
    # One iterator for the whole run, as a training loop's `for batch in loader` keeps; a new one per epoch.
    state: dict[str, Iterator[tuple[torch.Tensor, torch.Tensor]]] = {"it": iter(loader)}

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        try:
            return next(state["it"])
        except StopIteration:
            state["it"] = iter(loader)
            return next(state["it"])

    def run() -> None:
        images, labels = next_batch()
        images = images.to(device, non_blocking=tuned)
        labels = labels.to(device, non_blocking=tuned)
        x = ((images.float() - mean) / std).contiguous(memory_format=torch.channels_last)
        cnn.train_step(model, opt, x, labels, device)

    def stop_workers() -> None:
        shutdown = getattr(state.pop("it", None), "_shutdown_workers", None)
        if shutdown is not None:  # private but stable: without it, persistent workers live until GC
            shutdown()

    info = {
        "model": f"{cnn.MODEL_NAME}(base={8 if small else WIDTH})",
        "batch": batch,
        "image_size": crop,
        "dtype": "bf16-autocast",
        "memory_format": "channels_last",
        "num_workers": 4 if tuned else 0,
        "pin_memory": pin,
        "persistent_workers": tuned,
        "prefetch_factor": 4 if tuned else None,
        "non_blocking": tuned,
        "variant": "fixed" if tuned else "slow",
    }
    return Step(run=run, close=close_all(stop_workers, restore), info=info)


def build_slow(device: torch.device, *, small: bool = False) -> Step:
    return _build(device, small, tuned=False)


def build_fixed(device: torch.device, *, small: bool = False) -> Step:
    return _build(device, small, tuned=True)


CASE = ZooCase(
    rule="input_pipeline",
    title="DataLoader with num_workers=0 augmenting on the main thread",
    slow=Workload(
        "input_pipeline.slow", "CNN fed by DataLoader(num_workers=0, pin_memory=False)", build_slow
    ),
    fixed=Workload(
        "input_pipeline.fixed",
        "CNN fed by DataLoader(num_workers=4, pin_memory=True, persistent_workers=True, prefetch_factor=4)",
        build_fixed,
    ),
    samples_per_step_slow=BATCH,
    samples_per_step_fixed=BATCH,
    note=(
        "Planted: the numpy augmentation of each batch (~10-15 ms for 128 crops) runs in the training "
        "process between steps and the pageable .to(device) blocks, so the GPU waits on "
        "DataLoader.__next__. Fix: DataLoader(num_workers=4, pin_memory=True, persistent_workers=True, "
        "prefetch_factor=4) and .to(device, non_blocking=True); 4 workers (~3-4 ms per batch) keep up "
        "with the GPU step (~6 ms)."
    ),
)
