"""`unfused_elementwise`: a hand-written bias + tanh-GELU + residual + RMSNorm over a 8192 x 4096 bf16
activation, forward and backward: ~40 memory-bound kernels per step, each reading and writing the whole
tensor. Slow: eager. Fixed: the same function under `torch.compile`, compiled and warmed up in the build;
on the CPU, or if compiling fails, the fixed variant falls back to eager and says so in `info`."""

from __future__ import annotations

from collections.abc import Callable

import torch

from gpudoctor.workloads.base import Step, Workload, seed_everything
from gpudoctor.workloads.zoo._common import RoundRobin, compile_or_eager, synchronize
from gpudoctor.workloads.zoo.case import ZooCase

TOKENS = 8192
Fn = Callable[..., torch.Tensor]


def bias_gelu_residual_rmsnorm(
    x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """As a user writes it: tanh-approximate GELU and RMSNorm by hand, the norm statistics in fp32."""
    h = x + bias
    h = 0.5 * h * (1.0 + torch.tanh(0.7978845608028654 * (h + 0.044715 * h * h * h)))
    h = h + residual
    hf = h.float()
    hf = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    return hf.to(h.dtype) * weight


def loss_of(
    x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    return bias_gelu_residual_rmsnorm(x, bias, residual, weight).float().square().mean()


def _build(device: torch.device, small: bool, compiled: bool) -> Step:
    seed_everything(0)
    tokens, hidden = (64, 128) if small else (TOKENS, 4096)
    gen = torch.Generator(device="cpu").manual_seed(0)
    dtype = torch.bfloat16

    def tensor(*shape: int, grad: bool = False) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device, dtype).requires_grad_(grad)

    bias, weight = tensor(hidden, grad=True), tensor(hidden, grad=True)
    batches = RoundRobin([(tensor(tokens, hidden, grad=True), tensor(tokens, hidden)) for _ in range(2)])

    def train_step(fn: Fn) -> None:
        x, residual = batches.next()
        x.grad = bias.grad = weight.grad = None
        fn(x, bias, residual, weight).backward()

    def warm_up(f: Fn) -> None:  # compiles forward and backward, outside any timed or profiled step
        for _ in range(3):
            train_step(f)
        synchronize(device)

    fn: Fn = loss_of
    why_eager: str | None = None
    if compiled:
        if device.type != "cuda":
            why_eager = "torch.compile is only used on CUDA here"
        else:
            fn, why_eager = compile_or_eager(loss_of, warm_up)

    info = {
        "function": "bias + tanh-GELU + residual + RMSNorm (hand-written)",
        "tokens": tokens,
        "hidden": hidden,
        "dtype": "bf16",
        "torch_compile": compiled and why_eager is None,
        "compile_fallback": why_eager,
        "variant": "fixed" if compiled else "slow",
    }
    return Step(run=lambda: train_step(fn), close=batches.items.clear, info=info)


def build_slow(device: torch.device, *, small: bool = False) -> Step:
    return _build(device, small, compiled=False)


def build_fixed(device: torch.device, *, small: bool = False) -> Step:
    return _build(device, small, compiled=True)


CASE = ZooCase(
    rule="unfused_elementwise",
    title="a chain of elementwise and normalization ops, each its own kernel",
    slow=Workload("unfused_elementwise.slow", "hand-written GELU + residual + RMSNorm, eager", build_slow),
    fixed=Workload("unfused_elementwise.fixed", "the same function under torch.compile", build_fixed),
    samples_per_step_slow=TOKENS,
    samples_per_step_fixed=TOKENS,
    note=(
        "Planted: ~15 forward and ~25 backward elementwise/reduction kernels over a 64 MB bf16 activation "
        "(fp32 copies inside RMSNorm): memory-bound, each a full read and write. Fix: torch.compile the "
        "function (Inductor fuses it into a few kernels); the fixed variant's info says if it fell back."
    ),
)
