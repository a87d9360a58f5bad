"""The input pipeline: DataLoader constructor arguments rewritten as the script builds its loaders —
worker processes (`num_workers`, kept alive with `persistent_workers`, `prefetch_factor` batches ahead
each), pinned batches with non-blocking host-to-device copies, or (only where the user allows it) a
larger batch. `DataLoader.__init__` is wrapped and put back on undo; so are `Tensor.to`/`Tensor.cuda`."""

from __future__ import annotations

import ast
import functools
import inspect
from typing import Any

from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.patches.base import FixPatch, site_here

PREFETCH = 4


class _LoaderPatch(FixPatch):
    """Rewrites the keyword arguments of every DataLoader the script builds (`_rewrite`)."""

    order = 25

    def _apply(self) -> None:
        from torch.utils.data import DataLoader

        init = DataLoader.__init__
        # DataLoader's own parameters, through the wrapper of a loader patch applied before this one
        # (workers, then pinned batches on top: `functools.wraps` leaves `__wrapped__` to follow)
        signature = inspect.signature(init)
        patch = self

        @functools.wraps(init)
        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            site = site_here()
            bound = signature.bind(loader, *args, **kwargs)
            given = dict(bound.arguments)
            given.pop("self", None)
            extra = given.pop("kwargs", {})
            new = patch._rewrite({**given, **extra})
            if new and patch.first_time_at(site):
                edit = None
                if site is not None:
                    edit = Edit("set_kwargs", site.file, site.line, call="DataLoader", kwargs=new)
                shown = ", ".join(f"{k}={v}" for k, v in new.items())
                patch.snippet = f"loader = DataLoader(dataset, ..., {shown})"
                patch.changed(f"DataLoader({shown})", edit)
            init(loader, **{**given, **extra, **{k: ast.literal_eval(v) for k, v in new.items()}})
            patch._built(loader)

        self.restorer.replace(DataLoader, "__init__", __init__)
        self.not_applicable = "no DataLoader was built"

    def _rewrite(self, args: dict[str, Any]) -> dict[str, str]:
        """The keywords to set, as source text of literals; empty to leave this loader alone."""
        raise NotImplementedError

    def _built(self, loader: Any) -> None:
        """A loader the script built, as built (after every loader patch's rewrite)."""


class Workers(_LoaderPatch):
    fix_id = "workers"

    def __init__(self, ctx: Any, workers: int = 4) -> None:
        super().__init__(ctx)
        self.workers = workers
        self.name = f"workers:{workers}"

    def _rewrite(self, args: dict[str, Any]) -> dict[str, str]:
        from torch.utils.data import IterableDataset

        if isinstance(args.get("dataset"), IterableDataset):
            self.not_applicable = (
                "the dataset is an IterableDataset: each worker would yield it all unless it splits "
                "itself by torch.utils.data.get_worker_info()"
            )
            return {}
        if int(args.get("num_workers") or 0) >= self.workers:
            self.not_applicable = f"the DataLoader already has {args.get('num_workers')} workers"
            return {}
        return {
            "num_workers": str(self.workers),
            "persistent_workers": "True",
            "prefetch_factor": str(max(PREFETCH, int(args.get("prefetch_factor") or 0))),
        }


class LargerBatch(_LoaderPatch):
    fix_id = "batch"

    def __init__(self, ctx: Any, factor: int = 2) -> None:
        super().__init__(ctx)
        self.factor = factor
        self.name = f"batch:x{factor}"

    def _rewrite(self, args: dict[str, Any]) -> dict[str, str]:
        size = args.get("batch_size", 1)
        if args.get("batch_sampler") is not None or not isinstance(size, int):
            self.not_applicable = "the DataLoader has a batch_sampler or no batch_size"
            return {}
        return {"batch_size": str(size * self.factor)}


class PinMemory(_LoaderPatch):
    """Pinned batches, and `non_blocking=True` on every host-to-device copy from pinned memory (safe:
    the copy is ordered on the stream before any kernel that reads it, and the batch is not reused).

    Switchable: the loaders keep `pin_memory=True`, and switched off, DataLoader's pinning (its
    `_utils.pin_memory.pin_memory`, in the pin thread or, without workers, on the training thread)
    hands each batch on as it came, so the copies are the script's blocking ones again. With workers the
    pin thread stays on the A side, taking the batches off the workers' queue there (the script's own
    loader does that on the training thread): what the blocks measure is the pinning and the
    non-blocking copies alone, the thread's own gain left out. Batches already queued when it switches
    were made the other way: `lag()` steps (the loaders' workers × prefetch_factor) settle first."""

    fix_id = "pin_memory"
    switchable = True

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self._on = True
        self._queued = 0  # batches a loader keeps in flight: its workers × prefetch_factor

    def _apply(self) -> None:
        import torch
        from torch.utils.data._utils import pin_memory as pinning

        super()._apply()
        for method in ("to", "cuda"):
            self.restorer.replace(
                torch.Tensor, method, self._non_blocking(method, getattr(torch.Tensor, method))
            )
        original = pinning.pin_memory
        patch = self

        @functools.wraps(original)
        def pin_memory(data: Any, *args: Any, **kwargs: Any) -> Any:
            return original(data, *args, **kwargs) if patch._on else data

        self.restorer.replace(pinning, "pin_memory", pin_memory)

    def switch(self, on: bool) -> None:
        self._on = on

    def lag(self) -> int:
        """Steps after a switch whose batches may have been pinned (or not) before it."""
        return self._queued + 1 if self._queued else 0

    def _built(self, loader: Any) -> None:
        workers = int(getattr(loader, "num_workers", 0) or 0)
        if workers and getattr(loader, "pin_memory", False):
            self._queued = max(self._queued, workers * int(getattr(loader, "prefetch_factor", None) or 2))

    def _rewrite(self, args: dict[str, Any]) -> dict[str, str]:
        if args.get("pin_memory"):
            self.not_applicable = "the DataLoader already pins its batches"
            return {}
        return {"pin_memory": "True"}

    def _non_blocking(self, method: str, original: Any) -> Any:
        import torch

        patch = self
        parse = torch._C._nn._parse_to

        def copy(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if "non_blocking" in kwargs or torch.compiler.is_compiling() or tensor.device.type != "cpu":
                return original(tensor, *args, **kwargs)
            if method == "cuda":
                target = "cuda"
            else:
                try:
                    device = parse(*args, **kwargs)[0]
                except (TypeError, RuntimeError):
                    return original(tensor, *args, **kwargs)
                target = device.type if device is not None else "cpu"
            if target == "cpu" or not tensor.is_pinned():
                return original(tensor, *args, **kwargs)
            site = site_here()
            if patch.first_time_at(site):
                edit = None
                if site is not None:
                    edit = Edit(
                        "set_kwargs", site.file, site.line, call=method, kwargs={"non_blocking": "True"}
                    )
                patch.changed(f".{method}(..., non_blocking=True) from pinned memory", edit)
            return original(tensor, *args, non_blocking=True, **kwargs)

        return copy
