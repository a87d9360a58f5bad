"""`torch.compile` of the root module's forward (the instance's `forward` replaced by the compiled one,
deleted on undo), in the default mode, `reduce-overhead` (CUDA graphs) or `max-autotune-no-cudagraphs`.
`exact_random` makes Inductor draw random numbers as eager PyTorch does, so that a model with dropout
gives the same losses compiled and eager (for the numerics guard); compile time is measured by the child."""

from __future__ import annotations

from typing import Any

from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.patches.base import FixPatch, ForwardSlot

MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")


class Compile(FixPatch):
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
        self._slot: ForwardSlot | None = None

    def switch(self, on: bool) -> None:
        if self._slot is not None:
            self._slot.set(on)

    def _apply(self) -> None:
        if self.exact_random and self.backend == "inductor":
            import torch._inductor.config as inductor_config

            self.restorer.set_flag(inductor_config, "fallback_random", True)
        self.ctx.finder.on_root(self._on_root)
        self.not_applicable = "no nn.Module with parameters was called"

    def _on_root(self, module: Any, args: tuple[Any, ...]) -> None:
        import torch

        mode = None if self.mode == "default" else self.mode
        compiled = torch.compile(module.forward, mode=mode, backend=self.backend)
        self._slot = ForwardSlot(module, compiled)
        self.restorer.replace(module, "forward", compiled)
        # in place: the module keeps its state_dict keys (torch.compile(model) would add "_orig_mod.")
        call = "{name}.compile()" if mode is None else f'{{name}}.compile(mode="{mode}")'
        binding = self.ctx.finder.binding
        edit = None
        if binding is not None:  # after `model = ...`, wherever the loop that calls it is
            site, name = binding
            edit = Edit("after_assignment", site.file, site.line, name=name, code=(call,))
        self.snippet = call.format(name="model")
        self.changed(f"{type(module).__name__}.forward compiled" + (f" (mode={mode})" if mode else ""), edit)
