"""channels_last for convolution models: the 4-D parameters of every top-level module with convolutions
converted (their layout put back on undo, values kept), and its 4-D tensor inputs converted by a forward
pre-hook. Switched off and on
in a running process, their gradients and the optimizers' state of them (momentum, Adam's moments) follow
their layout: left behind, a foreach or fused step would fall to its slow path (or refuse) in one configuration
only, and bias the A/B."""

from __future__ import annotations

from typing import Any

from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.patches.base import FixPatch

CONVERT = "{name} = {name}.to(memory_format=torch.channels_last)"


def conv2d_layers(module: Any) -> list[Any]:
    """The 2-D convolutions inside `module`, transposed ones too (a GAN's generator, a UNet's decoder):
    those whose weights and inputs channels_last lays out."""
    import torch

    kinds = (torch.nn.Conv2d, torch.nn.ConvTranspose2d)
    return [m for m in module.modules() if isinstance(m, kinds)]


class ChannelsLast(FixPatch):
    fix_id = "channels_last"
    order = 30
    switchable = True  # the weights converted back and forth (in the step after a switch, not timed)

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self._modules: list[Any] = []  # the top-level modules with convolutions, converted
        self._hooks: dict[int, Any] = {}  # id(module) -> its input-converting pre-hook, while on
        self._optimizers: Any = None  # the optimizers that stepped (a WeakSet), for their state's layout

    def switch(self, on: bool) -> None:
        for module in self._modules:
            self._switch(module, on)

    def _switch(self, module: Any, on: bool) -> None:
        import torch

        if (id(module) in self._hooks) == on:
            return
        layout = torch.channels_last if on else torch.contiguous_format
        if on:
            module.to(memory_format=layout)
            self._hooks[id(module)] = module.register_forward_pre_hook(self._inputs, with_kwargs=True)
        else:
            for t in (*module.parameters(), *module.buffers()):
                if t.dim() == 4:
                    t.data = t.data.contiguous()
            self._hooks.pop(id(module)).remove()
        for p in module.parameters():  # a gradient kept between steps (set_to_none=False) follows too
            if p.dim() == 4 and p.grad is not None:
                p.grad = p.grad.contiguous(memory_format=layout)
        for opt in list(self._optimizers or ()):
            for p in module.parameters():
                state = opt.state.get(p) if p.dim() == 4 else None
                for key, value in (state or {}).items():
                    if isinstance(value, torch.Tensor) and value.shape == p.shape:
                        state[key] = value.contiguous(memory_format=layout)

    def _apply(self) -> None:
        import weakref

        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._optimizers = weakref.WeakSet()
        hook = register_optimizer_step_pre_hook(lambda opt, args, kwargs: self._optimizers.add(opt))
        self.restorer.on_restore(hook.remove)
        self.ctx.finder.on_root(self._on_root)
        self.restorer.on_restore(self._remove_hooks)
        self.not_applicable = "no nn.Module with parameters was called"

    def _remove_hooks(self) -> None:
        for handle in self._hooks.values():
            handle.remove()
        self._hooks.clear()

    def _on_root(self, module: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        import torch

        if not conv2d_layers(module):
            if not self._modules:
                self.not_applicable = f"{type(module).__name__} has no 2-D convolution"
            return None
        cl = torch.channels_last
        changed = [
            t
            for t in (*module.parameters(), *module.buffers())
            if t.dim() == 4 and not t.is_contiguous(memory_format=cl)
        ]

        def back() -> None:
            for t in changed:
                t.data = t.data.contiguous()

        self.restorer.on_restore(back)
        module.to(memory_format=cl)
        self._modules.append(module)
        self._hooks[id(module)] = module.register_forward_pre_hook(self._inputs, with_kwargs=True)
        self.snippet = (
            CONVERT.format(name="model") + "\n" + CONVERT.format(name="inputs") + "  # each 4-D input batch"
        )
        seen = self.ctx.finder.seen_of(module)
        what = f"{type(module).__name__} and its 4-D inputs in channels_last"
        self.changed(what, None, module)
        if seen is not None and seen.binding is not None:
            site, bound = seen.binding
            edit = Edit("after_assignment", site.file, site.line, name=bound, code=(CONVERT,))
            self.changed(what, edit, module)
        new_args, converted = _convert(args)
        name = next((n for n in (seen.names if seen else ()) if n != "self"), "")
        if seen is not None and seen.site is not None and name:
            names = _arg_names(seen.site, name, converted)
            if names:
                code = tuple(CONVERT.format(name=n) for n in names)
                self.changed(
                    what, Edit("before_statement", seen.site.file, seen.site.line, code=code), module
                )
        return new_args

    def _inputs(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        import torch

        new_args, _ = _convert(args)
        new_kwargs = {k: _one(v, torch) for k, v in kwargs.items()}
        return new_args, new_kwargs


def _one(value: Any, torch: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() == 4:
        return value.contiguous(memory_format=torch.channels_last)
    return value


def _convert(args: tuple[Any, ...]) -> tuple[tuple[Any, ...], list[int]]:
    import torch

    converted = [  # a (N, C, 1, 1) noise batch is channels_last already: no line written for it
        i
        for i, a in enumerate(args)
        if isinstance(a, torch.Tensor)
        and a.dim() == 4
        and not a.is_contiguous(memory_format=torch.channels_last)
    ]
    return tuple(_one(a, torch) for a in args), converted


def _arg_names(site: Any, root_name: str, positions: list[int]) -> list[str]:
    """The names passed at `positions` in the root call on the site's line, where they are plain names."""
    import ast

    from gpudoctor.fixes.diff import call_on_line

    call = call_on_line(site.file, site.line, root_name)
    if call is None:
        return []
    return [call.args[i].id for i in positions if i < len(call.args) and isinstance(call.args[i], ast.Name)]
