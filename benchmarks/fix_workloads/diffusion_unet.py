"""A text-to-image diffusion fine-tune as its users write it, after diffusers' train_text_to_image.py: a
frozen CLIP text encoder (transformers, built from its config: random weights, no download), a frozen
VAE-style image encoder and a conditional UNet of one's own (residual blocks, self- and cross-attention
written out as `softmax(q @ kᵀ) @ v`), all three called every step — images to latents, noise added at a
random timestep, the UNet trained to predict it with MSE — in float32, AdamW, the loader on the training
thread (`dataloader_num_workers=0`, the script's default). `--expert`: bfloat16 autocast around the three
forwards, TF32, channels_last, the UNet compiled, `scaled_dot_product_attention`, fused AdamW, four
loader workers with pinned memory."""

import argparse
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset
from transformers import CLIPTextConfig, CLIPTextModel

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1000)
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--resolution", type=int, default=128)
parser.add_argument("--small", action="store_true", help="small images and networks (CPU smoke test)")
parser.add_argument("--expert", action="store_true")
args = parser.parse_args()

RES = 32 if args.small else args.resolution
BATCH = 4 if args.small else args.batch
CHANNELS = (32, 32) if args.small else (128, 256, 256)
device = "cuda" if torch.cuda.is_available() else "cpu"
if args.expert:
    torch.set_float32_matmul_precision("high")
if args.small:
    text_config = CLIPTextConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2
    )
else:
    text_config = CLIPTextConfig()


class ImageCaptions(Dataset):
    """An image (random flip, scaled to [-1, 1]) and its caption's token ids, padded to 77."""

    def __len__(self):
        return 100_000

    def __getitem__(self, index):
        rng = np.random.default_rng(index)
        image = torch.from_numpy(rng.integers(0, 256, (RES, RES, 3), dtype=np.uint8)).permute(2, 0, 1)
        if rng.random() < 0.5:
            image = image.flip(-1)
        ids = torch.from_numpy(rng.integers(0, text_config.vocab_size, 77))
        return {"pixel_values": image.float() / 127.5 - 1, "input_ids": ids}


