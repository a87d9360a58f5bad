"""Mixed precision around the forward of every top-level module the step calls (float32 ones): bfloat16
autocast, or float16 with loss scaling where the GPU has no bfloat16. Each one's `forward` is wrapped (an
instance attribute, deleted on undo), and its first call, which runs before the wrapper can, is entered
under autocast too. What the forward returns leaves in float32 (accelerate's `convert_outputs_to_fp32`):
the script computes its loss outside, where a float32 target beside a bfloat16 output fails
(`BCELoss`); the change written into the script casts the same way (`output = output.float()`);
loss scaling hooks `Tensor.backward` (the scalar loss is scaled; hooked as the patch applies, where the
dtype may be float16, so that the loss recorded for the numerics guard is the unscaled one) and the
optimizers' steps (gradients unscaled before, the step skipped by dropping the gradients when they
overflowed, the scale updated after)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.patches.base import NotSwitchable
from gpudoctor.fixes.patches.forward import ForwardWrapper

# after the `with` block, where the statement assigns the module's output (a tensor) to one name (`diff`):
# the cast the runtime wrapper makes
TO_FLOAT32 = "{target} = {target}.float()"


def outputs_to_float32(output: Any) -> Any:
    """`output` with every bfloat16 or float16 tensor in it (in tuples, lists, dicts and the containers
    torch's pytree knows, e.g. transformers' ModelOutput) cast to float32; anything else as it was."""
    import torch
    from torch.utils import _pytree

    def cast(t: Any) -> Any:
        return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t

    if isinstance(output, torch.Tensor):
        return cast(output)
    return _pytree.tree_map_only(torch.Tensor, cast, output)


class Autocast(ForwardWrapper):
    fix_id = "autocast"
    order = 40
    switchable = True  # but for float16 with loss scaling (the scaler's state is the run's)

    def __init__(self, ctx: Any, dtype: str = "auto") -> None:
        super().__init__(ctx)
        self.dtype = dtype  # auto | bfloat16 | float16
        self.scaler: Any = None
        self._device = "cpu"
        self._dtype: Any = None  # resolved at the root: torch.bfloat16 or torch.float16
        self._tensor_out: set[int] = set()  # the modules whose first call returned a floating tensor

    def switch(self, on: bool) -> None:
        if self.scaler is not None:
            raise NotSwitchable("float16 autocast with loss scaling cannot be switched in a running process")
        super().switch(on)

    def _apply(self) -> None:
        super()._apply()
        if self.dtype != "bfloat16":  # float16 may need its loss scaled (the scaler comes at the root)
            self._scale_losses()

    def _scale_losses(self) -> None:
        """`Tensor.backward` hooked now, as the patch applies: beneath what the child records the loss
        with (applied after the fixes, it sees the loss unscaled) and restored in the order it was made."""
        import torch

        original = torch.Tensor.backward
        patch = self

        def backward(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            scaler = patch.scaler
            if (
                scaler is not None
                and tensor.dim() == 0
                and tensor.requires_grad
                and tensor.is_floating_point()
            ):
                tensor = scaler.scale(tensor)
            return original(tensor, *args, **kwargs)

        self.restorer.replace(torch.Tensor, "backward", backward)

    def prepare(self, module: Any) -> bool:
        import torch

        param = next(module.parameters())
        device = param.device.type
        name = type(module).__name__
        if not param.is_floating_point() or param.dtype != torch.float32:
            self.not_applicable = f"{name}'s parameters are {param.dtype}, not float32"
            return False
        if self._dtype is None:
            self._device, self._dtype = device, self._resolve(device)
        if self._dtype == torch.float16 and module.training and self.scaler is None:
            self._install_scaler(device)
        half = "bfloat16" if self._dtype == torch.bfloat16 else "float16"
        wrap = f'torch.autocast("{device}", dtype=torch.{half})'
        seen = self.ctx.finder.seen_of(module)
        site = seen.site if seen else None
        edit = Edit("wrap_statement", site.file, site.line, wrap=wrap) if site else None
        self.snippet = f"with {wrap}:\n    output = model(inputs)"
        what = f"{name}.forward under {wrap}"
        self.changed(what + (" with loss scaling" if self.scaler is not None else ""), edit, module)
        return True

    def first_call(self, module: Any) -> Any:
        import torch

        return torch.autocast(device_type=self._device, dtype=self._dtype)

    def _written(self, module_id: int | None, edit: Edit | None) -> list[Edit | None]:
        """The change at the module's first call line, and the same at every other line the step called it
        from while the finder watched (`call`: written only where that line calls the module itself,
        `out = netD(x).view(-1)`, not a loss around it: `BCELoss` fails under autocast); each followed by
        the cast of its output where that is a tensor."""
        seen = self.ctx.finder.seen.get(module_id) if module_id is not None else None
        if edit is None or edit.op != "wrap_statement" or seen is None:
            return [edit]
        if module_id in self._tensor_out:
            edit = replace(edit, code=(TO_FLOAT32,))
        others = [replace(edit, file=s.file, line=s.line, call=seen.names[0]) for s in seen.other_sites]
        return [edit, *(others if seen.names else [])]

    def first_output(self, module: Any, output: Any) -> Any:
        import torch

        if isinstance(output, torch.Tensor) and output.is_floating_point():
            self._tensor_out.add(id(module))
        return outputs_to_float32(output)

    def wrap(self, forward: Callable[..., Any]) -> Callable[..., Any]:
        import torch

        device, dtype = self._device, self._dtype

        @functools.wraps(forward)
        def autocast_forward(*a: Any, **k: Any) -> Any:
            with torch.autocast(device_type=device, dtype=dtype):
                output = forward(*a, **k)
            return outputs_to_float32(output)

        return autocast_forward

    def _resolve(self, device: str) -> Any:
        import torch

        if self.dtype != "auto":
            return getattr(torch, self.dtype)
        if device == "cuda" and not torch.cuda.is_bf16_supported():
            return torch.float16
        return torch.bfloat16

    def _install_scaler(self, device: str) -> None:
        """torch.amp.GradScaler driven from hooks: the script's own backward/step calls stay as written."""
        import torch
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        scaler = torch.amp.GradScaler(device)
        self.scaler = scaler

        def before_step(optimizer: Any, args: Any, kwargs: Any) -> None:
            scaler.unscale_(optimizer)
            state = scaler._per_optimizer_states[id(optimizer)]
            if sum(float(v.item()) for v in state["found_inf_per_device"].values()):
                for group in optimizer.param_groups:  # overflow: no update this step
                    for p in group["params"]:
                        p.grad = None

        def after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
            scaler.update()

        pre = register_optimizer_step_pre_hook(before_step)
        self.restorer.on_restore(pre.remove)
        post = register_optimizer_step_post_hook(after_step)
        self.restorer.on_restore(post.remove)
