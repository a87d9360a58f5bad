"""A DCGAN as PyTorch's tutorial trains it: a generator and a discriminator (transposed and strided
convolutions, batch norm), two Adam optimizers, alternating updates — the discriminator on a real and a
generated batch, then the generator through the discriminator — the losses and D's outputs read with
`.item()` every iteration, float32, images from a Dataset normalized on the CPU by two loader workers.
`--expert`: channels_last, bfloat16 autocast around each forward (the loss computed in float32 outside
it: `BCELoss` is unsafe under autocast), fused Adam, cudnn.benchmark, the
statistics kept on the GPU and read every 50 iterations, four workers with pinned memory."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1000)
parser.add_argument("--batch", type=int, default=512)
parser.add_argument("--small", action="store_true", help="small images, narrow networks (CPU smoke test)")
parser.add_argument("--expert", action="store_true")
args = parser.parse_args()

NZ, NGF, NDF = (16, 8, 8) if args.small else (100, 64, 64)
BATCH = 8 if args.small else args.batch
IMAGES = 64 if args.small else 4096
device = "cuda" if torch.cuda.is_available() else "cpu"


class Faces(Dataset):
    """Stands in for `ImageFolder(root, transform=Compose([..., ToTensor(), Normalize(...)]))`: decoded
    64×64 images held in memory, each scaled to [-1, 1] when fetched."""

    def __init__(self, images):
        self.images = torch.randint(0, 256, (images, 3, 64, 64), dtype=torch.uint8,
                                    generator=torch.Generator().manual_seed(0))  # fmt: skip

    def __len__(self):
        return 200_000

    def __getitem__(self, index):
        image = self.images[index % len(self.images)].float().div(255)
        return (image - 0.5) / 0.5, 0


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(NZ, NGF * 8, 4, 1, 0, bias=False),
            nn.BatchNorm2d(NGF * 8),
            nn.ReLU(True),
            nn.ConvTranspose2d(NGF * 8, NGF * 4, 4, 2, 1, bias=False),
            nn.BatchNorm2d(NGF * 4),
            nn.ReLU(True),
            nn.ConvTranspose2d(NGF * 4, NGF * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(NGF * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(NGF * 2, NGF, 4, 2, 1, bias=False),
            nn.BatchNorm2d(NGF),
            nn.ReLU(True),
            nn.ConvTranspose2d(NGF, 3, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(3, NDF, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(NDF, NDF * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(NDF * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(NDF * 2, NDF * 4, 4, 2, 1, bias=False),
            nn.BatchNorm2d(NDF * 4),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(NDF * 4, NDF * 8, 4, 2, 1, bias=False),
            nn.BatchNorm2d(NDF * 8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(NDF * 8, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, x):
        return self.main(x).view(-1)


def weights_init(m):
    if "Conv" in type(m).__name__:
        nn.init.normal_(m.weight, 0.0, 0.02)
    elif "BatchNorm" in type(m).__name__:
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


netG, netD = Generator().to(device), Discriminator().to(device)
netG.apply(weights_init)
netD.apply(weights_init)
criterion = nn.BCELoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999), fused=args.expert or None)
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999), fused=args.expert or None)
if args.expert:
    torch.backends.cudnn.benchmark = True
    # not compiled: with channels_last, torch 2.11's Inductor fails in convolution_backward's meta kernel
    # ("expected size 512==512, stride 16==1") on an H200
    netG, netD = netG.to(memory_format=torch.channels_last), netD.to(memory_format=torch.channels_last)
    workers = 0 if args.small else 4
    loader = DataLoader(Faces(IMAGES), batch_size=BATCH, shuffle=True, drop_last=True, num_workers=workers,
                        pin_memory=True, persistent_workers=workers > 0)  # fmt: skip
else:
    loader = DataLoader(
        Faces(IMAGES), batch_size=BATCH, shuffle=True, drop_last=True, num_workers=0 if args.small else 2
    )

G_losses, D_losses = [], []
stats = torch.zeros(3, device=device)
for epoch in range(args.epochs):
    for i, (real, _) in enumerate(loader):
        if args.expert:
            real = real.to(device, non_blocking=True, memory_format=torch.channels_last)
        else:
            real = real.to(device)
        ones = torch.ones(BATCH, device=device)
        zeros = torch.zeros(BATCH, device=device)
        noise = torch.randn(BATCH, NZ, 1, 1, device=device)

        # (1) update D: maximize log(D(x)) + log(1 - D(G(z)))
        netD.zero_grad()
        if args.expert:
            with torch.autocast(device, dtype=torch.bfloat16):
                output = netD(real)
            errD_real = criterion(output.float(), ones)
            errD_real.backward()
            with torch.autocast(device, dtype=torch.bfloat16):
                fake = netG(noise)
                output = netD(fake.detach())
            errD_fake = criterion(output.float(), zeros)
        else:
            output = netD(real)
            errD_real = criterion(output, ones)
            errD_real.backward()
            D_x = output.mean().item()
            fake = netG(noise)
            output = netD(fake.detach())
            errD_fake = criterion(output, zeros)
        errD_fake.backward()
        errD = errD_real + errD_fake
        optimizerD.step()

        # (2) update G: maximize log(D(G(z)))
        netG.zero_grad()
        if args.expert:
            with torch.autocast(device, dtype=torch.bfloat16):
                output = netD(fake)
            errG = criterion(output.float(), ones)
        else:
            D_G_z1 = output.mean().item()
            output = netD(fake)
            errG = criterion(output, ones)
        errG.backward()
        optimizerG.step()

        if args.expert:
            stats += torch.stack([errD, errG, output.float().mean()]).detach()
            if i % 50 == 49:
                d, g, d_g_z2 = (stats / 50).tolist()
                print(f"[{epoch}][{i + 1}] Loss_D {d:.4f} Loss_G {g:.4f} D(G(z)) {d_g_z2:.4f}")
                stats.zero_()
        else:
            D_G_z2 = output.mean().item()
            G_losses.append(errG.item())
            D_losses.append(errD.item())
            if i % 50 == 0:
                print(f"[{epoch}][{i}] Loss_D {errD.item():.4f} Loss_G {errG.item():.4f} D(x) {D_x:.4f} "
                      f"D(G(z)) {D_G_z1:.4f} / {D_G_z2:.4f}")  # fmt: skip
