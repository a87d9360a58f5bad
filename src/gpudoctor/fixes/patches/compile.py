"""`torch.compile` of the forward of every top-level module the step calls (each instance's `forward`
replaced by the compiled one, deleted on undo), in the default mode, `reduce-overhead` (CUDA graphs) or `max-autotune-no-cudagraphs`.
`exact_random` makes Inductor draw random numbers as eager PyTorch does, so that a model with dropout
gives the same losses compiled and eager (for the numerics guard); compile time is measured by the child."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.patches.forward import ForwardWrapper

MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")


class Compile(ForwardWrapper):
    fix_id = "compile"
    order = 60
    # switched off, the eager forward runs; on again, the compiled one it kept (no second compile)
    switchable = True

    def __init__(
        self, ctx: Any, mode: str = "default", backend: str = "inductor", exact_random: bool = False
    ):
        super().__init__(ctx)
        if mode not in MODES:
            raise ValueError(f"compile mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.mode = mode
        self.backend = backend
        self.exact_random = exact_random

    def _apply(self) -> None:
        if self.exact_random and self.backend == "inductor":
            import torch._inductor.config as inductor_config

            self.restorer.set_flag(inductor_config, "fallback_random", True)
        super()._apply()

    def prepare(self, module: Any) -> bool:
        mode = None if self.mode == "default" else self.mode
        # in place: the module keeps its state_dict keys (torch.compile(model) would add "_orig_mod.")
        call = "{name}.compile()" if mode is None else f'{{name}}.compile(mode="{mode}")'
        seen = self.ctx.finder.seen_of(module)
        binding = seen.binding if seen else None
        edit = None
        if binding is not None:  # after `model = ...`, wherever the loop that calls it is
            site, name = binding
            edit = Edit("after_assignment", site.file, site.line, name=name, code=(call,))
        self.snippet = call.format(name="model")
        what = f"{type(module).__name__}.forward compiled" + (f" (mode={mode})" if mode else "")
        self.changed(what, edit, module)
        return True

    def wrap(self, forward: Callable[..., Any]) -> Callable[..., Any]:
        import torch

        mode = None if self.mode == "default" else self.mode
        compiled = torch.compile(forward, mode=mode, backend=self.backend)
        finder = self.ctx.finder

        @functools.wraps(forward)
        def gated(*args: Any, **kwargs: Any) -> Any:
            # eager while the finder's global hooks are in: compiled then, Dynamo would guard on them and
            # compile everything again once they leave
            if finder.watching:
                return forward(*args, **kwargs)
            return compiled(*args, **kwargs)

        return gated
