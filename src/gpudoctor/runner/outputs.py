"""What the script computed in its first steps, for `gpudoctor fix`'s numerics guard: the losses (every
scalar `backward()` is called on) or, with no backward, a summary of the root module's output. Values
stay on the device until `values()` reads them at once, so recording adds no synchronization.
`OutputRecorder` is a patch (apply/undo), installed after the fixes' patches so that it sees the loss
before any of them (a gradient scaler) changes it."""

from __future__ import annotations

from typing import Any

from gpudoctor.runner.hooks import Restorer, RootFinder, eager_only


class OutputRecorder:
    name = "output_recorder"

    def __init__(self, finder: RootFinder, limit: int) -> None:
        self.finder = finder
        self.limit = limit
        self._losses: list[Any] = []
        self._outputs: list[Any] = []
        self._restorer = Restorer()
        self._hook: Any = None

    def apply(self) -> None:
        import torch

        original = torch.Tensor.backward
        recorder = self

        def backward(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if len(recorder._losses) < recorder.limit and tensor.dim() == 0:
                recorder._losses.append(tensor.detach().float().clone())
            return original(tensor, *args, **kwargs)

        try:
            self._restorer.replace(torch.Tensor, "backward", backward)
            self.finder.on_root(self._on_root)
        except BaseException:
            self._restorer.restore()
            raise

    def undo(self) -> None:
        self._remove_hook()
        self._restorer.restore()

    def _on_root(self, module: Any, args: tuple[Any, ...]) -> None:
        if self._hook is not None or self._outputs or module is not self.finder.root:
            return  # the first top-level module's outputs stand for the step's
        # eager only: a root found eagerly may be called inside compiled code as well, which the hook's
        # list and removal would recompile at each call
        self._hook = module.register_forward_hook(eager_only(self._on_output))

    def _on_output(self, module: Any, args: Any, output: Any) -> None:
        if len(self._outputs) >= self.limit:
            self._remove_hook()
            return
        tensor = first_float_tensor(output)
        if tensor is not None:
            import torch

            t = tensor.detach().float()
            self._outputs.append(torch.stack([t.sum(), t.abs().sum()]))

    def _remove_hook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def values(self) -> tuple[str, list[list[float]]]:
        """("loss", one [value] per step) where the script called backward on a scalar, else
        ("output", one [sum, abs sum] per root call), else ("none", [])."""
        import torch

        if self._losses:
            return "loss", [[float(v)] for v in torch.stack(self._losses).cpu().tolist()]
        if self._outputs:
            return "output", [list(map(float, v)) for v in torch.stack(self._outputs).cpu().tolist()]
        return "none", []


def first_float_tensor(value: Any, depth: int = 0) -> Any:
    """The first floating-point tensor in a module's output: a tensor, a tuple or list, a dict (a
    Hugging Face ModelOutput is one), or an object with a `logits` attribute."""
    import torch

    if isinstance(value, torch.Tensor):
        return value if value.is_floating_point() else None
    if depth > 3:
        return None
    if isinstance(value, dict):
        items: Any = value.values()
    elif isinstance(value, (tuple, list)):
        items = value
    else:
        items = [getattr(value, "logits", None)]
    for item in items:
        found = first_float_tensor(item, depth + 1)
        if found is not None:
            return found
    return None
