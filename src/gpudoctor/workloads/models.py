"""Model code shared by the built-in workloads: a ResNet (torchvision's ResNet-50 when importable, else a
hand-written bottleneck ResNet), a GPT-style decoder on `F.scaled_dot_product_attention`, a small CNN and
an MLP. Plain NCHW, default init, nothing fused: the models look like ordinary user code."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + self.downsample(x))


class ResNet(nn.Module):
    """A bottleneck ResNet; `layers=(3, 4, 6, 3), base=64` is ResNet-50's shape."""

    def __init__(self, layers: tuple[int, ...], base: int = 64, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, base, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(base),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        blocks: list[nn.Module] = []
        in_ch = base
        for stage, depth in enumerate(layers):
            width = base * 2**stage
            for i in range(depth):
                blocks.append(Bottleneck(in_ch, width, stride=2 if (i == 0 and stage > 0) else 1))
                in_ch = width * Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def resnet50(*, small: bool, num_classes: int = 1000) -> tuple[nn.Module, str]:
    """ResNet-50 (torchvision's if importable) and a name for the manifest; `small` gives a tiny built-in one."""
    if small:
        return ResNet((1, 1, 1, 1), base=8, num_classes=num_classes), "builtin.resnet_tiny"
    try:
        from torchvision.models import resnet50 as tv_resnet50
    except ImportError:
        return ResNet((3, 4, 6, 3), base=64, num_classes=num_classes), "builtin.resnet50"
    return tv_resnet50(num_classes=num_classes), "torchvision.resnet50"


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(approximate="tanh"), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A GPT-2-style decoder: learned positions, pre-norm blocks, tied embedding and head."""

    def __init__(self, vocab: int, seq_len: int, d_model: int, n_heads: int, n_layers: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def small_cnn(num_classes: int = 10, width: int = 32) -> nn.Module:
    """A few conv layers: cheap on a GPU, so a slow input pipeline shows as GPU idle time."""
    return nn.Sequential(
        nn.Conv2d(3, width, 3, stride=2, padding=1),
        nn.BatchNorm2d(width),
        nn.ReLU(inplace=True),
        nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
        nn.BatchNorm2d(2 * width),
        nn.ReLU(inplace=True),
        nn.Conv2d(2 * width, 4 * width, 3, stride=2, padding=1),
        nn.BatchNorm2d(4 * width),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * width, num_classes),
    )


def mlp(d_in: int, hidden: int, depth: int, num_classes: int) -> nn.Module:
    layers: list[nn.Module] = []
    width = d_in
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.LayerNorm(hidden), nn.GELU()]
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)
