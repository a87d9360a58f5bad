"""torch.distributions built without validating their arguments: `Distribution.__init__` checks every
parameter against its constraint (`constraint.check(value).all()`) and `log_prob` its sample, each check a
host-device synchronization on the GPU and a graph break under torch.compile — twice for every `Normal`
a policy builds per environment step. PyTorch validates by default (`__debug__`); the fix sets the class's
default off, as `torch.distributions.Distribution.set_default_validate_args(False)` does, after the
imports. A distribution the script builds with `validate_args=True` stays validated. Switched in a
running process as TF32 is: code compiled over a distribution is guarded on the flag, so each setting
compiles once (the blocks' prewarm compiles the other) and is then reused. The first `torch.compile` in a
process (dynamo's `TorchPatcher.patch`) turns the default off too: a script that compiles anything already
has it, and a fix that compiles gets it with its diff."""

from __future__ import annotations

from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.patches.base import FixPatch, PatchContext

LINE = "torch.distributions.Distribution.set_default_validate_args(False)"


class NoValidation(FixPatch):
    fix_id = "no_validation"
    order = 10
    switchable = True

    def __init__(self, ctx: PatchContext) -> None:
        super().__init__(ctx)
        self._applied = False

    def _apply(self) -> None:
        import torch

        distribution = torch.distributions.Distribution
        if not distribution._validate_args:
            self.not_applicable = "torch.distributions already skip validating their arguments" + (
                " (torch.compile, once called, turns it off in the whole process)"
                if _dynamo_patched()
                else ""
            )
            return
        self.restorer.replace(distribution, "_validate_args", False)
        self._applied = True
        edit = Edit("insert_after_imports", self.ctx.script, code=(LINE,)) if self.ctx.script else None
        self.snippet = LINE
        self.changed("torch.distributions' argument validation off", edit)

    def switch(self, on: bool) -> None:
        import torch

        if self._applied:
            torch.distributions.Distribution._validate_args = not on


def _dynamo_patched() -> bool:
    """Whether torch.compile has been called in this process: dynamo's one-time patch of torch, which
    sets the distributions' default validation off, has run."""
    import sys

    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    patch = getattr(getattr(eval_frame, "TorchPatcher", None), "patch", None)
    info = getattr(patch, "cache_info", None)
    return bool(info and info().currsize)
