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

        self.restorer.replace(DataLoader, "__init__", __init__)
        self.not_applicable = "no DataLoader was built"

    def _rewrite(self, args: dict[str, Any]) -> dict[str, str]:
        """The keywords to set, as source text of literals; empty to leave this loader alone."""
        raise NotImplementedError


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
    the copy is ordered on the stream before any kernel that reads it, and the batch is not reused)."""

    fix_id = "pin_memory"

    def _apply(self) -> None:
        import torch

        super()._apply()
        for method in ("to", "cuda"):
            self.restorer.replace(
                torch.Tensor, method, self._non_blocking(method, getattr(torch.Tensor, method))
            )

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
