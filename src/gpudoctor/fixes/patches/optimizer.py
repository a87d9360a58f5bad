"""The optimizer step in one or a few kernels: `fused=True` (or `foreach=True` where fused kernels do not
take these parameters) given to every torch.optim optimizer the script constructs, by wrapping the
classes' constructors; and `zero_grad(set_to_none=True)` wherever the script asked to keep zeroed grads.

The fused flag switches in a running process (its A/B in blocks, as TF32's does): torch.optim's step
reads `fused` and `foreach` from each parameter group at every call, so `switch` sets them back to what
the script asked for and again to the fix's. A fused step keeps each parameter's step count on its
device, a foreach step without `capturable` on the CPU: the counts move with the switch (a foreach
step reading counts on the GPU would synchronize on each), and `_step_supports_amp_scaling` (what a
GradScaler asks of a fused optimizer) follows the flag."""

from __future__ import annotations

import inspect
import weakref
from typing import Any

from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.patches.base import FixPatch, site_here

OPTIMIZERS = (
    "Adam",
    "AdamW",
    "SGD",
    "Adagrad",
    "Adamax",
    "NAdam",
    "RAdam",
    "RMSprop",
    "Rprop",
    "ASGD",
    "Adadelta",
)


class FusedOptimizer(FixPatch):
    fix_id = "fused_optimizer"
    order = 20
    switchable = True

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        # each optimizer the fix changed: (a weak reference, the script's flags, the fix's flags)
        self._made: list[tuple[Any, dict[str, Any], dict[str, Any]]] = []
        self._on = True

    def switch(self, on: bool) -> None:
        if on == self._on:
            return
        self._on = on
        for ref, script, fix in self._made:
            opt = ref()
            if opt is not None:
                _set_flags(opt, fix if on else script)

    def _apply(self) -> None:
        import torch

        for name in OPTIMIZERS:
            cls = getattr(torch.optim, name, None)
            if cls is None or "__init__" not in vars(cls):
                continue
            accepts = inspect.signature(cls.__init__).parameters
            if "foreach" in accepts or "fused" in accepts:
                self.restorer.replace(cls, "__init__", self._wrap(cls, cls.__init__, "fused" in accepts))
        self.not_applicable = (
            "no torch.optim optimizer with a fused or foreach implementation was constructed"
        )

    def _wrap(self, cls: type, init: Any, can_fuse: bool) -> Any:
        patch = self

        def __init__(opt: Any, params: Any, *args: Any, **kwargs: Any) -> None:
            if patch._inside:  # AdamW's constructor calls Adam's: the outer one decided
                init(opt, params, *args, **kwargs)
                return
            patch._inside = True
            try:
                patch._construct(cls, init, can_fuse, opt, params, args, kwargs, site_here())
            finally:
                patch._inside = False

        return __init__

    _inside = False

    def _construct(
        self,
        cls: type,
        init: Any,
        can_fuse: bool,
        opt: Any,
        params: Any,
        args: Any,
        kwargs: dict[str, Any],
        site: Any,
    ) -> None:
        params = list(params)  # a generator would be spent by a first attempt
        if kwargs.get("fused") or kwargs.get("differentiable"):
            self.not_applicable = f"{cls.__name__} is already fused (or differentiable)"
            init(opt, params, *args, **kwargs)
            return
        fused = can_fuse and _fusable(params)
        if not fused and kwargs.get("foreach"):
            self.not_applicable = f"{cls.__name__} already uses foreach and cannot be fused here"
            init(opt, params, *args, **kwargs)
            return
        new = {"fused": True, "foreach": None} if fused else {"foreach": True}
        was = ", ".join(f"{k}={kwargs[k]}" for k in ("foreach", "fused") if k in kwargs) or "defaults"
        init(opt, params, *args, **{**kwargs, **new})
        script = {"fused": kwargs.get("fused"), "foreach": kwargs.get("foreach")}
        self._made.append((weakref.ref(opt), script, {**script, **new}))
        if not self._on:  # built while the script's side runs (a second optimizer, mid-loop)
            _set_flags(opt, script)
        if not self.first_time_at(site):
            return
        shown = {k: "True" for k, v in new.items() if v}
        drop = tuple(k for k in ("foreach", "fused") if k not in shown)
        edit = None
        if site is not None:
            edit = Edit("set_kwargs", site.file, site.line, call=cls.__name__, kwargs=shown, drop=drop)
        what = ", ".join(f"{k}=True" for k in shown)
        self.snippet = f"optimizer = torch.optim.{cls.__name__}(model.parameters(), ..., {what})"
        self.changed(f"{cls.__name__}({what}) (was {was})", edit)


def _set_flags(opt: Any, flags: dict[str, Any]) -> None:
    """Give every parameter group of `opt` these `fused`/`foreach` flags, its step counts where that
    kind of step keeps them (the device for fused or capturable, else the CPU)."""
    fused = bool(flags.get("fused"))
    for group in opt.param_groups:
        for k in ("fused", "foreach"):
            if k in group:
                group[k] = flags.get(k)
        on_device = fused or bool(group.get("capturable"))
        for p in group["params"]:
            state = opt.state.get(p)
            step = state.get("step") if state else None
            if step is None or not hasattr(step, "to"):
                continue
            want = p.device if on_device else "cpu"
            if str(step.device) != str(want):
                state["step"] = step.to(want)
    opt._step_supports_amp_scaling = fused


def _fusable(params: list[Any]) -> bool:
    """Every parameter a floating-point tensor on a device with fused optimizer kernels."""
    import torch
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    devices = set(_get_fused_kernels_supported_devices())
    tensors = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
    return bool(tensors) and all(
        isinstance(t, torch.Tensor) and t.is_floating_point() and t.device.type in devices for t in tensors
    )


class ZeroGradSetToNone(FixPatch):
    fix_id = "zero_grad_none"
    order = 20
    switchable = True
    _on = True

    def switch(self, on: bool) -> None:
        self._on = on

    def _apply(self) -> None:
        import torch

        for owner in (torch.optim.Optimizer, torch.nn.Module):
            self.restorer.replace(owner, "zero_grad", self._wrap(owner.zero_grad))
        self.not_applicable = "zero_grad was never called with set_to_none=False"

    def _wrap(self, zero_grad: Any) -> Any:
        patch = self

        def wrapper(obj: Any, set_to_none: bool = True) -> None:
            if not patch._on:
                zero_grad(obj, set_to_none=set_to_none)
                return
            if not set_to_none:
                site = site_here()
                if patch.first_time_at(site):
                    edit = None
                    if site is not None:
                        edit = Edit(
                            "set_kwargs",
                            site.file,
                            site.line,
                            call="zero_grad",
                            kwargs={"set_to_none": "True"},
                        )
                    patch.snippet = "optimizer.zero_grad(set_to_none=True)"
                    patch.changed(f"{type(obj).__name__}.zero_grad(set_to_none=True)", edit)
            zero_grad(obj, set_to_none=True)

        return wrapper
