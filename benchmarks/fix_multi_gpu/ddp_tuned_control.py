"""A control, already tuned: a convolutional network trained under DDP with every rank given the same work
— bfloat16 autocast, channels_last, cudnn.benchmark, TF32, a fused AdamW, the model compiled, DDP with
`gradient_as_bucket_view` and `static_graph`, and a loader that keeps ahead (workers from the rank's share
of the cores, pinned memory, persistent workers, non-blocking copies, normalisation on the GPU). Nothing is
left for `gpudoctor fix` to gain: it should keep nothing. `--expert` changes nothing (the expert's version
is this one). `--small`: small images and batch, eager (the CPU path, gloo).

    torchrun --standalone --nproc-per-node 2 benchmarks/fix_multi_gpu/ddp_tuned_control.py [--small]
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=10_000)
parser.add_argument("--batch", type=int, default=256, help="per rank")
parser.add_argument("--small", action="store_true", help="small images and batch (CPU smoke test)")
parser.add_argument("--expert", action="store_true", help="the same script: it is tuned already")
args = parser.parse_args()

SIZE = 32 if args.small else 128
BATCH = 16 if args.small else args.batch


class Crops(Dataset):
    """Random crops and flips of images held in memory as uint8 (cheap per item: the GPU paces)."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        side = SIZE + SIZE // 8
        self.images = torch.randint(0, 256, (512, 3, side, side), dtype=torch.uint8, generator=g)

    def __len__(self):
        return 200_000

    def __getitem__(self, index):
        image = self.images[index % len(self.images)]
        top, left = torch.randint(0, image.shape[-1] - SIZE + 1, (2,)).tolist()
        crop = image[:, top : top + SIZE, left : left + SIZE]
        if torch.rand(()) < 0.5:
            crop = crop.flip(-1)
        return crop.contiguous(), index % 100


def block(cin, cout):
    return torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 3, padding=1, bias=False), torch.nn.BatchNorm2d(cout),
                               torch.nn.ReLU(inplace=True), torch.nn.MaxPool2d(2))  # fmt: skip


def workers_per_rank():
    """This rank's share of the cores it may use, less one for the training loop."""
    mine = os.sched_getaffinity(0)
    try:  # the launcher's (torchrun's): the cores the job may use on this node
        launcher = os.sched_getaffinity(os.getppid())
    except OSError:
        launcher = mine
    cores = len(mine)
    if cores >= len(launcher):  # not pinned to a share of its own: the node's ranks share these cores
        cores //= int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, min(8, cores - 1))


def main():
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    torch.set_float32_matmul_precision("high")

    model = torch.nn.Sequential(block(3, 64), block(64, 128), block(128, 256), block(256, 512),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(512, 100))  # fmt: skip
    model = model.to(device, memory_format=torch.channels_last)
    model = DDP(model, device_ids=[local] if cuda else None, gradient_as_bucket_view=True, static_graph=True)
    if cuda:  # Inductor on the CPU needs a C++ toolchain: the smoke test runs eager
        model = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=cuda)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

    data = Crops()
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    workers = workers_per_rank()
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler, num_workers=workers, pin_memory=cuda,
                        persistent_workers=True, prefetch_factor=4, drop_last=True)  # fmt: skip

    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for images, labels in loader:
            images = images.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
            labels = labels.to(device, non_blocking=True)
            images = (images.float() - mean) / std
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if step % 100 == 0 and rank == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
