"""The fixes of a data-parallel job's own settings: DistributedDataParallel's knobs."""

from __future__ import annotations

from typing import ClassVar

from gpudoctor.fixes.kinds.base import Fix, Proposing
from gpudoctor.fixes.observe import Observations
from gpudoctor.fixes.patches.base import FixPatch
from gpudoctor.fixes.patches.ddp import DdpKnobs


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
