"""Small pieces the zoo's workloads share: round-robin batches, optimizer settings as an expert writes them,
global flags set for a build and restored by its `close`, and a close that runs every cleanup."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import torch

T = TypeVar("T")


class RoundRobin(Generic[T]):
    """Hands out `items` in turn, as a loop over a few pre-made batches does; `step` counts calls."""

    def __init__(self, items: Sequence[T]) -> None:
        self.items = list(items)
        self.step = 0

    def next(self) -> T:
        item = self.items[self.step % len(self.items)]
        self.step += 1
        return item


def fused_optimizer_kwargs(device: torch.device) -> dict[str, bool]:
    """`fused=True` on CUDA (every optimizer used here has it), else the multi-tensor `foreach` path."""
    return {"fused": True} if device.type == "cuda" else {"foreach": True}


def set_flag(owner: Any, name: str, value: object) -> Callable[[], None]:
    """Set a global backend flag (e.g. `torch.backends.cudnn.benchmark`); returns the call restoring it."""
    old = getattr(owner, name)
    setattr(owner, name, value)
    return lambda: setattr(owner, name, old)


def set_matmul_precision(precision: str) -> Callable[[], None]:
    """`torch.set_float32_matmul_precision` for a build; returns the call that restores the old one."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    return lambda: torch.set_float32_matmul_precision(old)


def close_all(*cleanups: Callable[[], object]) -> Callable[[], None]:
    """One `close` that runs every cleanup in order, even when one raises (the first error is re-raised)."""

    def close() -> None:
        error: BaseException | None = None
        for cleanup in cleanups:
            try:
                cleanup()
            except BaseException as exc:  # keep restoring flags even if freeing a buffer failed
                error = error or exc
        if error is not None:
            raise error

    return close


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


F = TypeVar("F")


def compile_or_eager(fn: F, warm_up: Callable[[F], object]) -> tuple[F, str | None]:
    """`torch.compile(fn)` warmed up (compiled) by `warm_up`; on failure `fn` itself and the reason."""
    try:
        compiled = torch.compile(fn, dynamic=False)
        warm_up(compiled)  # type: ignore[arg-type]
    except Exception as exc:  # an Inductor/Triton failure must not lose the whole zoo run
        return fn, f"{type(exc).__name__}: {exc}"[:300]
    return compiled, None  # type: ignore[return-value]


class Forward:
    """A model's forward as a step calls it: eager, or compiled once at build time by `compile(...)`
    (which warms it up by running the step), falling back to eager if compiling fails."""

    def __init__(self, model: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.model = model
        self.fn = model
        self.why_eager: str | None = None
        self.compiled = False

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)

    def compile(self, run_step: Callable[[], object], warmup_steps: int = 3) -> None:
        def warm_up(compiled: Callable[[torch.Tensor], torch.Tensor]) -> None:
            self.fn = compiled
            for _ in range(warmup_steps):
                run_step()

        self.fn, self.why_eager = compile_or_eager(self.model, warm_up)
        self.compiled = self.why_eager is None

    def info(self) -> dict[str, object]:
        return {
            "torch_compile": self.compiled,
            **({"compile_fallback": self.why_eager} if self.why_eager else {}),
        }
