"""The fixes of the input pipeline: DataLoader workers, pinned memory with non-blocking copies, and (only
where the user allows it) a larger batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.frameworks import HF_LOADER, Framework
from gpudoctor.fixes.kinds.base import Fix, Proposing
from gpudoctor.fixes.loaders import (
    LOADER_PACES,
    loader_share,
    training_loaders,
    worker_values,
    workers_needed,
)
from gpudoctor.fixes.observe import Observations
from gpudoctor.fixes.patches.base import FixPatch, PatchContext
from gpudoctor.fixes.patches.loader import LargerBatch, PinMemory, Workers

NO_LOADER = "no DataLoader is iterated"


def _iterated(obs: Observations) -> list:
    return [lo for lo in obs.loaders if lo.iterated]


class WorkersFix(Fix):
    kind = "workers"
    title = "DataLoader workers"
    rules = ("input_pipeline",)
    tolerance = None
    tolerance_note = (
        "judged on speed: the model's arithmetic is unchanged, and batches made in worker processes may "
        "draw other random numbers (random augmentation)"
    )
    speed_only = True
    patch: ClassVar[type[FixPatch]] = Workers
    example_arg = "workers:4"

    def valid_arg(self, arg: str) -> bool:
        return arg.isdigit() and int(arg) > 0

    def title_of(self, arg: str) -> str:
        return f"{self.title} ({arg})"

    def build(self, ctx: PatchContext, arg: str, *, compile_backend: str, exact_random: bool) -> FixPatch:
        return Workers(ctx, int(arg))

    def propose(self, p: Proposing) -> list[tuple[str, str]]:
        # the loaders that feed the steps (not a validation loader), each with its batches per step
        fed = [(lo, n) for lo, n in training_loaders(p.obs.loaders, p.steps) if not lo.iterable]
        loaders = [lo for lo, _ in fed]
        heavy = [(lo, n) for lo, n in fed if loader_share(lo, p.step_s, n) >= LOADER_PACES]
        if not loaders or not ("input_pipeline" in p.found or not p.found or heavy):
            return []
        have = max(lo.num_workers for lo in loaders)
        waiting = [(lo, n) for lo, n in fed if lo.waits]
        need = workers_needed(*waiting[0], step_s=p.step_s) if waiting else None
        if need:
            why = "the DataLoader waits (its batches take little CPU time): workers past the cores"
        elif "input_pipeline" in p.found or not p.found:
            why = "the GPU waits for the DataLoader"
        else:  # GPU-bound now: the loader's time overlaps the GPU's, until GPU fixes cut the step
            share = loader_share(heavy[0][0], p.step_s, heavy[0][1])
            why = f"the training thread spends {100 * share:.0f}% of the step on the DataLoader's batches"
        return [(f"workers:{n}", why) for n in worker_values(p.obs.free_cores, have, need)]

    def why_not(self, obs: Observations, arg: str, steps: int) -> str | None:
        loaders = _iterated(obs)
        if not loaders:
            return NO_LOADER
        if all(lo.iterable for lo in loaders):
            return "the DataLoader's dataset is an IterableDataset"
        if arg.isdigit() and min(lo.num_workers for lo in loaders) >= int(arg):
            return f"the DataLoader already has {min(lo.num_workers for lo in loaders)} workers"
        return None

    def in_framework(self, fw: Framework, arg: str, edits: Sequence[Edit]) -> list[Edit] | None:
        if fw.name != "transformers" or edits:  # a loader edit landing on train() is translated itself
            return None
        return [fw.option(**{HF_LOADER["num_workers"]: arg, HF_LOADER["persistent_workers"]: "True"})]


class PinMemoryFix(Fix):
    kind = "pin_memory"
    title = "pinned memory, non-blocking copies"
    rules = ("input_pipeline", "pageable_copy")
    tolerance = None
    tolerance_note = "judged on speed: the same bytes, copied asynchronously"
    speed_only = True
    patch: ClassVar[type[FixPatch]] = PinMemory

    def propose(self, p: Proposing) -> list[tuple[str, str]]:
        fed = [lo for lo, _ in training_loaders(p.obs.loaders, p.steps) if not lo.iterable]
        if (
            fed
            and p.obs.cuda
            and not all(lo.pin_memory for lo in fed)
            and ({"input_pipeline", "pageable_copy"} & set(p.found) or not p.found)
        ):
            return [(self.kind, "batches copied from pageable memory")]
        return []

    def why_not(self, obs: Observations, arg: str, steps: int) -> str | None:
        loaders = _iterated(obs)
        if not loaders:
            return NO_LOADER
        if all(lo.pin_memory for lo in loaders):
            return "the DataLoader already pins its batches"
        if not obs.cuda:
            return "no CUDA device: nothing is copied to a GPU"
        return None

    def in_framework(self, fw: Framework, arg: str, edits: Sequence[Edit]) -> list[Edit] | None:
        if fw.name != "transformers" or edits:
            return None
        return [fw.option(**{HF_LOADER["pin_memory"]: "True"})]


class LargerBatchFix(Fix):
    kind = "batch"
    title = "larger batch"
    rules = ("small_batch",)
    tolerance = None
    tolerance_note = "another batch size gives other losses: only checked to stay finite"
    patch: ClassVar[type[FixPatch]] = LargerBatch
    example_arg = "batch:x2"

    def valid_arg(self, arg: str) -> bool:
        return arg.removeprefix("x").isdigit() and int(arg.removeprefix("x")) > 1

    def title_of(self, arg: str) -> str:
        return f"{self.title} ({arg})"

    def build(self, ctx: PatchContext, arg: str, *, compile_backend: str, exact_random: bool) -> FixPatch:
        return LargerBatch(ctx, int(arg.removeprefix("x")))

    def propose(self, p: Proposing) -> list[tuple[str, str]]:
        fed = [lo for lo, _ in training_loaders(p.obs.loaders, p.steps) if not lo.iterable]
        if p.allow_batch and any(lo.batch_size for lo in fed):
            return [("batch:x2", "--allow-batch: twice the batch, timed per sample")]
        return []

    def why_not(self, obs: Observations, arg: str, steps: int) -> str | None:
        return None if _iterated(obs) else NO_LOADER
