"""torchvision ResNet-50 inference under inference_mode, batch 32, fp16 weights, as a batch job."""

import argparse

import _window
import torch
import torchvision

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5000)
parser.add_argument("--small", action="store_true")
args = parser.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.float16 if device == "cuda" else torch.float32
size = 64 if args.small else 224
model = (
    (torchvision.models.resnet18() if args.small else torchvision.models.resnet50()).to(device, dtype).eval()
)
with torch.inference_mode():
    for _i in range(args.steps):
        images = torch.randn(32, 3, size, size, device=device, dtype=dtype)
        predictions = model(images).argmax(dim=1)
        _window.tick()
