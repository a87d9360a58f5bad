"""The fixes of a data-parallel job's own settings: DistributedDataParallel's knobs, and gradient
accumulation that all-reduces once per optimizer step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from gpudoctor.fixes.diff import call_on_line
from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.frameworks import Framework
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
        mine = [d for d in p.obs.ddp if (d.own_call or d.framework) and d.to_set]
        if not mine:
            return []
        by = f" (built by {mine[0].framework})" if mine[0].framework else ""
        return [(self.kind, f"DistributedDataParallel without {', '.join(mine[0].to_set)}{by}")]

    def why_not(self, obs: Observations, arg: str, steps: int) -> str | None:
        if not obs.ddp:
            return "no DistributedDataParallel was built"
        if not any(d.own_call or d.framework for d in obs.ddp):
            return (
                "DistributedDataParallel is built by a library, not on a line of your files (Accelerate "
                "without kwargs_handlers of its own and the HF Trainer are written; Lightning's strategy is not)"
            )
        if not any(d.to_set for d in obs.ddp):
            if any(d.framework == "transformers" for d in obs.ddp):
                return "the Trainer's DistributedDataParallel already has find_unused_parameters=False"
            return "DistributedDataParallel already has a static graph and gradients as bucket views"
        return None

    def in_framework(self, fw: Framework, arg: str, edits: Sequence[Edit]) -> list[Edit] | None:
        """A DDP the framework built (its edit names no DistributedDataParallel call on its line): the
        knobs as the framework's option."""
        built = [e for e in edits if e.op == "set_kwargs" and call_on_line(e.file, e.line, e.call) is None]
        if not built:
            return None  # the user's own DistributedDataParallel(...) line, changed where it is
        knobs = dict(built[0].kwargs)
        if fw.name == "transformers" and knobs.get("find_unused_parameters") == "False":
            return [fw.option(ddp_find_unused_parameters="False")]
        if fw.name == "accelerate":
            given = ", ".join(f"{k}={v}" for k, v in knobs.items())
            return [
                Edit(
                    "insert_after_imports",
                    fw.file,
                    code=("from accelerate.utils import DistributedDataParallelKwargs",),
                ),
                fw.option(kwargs_handlers=f"[DistributedDataParallelKwargs({given})]"),
            ]
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