def attention(q, k, v):
    return (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(dim=-1) @ v


if args.expert:
    attention = F.scaled_dot_product_attention


class ResBlock(nn.Module):
    def __init__(self, cin, cout, temb=None):
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(32, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.time = nn.Linear(temb, cout) if temb else None
        self.norm2, self.conv2 = nn.GroupNorm(32, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, t=None):
        h = self.conv1(F.silu(self.norm1(x)))
        if self.time is not None:
            h = h + self.time(F.silu(t))[:, :, None, None]
        return self.skip(x) + self.conv2(F.silu(self.norm2(h)))


class Attention(nn.Module):
    def __init__(self, dim, context_dim=None, heads=8):
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_k = nn.Linear(context_dim or dim, dim, bias=False)
        self.to_v = nn.Linear(context_dim or dim, dim, bias=False)
        self.to_out = nn.Linear(dim, dim)

    def forward(self, x, context=None):
        context = x if context is None else context
        b, n, d = x.shape
        q, k, v = (p(s).view(b, -1, self.heads, d // self.heads).transpose(1, 2)
                   for p, s in ((self.to_q, x), (self.to_k, context), (self.to_v, context)))  # fmt: skip
        return self.to_out(attention(q, k, v).transpose(1, 2).reshape(b, n, d))


class SpatialTransformer(nn.Module):
    def __init__(self, dim, context_dim):
        super().__init__()
        self.norm = nn.GroupNorm(32, dim)
        self.proj_in, self.proj_out = nn.Conv2d(dim, dim, 1), nn.Conv2d(dim, dim, 1)
        self.norm1, self.attn1 = nn.LayerNorm(dim), Attention(dim)
        self.norm2, self.attn2 = nn.LayerNorm(dim), Attention(dim, context_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, context):
        b, c, h, w = x.shape
        tokens = self.proj_in(self.norm(x)).flatten(2).transpose(1, 2)
        tokens = tokens + self.attn1(self.norm1(tokens))
        tokens = tokens + self.attn2(self.norm2(tokens), context)
        tokens = tokens + self.ff(self.norm3(tokens))
        return x + self.proj_out(tokens.transpose(1, 2).reshape(b, c, h, w))


class UNet(nn.Module):
    """A level per entry of `channels`, each half the size of the one before, two residual blocks down
    and three up per level, each followed by self- and cross-attention over the text."""

    def __init__(self, channels, context_dim, latent=4):
        super().__init__()
        self.channels, temb = channels, 4 * channels[0]
        self.time = nn.Sequential(nn.Linear(channels[0], temb), nn.SiLU(), nn.Linear(temb, temb))
        self.conv_in = nn.Conv2d(latent, channels[0], 3, padding=1)
        self.down, self.up = nn.ModuleList(), nn.ModuleList()
        skips, cin = [channels[0]], channels[0]
        for level, c in enumerate(channels):
            for _ in range(2):
                self.down.append(nn.ModuleList([ResBlock(cin, c, temb), SpatialTransformer(c, context_dim)]))
                cin = c
                skips.append(c)
            if level < len(channels) - 1:
                self.down.append(nn.Conv2d(c, c, 3, stride=2, padding=1))
                skips.append(c)
        self.mid = nn.ModuleList([ResBlock(cin, cin, temb), SpatialTransformer(cin, context_dim),
                                  ResBlock(cin, cin, temb)])  # fmt: skip
        for level, c in reversed(list(enumerate(channels))):
            for _ in range(3):
                self.up.append(
                    nn.ModuleList([ResBlock(cin + skips.pop(), c, temb), SpatialTransformer(c, context_dim)])
                )
                cin = c
            if level > 0:
                self.up.append(nn.Sequential(nn.Upsample(scale_factor=2), nn.Conv2d(c, c, 3, padding=1)))
        self.norm_out, self.conv_out = nn.GroupNorm(32, cin), nn.Conv2d(cin, latent, 3, padding=1)

    def timestep_embedding(self, t):
        half = self.channels[0] // 2
        freqs = torch.exp(-math.log(10_000) * torch.arange(half, device=t.device) / half)
        angles = t[:, None].float() * freqs[None]
        return self.time(torch.cat([angles.cos(), angles.sin()], dim=-1))

    def forward(self, x, t, context):
        temb = self.timestep_embedding(t)
        h = self.conv_in(x)
        skips = [h]
        for block in self.down:
            if isinstance(block, nn.ModuleList):
                h = block[1](block[0](h, temb), context)
            else:
                h = block(h)
            skips.append(h)
        h = self.mid[2](self.mid[1](self.mid[0](h, temb), context), temb)
        for block in self.up:
            if isinstance(block, nn.ModuleList):
                h = block[1](block[0](torch.cat([h, skips.pop()], dim=1), temb), context)
            else:
                h = block(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class ImageEncoder(nn.Module):
    """The VAE's encoder: pixels to a sample of 4 latent channels, halved in size at each level but the
    last (from their mean and log-variance)."""

    def __init__(self, channels=(64, 128, 256)):
        super().__init__()
        layers, cin = [nn.Conv2d(3, channels[0], 3, padding=1)], channels[0]
        for i, c in enumerate(channels):
            layers.append(ResBlock(cin, c))
            if i < len(channels) - 1:
                layers.append(nn.Conv2d(c, c, 3, stride=2, padding=1))
            cin = c
        self.layers = nn.Sequential(
            *layers, nn.GroupNorm(32, cin), nn.SiLU(), nn.Conv2d(cin, 8, 3, padding=1)
        )

    def forward(self, pixels):
        mean, logvar = self.layers(pixels).chunk(2, dim=1)
        return mean + torch.exp(0.5 * logvar.clamp(-30, 20)) * torch.randn_like(mean)


text_encoder = CLIPTextModel(text_config).to(device)
vae_encoder = ImageEncoder((32, 32) if args.small else (64, 128, 256)).to(device)
unet = UNet(CHANNELS, text_config.hidden_size).to(device)
text_encoder.requires_grad_(False)
vae_encoder.requires_grad_(False)
text_encoder.eval()
vae_encoder.eval()
unet.train()
optimizer = torch.optim.AdamW(
    unet.parameters(), lr=1e-4, weight_decay=1e-2, fused=True if args.expert else None
)
betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, device=device) ** 2
alphas_cumprod = torch.cumprod(1 - betas, dim=0)
if args.expert:
    unet, vae_encoder = (
        unet.to(memory_format=torch.channels_last),
        vae_encoder.to(memory_format=torch.channels_last),
    )
    if device == "cuda":  # Inductor on the CPU needs a C++ toolchain: the smoke test runs eager
        unet.compile()
    workers = 0 if args.small else 4
    loader = DataLoader(ImageCaptions(), batch_size=BATCH, shuffle=True, drop_last=True, num_workers=workers,
                        pin_memory=True, persistent_workers=workers > 0)  # fmt: skip
else:
    loader = DataLoader(ImageCaptions(), batch_size=BATCH, shuffle=True, drop_last=True)


def compute_loss(pixels, input_ids):
    with torch.no_grad():
        latents = vae_encoder(pixels) * 0.18215
        encoder_hidden_states = text_encoder(input_ids)[0]
    noise = torch.randn_like(latents)
    timesteps = torch.randint(0, 1000, (latents.shape[0],), device=device)
    a = alphas_cumprod[timesteps].sqrt()[:, None, None, None]
    s = (1 - alphas_cumprod[timesteps]).sqrt()[:, None, None, None]
    noise_pred = unet(a * latents + s * noise, timesteps, encoder_hidden_states)
    return F.mse_loss(noise_pred.float(), noise.float())


for _epoch in range(args.epochs):
    for batch in loader:
        if args.expert:
            pixels = batch["pixel_values"].to(device, non_blocking=True, memory_format=torch.channels_last)
            input_ids = batch["input_ids"].to(device, non_blocking=True)
            with torch.autocast(device, dtype=torch.bfloat16):
                loss = compute_loss(pixels, input_ids)
        else:
            pixels = batch["pixel_values"].to(device)
            input_ids = batch["input_ids"].to(device)
            loss = compute_loss(pixels, input_ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
