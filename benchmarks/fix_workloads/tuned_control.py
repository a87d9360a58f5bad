"""A control that is already tuned: a small convolutional network trained in bfloat16 autocast, with
channels_last, cudnn.benchmark, TF32, a fused AdamW, a model compiled, and data already on the GPU —
nothing left for gpudoctor fix to gain. `--expert` changes nothing (the expert's version is this one):
gpudoctor should keep nothing here."""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1_000_000)
parser.add_argument("--batch", type=int, default=128)
parser.add_argument("--small", action="store_true", help="small images (CPU smoke test)")
parser.add_argument("--expert", action="store_true", help="the same script: it is tuned already")
args = parser.parse_args()

SIZE = 32 if args.small else 96
BATCH = 16 if args.small else args.batch
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.backends.cudnn.benchmark = True
torch.set_float32_matmul_precision("high")


def block(cin, cout):
    return torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 3, padding=1, bias=False), torch.nn.BatchNorm2d(cout),
                               torch.nn.ReLU(inplace=True), torch.nn.MaxPool2d(2))  # fmt: skip


model = torch.nn.Sequential(block(3, 64), block(64, 128), block(128, 256), torch.nn.AdaptiveAvgPool2d(1),
                            torch.nn.Flatten(), torch.nn.Linear(256, 100))  # fmt: skip
model = model.to(device, memory_format=torch.channels_last)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device == "cuda")
if device == "cuda":  # Inductor on the CPU needs a C++ toolchain: the smoke test runs eager
    model.compile()
images = torch.randn(BATCH * 8, 3, SIZE, SIZE, device=device).contiguous(memory_format=torch.channels_last)
labels = torch.randint(0, 100, (BATCH * 8,), device=device)
for step in range(args.steps):
    i = (step % 8) * BATCH
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(images[i : i + BATCH]), labels[i : i + BATCH])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
