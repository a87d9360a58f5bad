"""`torch.compile` of the forward of every top-level module the step calls (each instance's `forward`
replaced by the compiled one, deleted on undo), in the default mode, `reduce-overhead` (CUDA graphs) or
`max-autotune-no-cudagraphs`. `exact_random` makes Inductor draw random numbers as eager PyTorch does, so
that a model with dropout gives the same losses compiled and eager (for the numerics guard); compile time
is measured by the child.

The rounds compile what the written change compiles. `X.compile()` compiles `X._call_impl`, a frame Dynamo
skips (torch.nn's files are in its skip rules), so the first frame it compiles is the one `_call_impl`
calls: the class's forward — the frame `torch.compile(X.forward)` compiles, with the same graphs. Where
the class is torch's own (`nn.Sequential`, `nn.TransformerEncoder`, `nn.Linear`) its forward is skipped
too and `X.compile()` compiles nothing (pytorch/pytorch#150915); there the change is the runtime's own
call, `X.forward = torch.compile(X.forward)` (in place: the state_dict keys stay; `X = torch.compile(X)`
would add "_orig_mod."). The runtime compiles the forward, not `_call_impl`, so that `_call_impl` and the
hooks it runs (the finder's, channels_last's input hook) stay eager, outside what Dynamo traces or
guards on, and autocast composes beneath compile as a forward wrapper (`patches.forward`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.patches.base import FixPatch
from gpudoctor.fixes.patches.forward import ForwardWrapper, data_parallel_inner
from gpudoctor.runner.hooks import StepFunction

MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
# said beside the written line where it is not `X.compile()`
WHY_FORWARD = "  # .compile() skips torch's own modules (pytorch#150915)"


def compiles_in_place(module: Any) -> bool:
    """Whether `module.compile()` compiles the module's forward: Dynamo traces its class's forward as a
    frame of its own (a class of the user's, of transformers, of Lightning; not one of torch's own)."""
    forward = type(module).forward
    try:
        from torch._dynamo import trace_rules

        return not trace_rules.check(forward)
    except Exception:  # a torch without these rules: torch's own classes are the skipped ones
        return not str(getattr(forward, "__module__", "")).startswith("torch.")


def written_form(module: Any, mode: str | None = None) -> str:
    """The line that compiles `module` as the rounds did ("{name}" stands for the name bound to it)."""
    mode_kw = f'mode="{mode}"' if mode else ""
    if compiles_in_place(module):
        return f"{{name}}.compile({mode_kw})"
    extra = f", {mode_kw}" if mode_kw else ""
    return f"{{name}}.forward = torch.compile({{name}}.forward{extra}){WHY_FORWARD}"


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
        inner = data_parallel_inner(module)
        if inner is not None:
            code = written_form(inner, mode).replace("{name}", "{name}.module")
        else:
            code = written_form(module, mode)
        seen = self.ctx.finder.seen_of(module)
        binding = seen.binding if seen else None
        edit = None
        if binding is not None:  # after `model = ...`, wherever the loop that calls it is
            site, name = binding
            edit = Edit("after_assignment", site.file, site.line, name=name, code=(code,))
        self.snippet = code.replace("{name}", "model")
        what = f"{type(inner or module).__name__}.forward compiled" + (f" (mode={mode})" if mode else "")
        what += " inside DistributedDataParallel" if inner is not None else ""
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


class CompileFunctions(FixPatch):
    """`torch.compile` of the plain functions of the user's files that call the step's top-level modules
    (`act = torch.compile(act)` after `def act`): Dynamo traces the modules and the code between them (an
    environment's physics, a distribution's sampling, a loss) into one graph where compiling each module
    leaves that code eager. Each function's name in its module is bound to the compiled one at the first
    call of a top-level module from it (the call under way finishes eagerly), and bound back on undo;
    eager while the finder's global hooks are in (compiled then, Dynamo would guard on them)."""

    fix_id = "compile_fn"
    order = 60
    switchable = True

    def __init__(self, ctx: Any, backend: str = "inductor", exact_random: bool = False) -> None:
        super().__init__(ctx)
        self.backend = backend
        self.exact_random = exact_random
        self._on = True
        self.not_applicable = "no plain function of your files called the step's modules"

    def switch(self, on: bool) -> None:
        self._on = on

    def _apply(self) -> None:
        if self.exact_random and self.backend == "inductor":
            import torch._inductor.config as inductor_config

            self.restorer.set_flag(inductor_config, "fallback_random", True)
        self.ctx.finder.on_function(self._compile)

    def _compile(self, function: StepFunction, namespace: dict[str, Any]) -> None:
        import torch

        original = namespace[function.name]
        compiled = torch.compile(original, backend=self.backend)
        finder, patch = self.ctx.finder, self

        @functools.wraps(original)
        def gated(*args: Any, **kwargs: Any) -> Any:
            if finder.watching or not patch._on:
                return original(*args, **kwargs)
            return compiled(*args, **kwargs)

        namespace[function.name] = gated

        def undo() -> None:
            if namespace.get(function.name) is gated:
                namespace[function.name] = original

        self.restorer.on_restore(undo)
        edit = Edit("after_definition", function.file, function.line, name=function.name,
                    code=("{name} = torch.compile({name})",))  # fmt: skip
        self.changed(f"{function.name}() compiled", edit)
