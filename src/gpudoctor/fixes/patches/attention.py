"""Fused attention for Hugging Face models built with eager attention: each such top-level model switched to
PyTorch's `scaled_dot_product_attention` (`attn_implementation="sdpa"`) before its first forward, and
back on undo."""

from __future__ import annotations

from typing import Any

from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.patches.base import FixPatch

HF_BUILDERS = ("from_config", "from_pretrained")


class HFSdpa(FixPatch):
    fix_id = "sdpa"
    order = 50
    switchable = True

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self._modules: list[Any] = []  # the Hugging Face models switched

    def switch(self, on: bool) -> None:
        for module in self._modules:
            _set(module, "sdpa" if on else "eager")

    def _apply(self) -> None:
        self.ctx.finder.on_root(self._on_root)
        self.not_applicable = "no nn.Module with parameters was called"

    def _on_root(self, module: Any, args: tuple[Any, ...]) -> None:
        config = getattr(module, "config", None)
        current = getattr(config, "_attn_implementation", None)
        if current != "eager":
            if self._modules:
                return
            self.not_applicable = (
                f"{type(module).__name__} is not a Hugging Face model with eager attention"
                + (f" (it uses {current!r})" if current else "")
            )
            return
        _set(module, "sdpa")
        self._modules.append(module)
        self.restorer.on_restore(lambda: _set(module, "eager"))
        self.snippet = 'model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")'
        what = f'{type(module).__name__}: attn_implementation="sdpa" (was "eager")'
        self.changed(what, self._edit(), module)

    def _edit(self) -> Edit | None:
        """attn_implementation="sdpa" on the script's one from_config/from_pretrained call, if it has one."""
        from gpudoctor.fixes.diff import calls_named

        script = self.ctx.script
        if script is None:
            return None
        calls = [c for name in HF_BUILDERS for c in calls_named(script, name)]
        if len(calls) != 1:
            return None
        return Edit(
            "set_kwargs",
            script,
            calls[0].lineno,
            call=_name(calls[0]),
            kwargs={"attn_implementation": '"sdpa"'},
        )


def _name(call: Any) -> str:
    func = call.func
    return getattr(func, "attr", None) or getattr(func, "id", "")


def _set(module: Any, implementation: str) -> None:
    if hasattr(module, "set_attn_implementation"):
        module.set_attn_implementation(implementation)
    else:  # older transformers read the config at each forward
        module.config._attn_implementation = implementation
