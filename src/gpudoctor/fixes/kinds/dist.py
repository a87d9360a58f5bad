"""The fixes of a data-parallel job's own settings: DistributedDataParallel's knobs, and gradient
accumulation that all-reduces once per optimizer step."""

from __future__ import annotations

from typing import ClassVar

from gpudoctor.fixes.kinds.base import Fix, Proposing
from gpudoctor.fixes.observe import Observations
from gpudoctor.fixes.patches.base import FixPatch
from gpudoctor.fixes.patches.ddp import DdpKnobs
from gpudoctor.fixes.patches.no_sync import NoSyncPatch


class DdpFix(Fix):
    kind = "ddp"
    title = "DDP static graph, gradients as bucket views"
    rules = ("communication_exposed",)
    tolerance_note = "the same all-reduce, from buckets built once"
    patch: ClassVar[type[FixPatch]] = DdpKnobs

    def propose(self, p: Proposing) -> list[tuple[str, str]]:
        mine = [d for d in p.obs.ddp if d.own_call and d.to_set]
        if not mine:
            return []
        return [(self.kind, f"DistributedDataParallel without {', '.join(mine[0].to_set)}")]

    def why_not(self, obs: Observations, arg: str, steps: int) -> str | None:
        if not obs.ddp:
            return "no DistributedDataParallel was built"
        if not any(d.own_call for d in obs.ddp):
            return "DistributedDataParallel is built by a library, not on a line of your files"
        if not any(d.to_set for d in obs.ddp):
            return "DistributedDataParallel already has a static graph and gradients as bucket views"
        return None


class NoSyncFix(Fix):
    kind = "no_sync"
    title = "one all-reduce per optimizer step over its micro-batches (DDP no_sync)"
    rules = ("communication_exposed",)
    tolerance_note = "the same gradients, summed before the all-reduce instead of after"
    patch: ClassVar[type[FixPatch]] = NoSyncPatch

    def propose(self, p: Proposing) -> list[tuple[str, str]]:
        mine = [d for d in p.obs.ddp if d.own_call and d.micro_batches > 1 and d.synced == d.micro_batches]
        if not mine:
            return []
        k = mine[0].micro_batches
        return [
            (self.kind, f"every one of the {k} micro-batches of an optimizer step all-reduces its gradients")
        ]

    def why_not(self, obs: Observations, arg: str, steps: int) -> str | None:
        if not obs.ddp:
            return "no DistributedDataParallel was built"
        if not any(d.own_call for d in obs.ddp):
            return "DistributedDataParallel is built by a library, not on a line of your files"
        seen = [d for d in obs.ddp if d.micro_batches]
        if seen and all(d.micro_batches == 1 for d in seen):
            return "one forward per optimizer step: no micro-batches to accumulate"
        if seen and all(d.synced < d.micro_batches for d in seen):
            return "the micro-batches already skip the all-reduce (no_sync)"
        return None
