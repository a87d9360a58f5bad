"""Lightning `Trainer.fit`: ResNet-18 on 224-pixel images, bf16-mixed, AdamW, 2 DataLoader workers that
decode and augment on the CPU (a random crop, a flip and a normalization in numpy per image)."""

import argparse

import _window
import lightning as L
import numpy as np
import torch
import torchvision

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--workers", type=int, default=2)
parser.add_argument("--pin", action="store_true")
parser.add_argument("--fused", action="store_true")
parser.add_argument("--small", action="store_true")
args = parser.parse_args()
SIZE = 64 if args.small else 224


class Images(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n
        self.store = np.random.default_rng(0).integers(0, 255, (64, SIZE + 32, SIZE + 32, 3), dtype=np.uint8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        image = self.store[i % len(self.store)]
        y0, x0 = np.random.randint(0, 32, 2)
        crop = image[y0 : y0 + SIZE, x0 : x0 + SIZE].astype(np.float32) / 255.0
        if np.random.rand() < 0.5:
            crop = crop[:, ::-1]
        crop = (crop - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
        return torch.from_numpy(np.ascontiguousarray(crop.transpose(2, 0, 1), dtype=np.float32)), i % 1000


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = torchvision.models.resnet18()

    def training_step(self, batch, index):
        images, labels = batch
        return torch.nn.functional.cross_entropy(self.model(images), labels)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3, fused=True if args.fused else None)


class Tick(L.Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, index):
        _window.tick()


loader = torch.utils.data.DataLoader(
    Images(64 * args.steps),
    batch_size=64,
    num_workers=args.workers,
    pin_memory=args.pin,
    persistent_workers=args.workers > 0,
    shuffle=True,
)
trainer = L.Trainer(
    max_steps=args.steps,
    accelerator="auto",
    precision="bf16-mixed" if torch.cuda.is_available() else "32",
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    callbacks=[Tick()],
)
trainer.fit(Classifier(), loader)
