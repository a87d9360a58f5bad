"""The fixes of the training loop's own calls: a fused optimizer, zero_grad(set_to_none=True), no
torch.cuda.empty_cache() per step, no argument validation in torch.distributions; and the fix that
changes nothing (the A/A's) and the rounds of the numerics guard's yardsticks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.frameworks import Framework
from gpudoctor.fixes.kinds.base import Fix, Proposing
from gpudoctor.fixes.observe import Observations, SiteCount
from gpudoctor.fixes.patches.base import FixPatch
from gpudoctor.fixes.patches.distributions import NoValidation
from gpudoctor.fixes.patches.memory import NoEmptyCache
from gpudoctor.fixes.patches.noop import NoOp, Nudge, Reseed
from gpudoctor.fixes.patches.optimizer import FusedOptimizer, ZeroGradSetToNone


def per_step(calls: tuple[SiteCount, ...], steps: int) -> bool:
    """Called in the loop: at least once every other step of the observing run (a call made once, at
    the start or the end of training, is not)."""
    return sum(c.count for c in calls) >= max(2, steps // 2)


class FusedOptimizerFix(Fix):
    kind = "fused_optimizer"
    title = "fused optimizer"
    rules = ("optimizer_unfused",)
    tolerance_note = "the same update in fewer kernels"
    reorders = True
    patch: ClassVar[type[FixPatch]] = FusedOptimizer

    def propose(self, p: Proposing) -> list[tuple[str, str]]:
        if any(not o.fused and o.fusable for o in p.obs.optimizers):
            return [(self.kind, "an optimizer that is not fused")]
        return []

    def why_not(self, obs: Observations, arg: str, steps: int) -> str | None:
        if any(not o.fused and o.fusable for o in obs.optimizers):
            return None
        unfusable = sorted({o.cls for o in obs.optimizers if not o.fusable})
        return "no torch.optim optimizer that is not fused was built" + (
            f" ({', '.join(unfusable)} has no fused or foreach implementation)" if unfusable else ""
        )

    def in_framework(self, fw: Framework, arg: str, edits: Sequence[Edit]) -> list[Edit] | None:
        # the Trainer makes its optimizer itself: its own option (the edit lands on the train() line)
        if fw.name == "transformers" and not any(e.file == fw.file and _on_own_call(e) for e in edits):
            return [fw.option(optim='"adamw_torch_fused"')]
        return None


def _on_own_call(e: Edit) -> bool:
    from gpudoctor.fixes.diff import call_on_line

    return e.op == "set_kwargs" and call_on_line(e.file, e.line, e.call) is not None


class ZeroGradNoneFix(Fix):
    kind = "zero_grad_none"
    title = "zero_grad(set_to_none=True)"
    rules = ("optimizer_unfused",)
    tolerance_note = "gradients start from None instead of zeros"
    patch: ClassVar[type[FixPatch]] = ZeroGradSetToNone

    def propose(self, p: Proposing) -> list[tuple[str, str]]:
        return [(self.kind, "zero_grad(set_to_none=False)")] if p.obs.zero_grad_keep else []

    def why_not(self, obs: Observations, arg: str, steps: int) -> str | None:
        if not per_step(obs.zero_grad_keep, steps):
            return "zero_grad(set_to_none=False) is not called in the loop"
        return None


class NoEmptyCacheFix(Fix):
    kind = "no_empty_cache"
    title = "no empty_cache() in the loop"
    rules = ("allocator_thrash",)
    tolerance_note = "memory is reused instead of returned"
    patch: ClassVar[type[FixPatch]] = NoEmptyCache

    def propose(self, p: Proposing) -> list[tuple[str, str]]:
        return [(self.kind, "torch.cuda.empty_cache() inside the loop")] if p.obs.empty_cache else []

    def why_not(self, obs: Observations, arg: str, steps: int) -> str | None:
        if not per_step(obs.empty_cache, steps):
            n = sum(c.count for c in obs.empty_cache)
            return f"torch.cuda.empty_cache() is not called in the loop ({n} call{'s' if n != 1 else ''} in {steps} steps)"
        return None


class NoValidationFix(Fix):
    kind = "no_validation"
    title = "no argument validation in torch.distributions"
    tolerance_note = "the same values, unchecked"
    patch: ClassVar[type[FixPatch]] = NoValidation

    def propose(self, p: Proposing) -> list[tuple[str, str]]:
        calls = p.obs.validated_distributions
        if not p.obs.cuda or not per_step(calls, p.steps):
            return []
        n = sum(c.count for c in calls)
        return [
            (
                self.kind,
                f"{n} distributions built with their arguments checked in {p.steps} steps (each check synchronizes)",
            )
        ]

    def why_not(self, obs: Observations, arg: str, steps: int) -> str | None:
        if not per_step(obs.validated_distributions, steps):
            return "the loop builds no torch.distributions object that validates its arguments"
        return None


class NoOpFix(Fix):
    kind = "noop"
    title = "nothing (A/A)"
    tolerance_note = "the unchanged script"
    patch: ClassVar[type[FixPatch]] = NoOp


class ReseedFix(Fix):
    """Not a fix: the numerics guard's yardstick round (`patches.noop.Reseed`), never proposed."""

    kind = "reseed"
    title = "the step's random draws reseeded"
    tolerance = None
    tolerance_note = "the unchanged script, other random draws"
    patch: ClassVar[type[FixPatch]] = Reseed


class NudgeFix(Fix):
    """Not a fix: the numerics guard's yardstick round for fixes that reorder float arithmetic
    (`patches.noop.Nudge`), never proposed."""

    kind = "nudge"
    title = "the step's parameters moved by one ulp"
    tolerance = None
    tolerance_note = "the unchanged script, its weights one ulp off"
    patch: ClassVar[type[FixPatch]] = Nudge
