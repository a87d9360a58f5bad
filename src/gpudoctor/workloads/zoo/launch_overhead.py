"""`launch_overhead`: bf16 inference of a 24-block residual MLP (width 1024, batch 1024): ~120 kernels of
a few µs each per step, each with enough thread blocks to fill the GPU (so the cause is the launches, not
a small batch). Slow: eager, so the GPU waits on every launch from Python. Fixed: the same forward
captured once into a `torch.cuda.CUDAGraph` (warm-up on a side stream, static input buffer) and replayed;
on the CPU there are no graphs and the fixed variant runs eagerly too."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from gpudoctor.workloads.base import Step, Workload, seed_everything
from gpudoctor.workloads.zoo._common import RoundRobin, close_all
from gpudoctor.workloads.zoo.case import ZooCase

BATCH = 1024


class ResidualMLP(nn.Module):
    """`depth` pre-norm blocks x + W2·gelu(W1·LN(x)), then a linear head."""

    def __init__(self, width: int, depth: int, num_classes: int) -> None:
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(depth))
        self.ups = nn.ModuleList(nn.Linear(width, 4 * width) for _ in range(depth))
        self.downs = nn.ModuleList(nn.Linear(4 * width, width) for _ in range(depth))
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm, up, down in zip(self.norms, self.ups, self.downs, strict=True):
            x = x + down(F.gelu(up(norm(x))))
        return self.head(x)


def capture_graph(
    forward: Callable[[torch.Tensor], torch.Tensor], example: torch.Tensor
) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
    """Capture `forward` on a static copy of `example`; returns (graph, static input, static output)."""
    static_in = example.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture: lazy init and cuBLAS workspaces
        for _ in range(3):
            forward(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = forward(static_in)
    return graph, static_in, static_out


def _build(device: torch.device, small: bool, use_graph: bool) -> Step:
    seed_everything(0)
    width, depth, batch, classes = (32, 4, 4, 10) if small else (1024, 24, BATCH, 1000)
    model = ResidualMLP(width, depth, classes).to(device=device, dtype=torch.bfloat16).eval()
    gen = torch.Generator(device="cpu").manual_seed(0)
    inputs = RoundRobin(
        [torch.randn(batch, width, generator=gen).to(device, torch.bfloat16) for _ in range(4)]
    )
    outputs: list[torch.Tensor] = []
    graphed = use_graph and device.type == "cuda"

    def forward(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return model(x)

    if graphed:
        graph, static_in, static_out = capture_graph(forward, inputs.items[0])

        def run() -> None:
            static_in.copy_(inputs.next())
            graph.replay()
            outputs[:] = [static_out.argmax(dim=1)]

        release: Callable[[], None] = graph.reset
    else:

        def run() -> None:
            outputs[:] = [forward(inputs.next()).argmax(dim=1)]

        release = outputs.clear

    info = {
        "model": "zoo.residual_mlp",
        "width": width,
        "depth": depth,
        "batch": batch,
        "dtype": "bf16",
        "mode": "inference",
        "cuda_graph": graphed,
        "cuda_graph_fallback": "eager: no CUDA graphs on the cpu" if use_graph and not graphed else None,
        "variant": "fixed" if use_graph else "slow",
    }
    return Step(run=run, close=close_all(outputs.clear, release, inputs.items.clear), info=info)


def build_slow(device: torch.device, *, small: bool = False) -> Step:
    return _build(device, small, use_graph=False)


def build_fixed(device: torch.device, *, small: bool = False) -> Step:
    return _build(device, small, use_graph=True)


CASE = ZooCase(
    rule="launch_overhead",
    title="~120 tiny kernels per step, each launched from Python",
    slow=Workload(
        "launch_overhead.slow", "24-block residual MLP, batch 16, bf16 inference, eager", build_slow
    ),
    fixed=Workload("launch_overhead.fixed", "the same forward replayed from a CUDA graph", build_fixed),
    samples_per_step_slow=BATCH,
    samples_per_step_fixed=BATCH,
    note=(
        "Planted: ~120 kernels of 2-5 µs each per step, each launched from Python (~10 µs of host time), "
        "so the GPU idles between kernels. Fix: capture the forward into a CUDA graph (torch.cuda.graph, "
        "static input buffer, warm-up on a side stream) and replay it: one launch per step; "
        'torch.compile(mode="reduce-overhead") does the same automatically.'
    ),
)
