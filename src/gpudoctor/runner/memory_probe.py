"""What the user's objects hold, read from the objects themselves: the storages of parameters, buffers,
gradients and optimizer state on one device, the models found in the process, and, during one step, the
memory each module's forward keeps alive and its forward's GPU time. `ModuleProbe.install()` / `remove()`
put in and take out two global hooks. torch is imported lazily."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from gpudoctor.runner.hooks import eager_only

MAX_DEPTH = 4  # modules this deep below a root are not measured (their parents include them)


def find_roots(collect: bool = True) -> list[Any]:
    """Every nn.Module in the process that is no other module's child (a gc scan, a few times per
    run; `collect` first drops unreachable ones, so that a model the script threw away is not counted)."""
    import torch

    if collect:
        gc.collect()
    modules = [
        o for o in gc.get_objects() if issubclass(type(o), torch.nn.Module)
    ]  # type(): no __class__ lookups
    children = {id(c) for m in modules for c in m.children()}
    return [m for m in modules if id(m) not in children]


def find_optimizers() -> list[Any]:
    import torch

    return [o for o in gc.get_objects() if issubclass(type(o), torch.optim.Optimizer)]


def module_types(roots: Iterable[Any], names: dict[int, str]) -> dict[str, str]:
    """Dotted name -> class name of every module under the roots."""
    return {names[id(m)]: type(m).__name__ for root in roots for m in root.modules() if id(m) in names}


def module_names(roots: Iterable[Any]) -> dict[int, str]:
    """id(module) -> 'RootClass.path.to.it' for every module under the roots (the first name wins)."""
    names: dict[int, str] = {}
    seen: dict[str, int] = {}
    for root in roots:
        label = type(root).__name__
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            label = f"{label}#{seen[label]}"
        for path, module in root.named_modules():
            names.setdefault(id(module), f"{label}.{path}" if path else label)
    return names


def census(optimizers: Iterable[Any], roots: Iterable[Any], device: Any, step: int | None) -> dict[str, Any]:
    """Bytes and storages (address, bytes) of parameters and buffers, gradients and optimizer state on
    `device`, each storage counted once."""
    found: dict[str, dict[int, int]] = {"parameters": {}, "gradients": {}, "optimizer_state": {}}
    names = []
    for opt in optimizers:
        names.append(type(opt).__name__)
        for group in getattr(opt, "param_groups", ()):
            for p in group.get("params", ()):
                _add(found["parameters"], p, device)
                _add(found["gradients"], getattr(p, "grad", None), device)
        for state in getattr(opt, "state", {}).values():
            for value in state.values() if isinstance(state, dict) else ():
                _add(found["optimizer_state"], value, device)
    for root in roots:
        for p in root.parameters():
            _add(found["parameters"], p, device)
            _add(found["gradients"], p.grad, device)
        for b in root.buffers():
            _add(found["parameters"], b, device)
    out: dict[str, Any] = {"step": step, "optimizers": names}
    for category, storages in found.items():
        out[category] = sum(storages.values())
        out[f"{category}_storages"] = sorted([a, n] for a, n in storages.items())
    return out


def _add(into: dict[int, int], tensor: Any, device: Any) -> None:
    import torch

    if not isinstance(tensor, torch.Tensor) or tensor.device != device:
        return
    try:
        storage = tensor.untyped_storage()
        address, size = int(storage.data_ptr()), int(storage.nbytes())
    except (RuntimeError, NotImplementedError):  # sparse, meta, tensor subclasses without storage
        return
    if size > 0 and address:
        into[address] = size


class ModuleProbe:
    """During one step: for each module call up to MAX_DEPTH below a root (not in backward, so that
    activation checkpointing's recomputation is not counted twice), the allocator's counter before and
    after its forward, the bytes of its tensor inputs, and CUDA events around it."""

    def __init__(self, names: dict[int, str], allocated: Callable[[], int], cuda: bool) -> None:
        self.names = names
        self.allocated = allocated
        self.cuda = cuda
        self.calls: list[dict[str, Any]] = []
        self._stack: list[tuple[int, Any]] = []  # (id of module, open record or None)
        self._handles: list[Any] = []

    def install(self) -> ModuleProbe:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        self._handles = [  # eager only: inside a compiled graph, nothing to time module by module
            register_module_forward_pre_hook(eager_only(self._pre)),
            register_module_forward_hook(eager_only(self._post)),
        ]
        return self

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _pre(self, module: Any, args: Any) -> None:
        import torch

        depth = len(self._stack)
        in_backward = getattr(torch._C, "_current_graph_task_id", lambda: -1)() != -1
        if depth > MAX_DEPTH or in_backward:
            self._stack.append((id(module), None))
            return
        record: dict[str, Any] = {
            "name": self.names.get(id(module), type(module).__name__),
            "type": type(module).__name__,
            "depth": depth,
            "inputs": _tensor_bytes(args),
            "before": self.allocated(),
        }
        if self.cuda:
            record["start"] = torch.cuda.Event(enable_timing=True)
            record["start"].record()
        self._stack.append((id(module), record))

    def _post(self, module: Any, args: Any, output: Any) -> None:
        while self._stack:  # a forward that raised left its entry: drop it
            ident, record = self._stack.pop()
            if ident == id(module):
                break
        else:
            return
        if record is None:
            return
        import torch

        if self.cuda:
            record["end"] = torch.cuda.Event(enable_timing=True)
            record["end"].record()
        record["activations"] = self.allocated() - record.pop("before")
        self.calls.append(record)

    def modules(self) -> list[dict[str, Any]]:
        """One row per module (its calls summed): name, type, depth, activations, inputs, forward_us,
        calls. Call after the step's work is done (reading the events waits for the GPU)."""
        rows: dict[str, dict[str, Any]] = {}
        for call in self.calls:
            forward = None
            if "start" in call and "end" in call:
                call["end"].synchronize()
                forward = call["start"].elapsed_time(call["end"]) * 1e3
            row = rows.setdefault(
                call["name"],
                {
                    "name": call["name"],
                    "type": call["type"],
                    "depth": call["depth"],
                    "activations": 0,
                    "inputs": 0,
                    "forward_us": None,
                    "calls": 0,
                },
            )
            row["activations"] += call["activations"]
            row["inputs"] += call["inputs"]
            row["calls"] += 1
            if forward is not None:
                row["forward_us"] = (row["forward_us"] or 0.0) + forward
        return list(rows.values())


def _tensor_bytes(args: Any) -> int:
    import torch

    seen: dict[int, int] = {}
    for a in args if isinstance(args, tuple) else (args,):
        if isinstance(a, torch.Tensor):
            try:
                storage = a.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
            except (RuntimeError, NotImplementedError):
                continue
    return sum(seen.values())


class OptimizerWatch:
    """The optimizers the script steps (torch's global step post-hook), held weakly."""

    def __init__(self) -> None:
        self.optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        self.stepped = False
        self._handle: Any = None

    def install(self) -> OptimizerWatch:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handle = register_optimizer_step_post_hook(self._on_step)
        return self

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.stepped = True
        self.optimizers.add(optimizer)
