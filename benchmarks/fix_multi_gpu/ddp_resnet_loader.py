"""ResNet-50 (torchvision, random weights) trained under DDP in float32 on photos decoded from JPEG bytes
and augmented per item with torchvision's v2 transforms on uint8 images (RandomResizedCrop, flip,
ColorJitter) in two loader workers per rank, with a straggler users make without seeing it: the training
set interleaves two sources round-robin (as `datasets.interleave_datasets` does) and the
DistributedSampler is told `shuffle=False` ("the mix is shuffled already"), so rank 0 reads only the
256-px thumbnails and rank 1 only the 640-px photos, decoding six times the pixels per item: rank 1's
loader paces every step of both ranks.

`--expert`: workers from the rank's share of the cores (its affinity, split between the node's ranks when
not pinned), pinned memory, persistent workers, non-blocking copies, channels_last, cudnn.benchmark,
bfloat16 autocast; the data and the sampler as written. `--small`: 64-px crops of 80/200-px sources,
ResNet-18, or a small CNN where torchvision is missing (the CPU path, gloo).

    torchrun --standalone --nproc-per-node 2 benchmarks/fix_multi_gpu/ddp_resnet_loader.py [--expert] [--small]
"""

import argparse
import io
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

try:
    import torchvision
    from PIL import Image
    from torchvision.transforms import v2
except ImportError:  # the CPU smoke test where torchvision is not installed
    torchvision = None

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=100)
parser.add_argument("--batch", type=int, default=64, help="per rank")
parser.add_argument("--small", action="store_true", help="small images and model (CPU smoke test)")
parser.add_argument("--expert", action="store_true")
args = parser.parse_args()

CROP = 64 if args.small else 224
SOURCES = (80, 200) if args.small else (256, 640)  # each source's image side: thumbnails, photos
BATCH = 8 if args.small else args.batch


def photos(side, count, seed):
    """`count` smooth synthetic photos of `side` pixels, as JPEG bytes (raw uint8 without PIL)."""
    g = torch.Generator().manual_seed(seed)
    low = torch.rand(count, 3, 12, 12, generator=g)
    images = F.interpolate(low, size=(side, side), mode="bicubic", align_corners=False)
    images = (images + 0.05 * torch.randn(images.shape, generator=g)).clamp(0, 1).mul(255).to(torch.uint8)
    if torchvision is None:
        return list(images)
    encoded = []
    for image in images:
        buffer = io.BytesIO()
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(buffer, format="JPEG", quality=90)
        encoded.append(buffer.getvalue())
    return encoded


if torchvision is not None:
    augment = v2.Compose([
        v2.ToImage(),
        v2.RandomResizedCrop(CROP, antialias=True),
        v2.RandomHorizontalFlip(),
        v2.ColorJitter(0.4, 0.4, 0.4),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])  # fmt: skip
else:

    def augment(image):
        top, left = torch.randint(0, image.shape[-1] - CROP + 1, (2,)).tolist()
        crop = image[:, top : top + CROP, left : left + CROP].float() / 255
        return crop.flip(-1) if torch.rand(()) < 0.5 else crop


class Interleaved(Dataset):
    """Two sources mixed round-robin: item i is from source i % 2."""

    def __init__(self):
        self.sources = [photos(side, 32, seed) for seed, side in enumerate(SOURCES)]

    def __len__(self):
        return 1_281_167

    def __getitem__(self, index):
        source = self.sources[index % 2]
        data = source[(index // 2) % len(source)]
        image = Image.open(io.BytesIO(data)).convert("RGB") if torchvision is not None else data
        return augment(image), (index // 2) % 1000


def build_model():
    if torchvision is None:
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, stride=2, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
            torch.nn.Conv2d(32, 64, 3, stride=2, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 1000),
        )  # fmt: skip
    return torchvision.models.resnet18() if args.small else torchvision.models.resnet50()


def workers_per_rank():
    """The expert's: this rank's share of the cores it may use, less one for the training loop."""
    mine = os.sched_getaffinity(0)
    try:  # the launcher's (torchrun's): the cores the job may use on this node
        launcher = os.sched_getaffinity(os.getppid())
    except OSError:
        launcher = mine
    cores = len(mine)
    if cores >= len(launcher):  # not pinned to a share of its own: the node's ranks share these cores
        cores //= int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(2, cores - 1)


def main():
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    if args.expert:
        torch.backends.cudnn.benchmark = True

    model = build_model().to(device)
    if args.expert:
        model = model.to(memory_format=torch.channels_last)
    model = DDP(model, device_ids=[local] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)

    data = Interleaved()
    sampler = DistributedSampler(data, shuffle=False)  # the interleaved mix is "shuffled already"
    if args.expert:
        loader = DataLoader(data, batch_size=BATCH, sampler=sampler, num_workers=workers_per_rank(),
                            pin_memory=True, persistent_workers=True, drop_last=True)  # fmt: skip
    else:
        loader = DataLoader(data, batch_size=BATCH, sampler=sampler, num_workers=2, drop_last=True)

    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for images, labels in loader:
            if args.expert:
                images = images.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
                labels = labels.to(device, non_blocking=True)
                with torch.autocast(device.type, dtype=torch.bfloat16):
                    loss = F.cross_entropy(model(images), labels)
            else:
                images, labels = images.to(device), labels.to(device)
                loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % 50 == 0 and rank == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
