"""torchvision's ViT-B/16 (random weights) trained on random images: float32, AdamW. `--expert`:
bfloat16 autocast, TF32, fused AdamW, torch.compile."""

import argparse

import torch
import torchvision

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100_000)
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--small", action="store_true", help="a tiny model (CPU smoke test)")
parser.add_argument("--expert", action="store_true")
args = parser.parse_args()

device = "cuda" if torch.cuda.is_available() else "cpu"
if args.expert:
    torch.set_float32_matmul_precision("high")
if args.small:
    model = torchvision.models.VisionTransformer(32, 8, 2, 2, 32, 64, num_classes=10)
    size, classes = 32, 10
else:
    model = torchvision.models.vit_b_16(weights=None)
    size, classes = 224, 1000
model = model.to(device)
criterion = torch.nn.CrossEntropyLoss()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if args.expert else None)
if args.expert:
    model.compile()

for _ in range(args.steps):
    images = torch.randn(args.batch, 3, size, size, device=device)
    labels = torch.randint(0, classes, (args.batch,), device=device)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=args.expert):
        loss = criterion(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
