"""A training script as an accelerate user writes it, for trying gpudoctor on code it was not tuned
for (`benchmarks/aa_noise.py --script`): timm's ResNet-50 (random weights) on torchvision's FakeData —
PIL images made per index, the classic PIL transforms (RandomResizedCrop, RandomHorizontalFlip,
ToTensor, Normalize) — four loader workers, SGD with a OneCycle schedule, `accelerator.backward`, the loss
printed every 50 steps. Float32, as `accelerate launch` without a config runs it. Nothing here is tuned."""

import argparse

import timm
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=100)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--model", default="resnet50")
parser.add_argument("--image-size", type=int, default=176)
parser.add_argument("--workers", type=int, default=4)
args = parser.parse_args()

accelerator = Accelerator()

train_tf = transforms.Compose([
    transforms.RandomResizedCrop(args.image_size),
    transforms.RandomHorizontalFlip(),
    transforms.ToTensor(),
    transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
])  # fmt: skip
train_set = datasets.FakeData(size=20_000, image_size=(3, 224, 224), num_classes=1000, transform=train_tf)
train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                          drop_last=True)  # fmt: skip

model = timm.create_model(args.model, pretrained=False, num_classes=1000)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.4, epochs=args.epochs,
                                                steps_per_epoch=len(train_loader))  # fmt: skip
criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)

model, optimizer, train_loader, scheduler = accelerator.prepare(model, optimizer, train_loader, scheduler)

step = 0
for epoch in range(args.epochs):
    model.train()
    for images, targets in train_loader:
        outputs = model(images)
        loss = criterion(outputs, targets)
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        step += 1
        if step % 50 == 0:
            accelerator.print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
