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


class Nudge(FixPatch):
    """The unchanged script with every floating-point parameter of the step's modules moved by one unit
    in its last place (×(1 + eps) of its dtype) at their first call: the rounding a reordered sum makes,
    once. How far its first losses land from the baseline's is the numerics guard's yardstick for a fix
    that reorders float arithmetic (compiled or fused kernels) in a loop that amplifies rounding — a
    simulation whose thresholds flip, a loss that is a small difference of large terms."""

    fix_id = "nudge"
    order = 90

    def _apply(self) -> None:
        self._moved: set[int] = set()  # parameters shared between modules move once
        self.ctx.finder.on_root(self._nudge)
        self.changed("the step's parameters moved by one unit in their last place at its first module call")

    def _nudge(self, module: object, args: tuple[object, ...]) -> None:
        import torch

        arithmetic = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # (not float8's storage)
        with torch.no_grad():
            for p in module.parameters():  # type: ignore[attr-defined]
                if id(p) not in self._moved and p.dtype in arithmetic:
                    self._moved.add(id(p))
                    p.mul_(1 + torch.finfo(p.dtype).eps)
