"""A patch that changes nothing, for A/A comparisons (`gpudoctor fix --aa`): the unchanged script timed
against itself through the same machinery as a fix — switched in blocks of steps, or in fresh processes —
so that every verdict other than "no significant difference" it gets is a false one."""

from __future__ import annotations

from gpudoctor.fixes.patches.base import FixPatch


class NoOp(FixPatch):
    fix_id = "noop"
    order = 90
    switchable = True

    def _apply(self) -> None:
        self.changed("nothing: the unchanged script against itself (A/A)")

    def switch(self, on: bool) -> None:
        return None


class Reseed(FixPatch):
    """The unchanged script with torch's generators seeded anew at the first call of a top-level module
    (after the model is made and the loader's order drawn): its steps draw other dropout masks and samples.
    How far its first losses land from the baseline's is the numerics guard's yardstick for a fix that
    draws other masks itself (bfloat16 autocast under dropout)."""

    fix_id = "reseed"
    order = 90
    SEED = 1_000_003  # any seed but the rounds' own

    def _apply(self) -> None:
        self._done = False
        self.ctx.finder.on_root(self._reseed)
        self.changed("torch's generators seeded anew at the step's first module call")

    def _reseed(self, module: object, args: tuple[object, ...]) -> None:
        if self._done:
            return
        import torch

        torch.manual_seed(self.SEED)  # every device's generator
        self._done = True
