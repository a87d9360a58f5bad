"""What a built-in workload is: a name, a description and a builder that returns a ready `Step`.
A `Step` runs one whole training or inference step (its own data fetch included) each time `run()` is
called; `close()` releases what the step holds. Building seeds torch, so two builds run the same numbers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class Step:
    """One step of a workload, ready to run; `info` says what was built (model, batch, dtype) for manifests."""

    run: Callable[[], None]
    close: Callable[[], None] = _nothing
    info: Mapping[str, object] = field(default_factory=dict)


class Builder(Protocol):
    """Builds a workload on `device`; `small=True` makes it tiny enough for a CPU smoke test in seconds."""

    def __call__(self, device: torch.device, *, small: bool = False) -> Step: ...


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    build: Builder


def seed_everything(seed: int = 0) -> None:
    """Seed torch (CPU and every CUDA device); numpy users keep their own seeded Generator."""
    import torch

    torch.manual_seed(seed)


def autocast(device: torch.device, enabled: bool = True) -> torch.autocast:
    """bf16 autocast on `device` (CUDA or CPU), as typical mixed-precision user code writes it."""
    import torch

    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)
