"""The permanent change in a framework's own terms. Where the user's file hands its loop to Hugging Face's
`Trainer` (`Trainer(...).train()`) or to Lightning's (`trainer.fit(...)`), the DataLoader, the optimizer
and the forward are made inside the framework, so the line a fix's edit names is that call — the edit
would wrap the whole training in `torch.autocast` or look there for a DataLoader that is not there — or
a line the framework calls (a `training_step`, where `torch.autocast` works but is not how its users set
precision). Such an edit is written as the framework's own option instead, on the call that configures
it; and where the loop is the user's own under 🤗 Accelerate, autocast is `Accelerator(mixed_precision=...)`:

| fix | Hugging Face (`TrainingArguments(...)`) | Lightning (`Trainer(...)`) |
|---|---|---|
| bfloat16 / float16 autocast | `bf16=True` / `fp16=True` | `precision="bf16-mixed"` / `"16-mixed"` |
| DataLoader workers, pinning | `dataloader_num_workers`, `dataloader_persistent_workers`, `dataloader_prefetch_factor`, `dataloader_pin_memory` | (the user's own DataLoader line, as elsewhere) |
| fused AdamW | `optim="adamw_torch_fused"` | (the user's `configure_optimizers`, as elsewhere) |
| DDP without unused parameters | `ddp_find_unused_parameters=False` | (not written) |

With Accelerate (one `Accelerator(...)` in the file): bfloat16 / float16 autocast around the forward is
`Accelerator(mixed_precision="bf16")` / `"fp16"`, DDP's knobs `kwargs_handlers=[DistributedDataParallelKwargs(...)]`
(`kinds.dist.DdpFix`).

Other edits (and every edit in a file without such a call) are left as they are."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass

from gpudoctor.fixes.diff import call_on_line, calls_named, parse_file
from gpudoctor.fixes.edits import Edit

HF_LOADER = {
    "num_workers": "dataloader_num_workers",
    "persistent_workers": "dataloader_persistent_workers",
    "prefetch_factor": "dataloader_prefetch_factor",
    "pin_memory": "dataloader_pin_memory",
}
LIGHTNING_MODULES = ("lightning", "pytorch_lightning")
ACCELERATE_MODULES = ("accelerate",)


CONFIG_CALLS = {"transformers": "TrainingArguments", "lightning": "Trainer", "accelerate": "Accelerator"}


@dataclass(frozen=True)
class Framework:
    """The framework a script hands its loop (or its precision) to, and the one call that configures it."""

    name: str  # transformers, lightning, accelerate
    file: str
    call: ast.Call  # TrainingArguments(...), Trainer(...), Accelerator(...)

    def option(self, **kwargs: str) -> Edit:
        """The configuring call with these keywords (values as source text)."""
        return _set(self.file, self.call, CONFIG_CALLS[self.name], kwargs)

    def fit_model(self) -> tuple[int, str] | None:
        """Lightning: the line of `trainer.fit(model, ...)` and the name of the model it is given."""
        tree = parse_file(self.file)
        for node in ast.walk(tree) if tree is not None else ():
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "fit"
                and node.args
                and isinstance(node.args[0], ast.Name)
            ):
                return node.lineno, node.args[0].id
        return None


def framework_of(path: str | None) -> Framework | None:
    """The framework of the user's script, where it configures one in a single call."""
    if path is None:
        return None
    for name, find in (
        ("transformers", _hugging_face),
        ("lightning", _lightning),
        ("accelerate", _accelerate),
    ):
        call = find(path)
        if call is not None:
            return Framework(name, path, call)
    return None


def in_framework_terms(edits: Sequence[Edit]) -> list[Edit]:
    """`edits` with those a framework of the file has an option for rewritten as that option."""
    return [_translated(e) or e for e in edits]


def _translated(e: Edit) -> Edit | None:
    if e.op == "wrap_statement" and "autocast" in e.wrap:
        # the forward under autocast, wherever its line is (a training_step, a compute_loss, the loop)
        if (args := _hugging_face(e.file)) is not None:
            return _set(e.file, args, "TrainingArguments", {_half(e.wrap, "bf16", "fp16"): "True"})
        if (trainer := _lightning(e.file)) is not None:
            return _set(
                e.file, trainer, "Trainer", {"precision": _half(e.wrap, '"bf16-mixed"', '"16-mixed"')}
            )
        if (accelerator := _accelerate(e.file)) is not None:
            return _set(
                e.file, accelerator, "Accelerator", {"mixed_precision": _half(e.wrap, '"bf16"', '"fp16"')}
            )
        return None
    if e.op != "set_kwargs" or call_on_line(e.file, e.line, e.call) is not None:
        return None  # the call is on its line: changed where it is
    args = _hugging_face(e.file)
    if args is None:
        return None
    if e.call == "DataLoader":  # made inside Trainer: the line is the user's train()
        kwargs = {HF_LOADER[k]: v for k, v in e.kwargs.items() if k in HF_LOADER}
        return _set(e.file, args, "TrainingArguments", kwargs) if kwargs else None
    if e.call in ("AdamW", "Adam") and e.kwargs.get("fused") == "True":
        return _set(e.file, args, "TrainingArguments", {"optim": '"adamw_torch_fused"'})
    return None


def _hugging_face(path: str) -> ast.Call | None:
    """The file's one `TrainingArguments(...)`, where it also calls `.train()` (a Trainer's)."""
    return _only_call(path, "TrainingArguments") if _calls_method(path, "train") else None


def _lightning(path: str) -> ast.Call | None:
    """The file's one `Trainer(...)`, where it imports Lightning and calls `.fit()`."""
    if not _imports(path, LIGHTNING_MODULES) or not _calls_method(path, "fit"):
        return None
    return _only_call(path, "Trainer")


def _accelerate(path: str) -> ast.Call | None:
    """The file's one `Accelerator(...)`, where it imports Accelerate."""
    return _only_call(path, "Accelerator") if _imports(path, ACCELERATE_MODULES) else None


def _half(wrap: str, bf16: str, fp16: str) -> str:
    return fp16 if "float16" in wrap.replace("bfloat16", "") else bf16


def _set(path: str, call: ast.Call, name: str, kwargs: dict[str, str]) -> Edit:
    return Edit("set_kwargs", path, call.lineno, call=name, kwargs=kwargs)


def _calls_method(path: str, name: str) -> bool:
    tree = parse_file(path)
    return tree is not None and any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == name
        for n in ast.walk(tree)
    )


def _only_call(path: str, name: str) -> ast.Call | None:
    """The one call to `name` in the file (None where there is none or more than one)."""
    calls = calls_named(path, name)
    return calls[0] if len(calls) == 1 else None


def _imports(path: str, modules: tuple[str, ...]) -> bool:
    tree = parse_file(path)
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        if any(n.split(".")[0] in modules for n in names):
            return True
    return False
