"""torch.distributions built without validating their arguments: `Distribution.__init__` checks every
parameter against its constraint (`constraint.check(value).all()`) and `log_prob` its sample, each check a
host-device synchronization on the GPU and a graph break under torch.compile — twice for every `Normal`
a policy builds per environment step. PyTorch validates by default (`__debug__`); the fix sets the class's
default off, as `torch.distributions.Distribution.set_default_validate_args(False)` does, after the
imports. A distribution the script builds with `validate_args=True` stays validated. Not switched in a
running process: code compiled with the check would be guarded on the flag and compiled again."""

from __future__ import annotations

from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.patches.base import FixPatch

LINE = "torch.distributions.Distribution.set_default_validate_args(False)"


class NoValidation(FixPatch):
    fix_id = "no_validation"
    order = 10

    def _apply(self) -> None:
        import torch

        distribution = torch.distributions.Distribution
        if not distribution._validate_args:
            self.not_applicable = "torch.distributions already skip validating their arguments"
            return
        self.restorer.replace(distribution, "_validate_args", False)
        edit = Edit("insert_after_imports", self.ctx.script, code=(LINE,)) if self.ctx.script else None
        self.snippet = LINE
        self.changed("torch.distributions' argument validation off", edit)
