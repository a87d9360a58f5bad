"""The permanent change in a framework's own terms. Where the user's file hands its loop to Hugging Face's
`Trainer` (`Trainer(...).train()`) or to Lightning's (`trainer.fit(...)`), the DataLoader, the optimizer
and the forward are made inside the framework, so the line a fix's edit names is that call: the edit
would wrap the whole training in `torch.autocast` or look there for a DataLoader that is not there.
Such an edit is written as the framework's own option instead, on the call that configures it; and
where the loop is the user's own under 🤗 Accelerate, autocast is `Accelerator(mixed_precision=...)`:

| fix | Hugging Face (`TrainingArguments(...)`) | Lightning (`Trainer(...)`) |
|---|---|---|
| bfloat16 / float16 autocast | `bf16=True` / `fp16=True` | `precision="bf16-mixed"` / `"16-mixed"` |
| DataLoader workers, pinning | `dataloader_num_workers`, `dataloader_persistent_workers`, `dataloader_prefetch_factor`, `dataloader_pin_memory` | (the user's own DataLoader line, as elsewhere) |
| fused AdamW | `optim="adamw_torch_fused"` | (the user's `configure_optimizers`, as elsewhere) |

With Accelerate (one `Accelerator(...)` in the file): bfloat16 / float16 autocast around the forward is
`Accelerator(mixed_precision="bf16")` / `"fp16"`.

Other edits (and every edit in a file without such a call) are left as they are."""

from __future__ import annotations

import ast
from collections.abc import Sequence

from gpudoctor.fixes.diff import call_on_line, calls_named, parse_file, statement_on_line
from gpudoctor.fixes.edits import Edit

HF_LOADER = {
    "num_workers": "dataloader_num_workers",
    "persistent_workers": "dataloader_persistent_workers",
    "prefetch_factor": "dataloader_prefetch_factor",
    "pin_memory": "dataloader_pin_memory",
}
LIGHTNING_MODULES = ("lightning", "pytorch_lightning")
ACCELERATE_MODULES = ("accelerate",)


def in_framework_terms(edits: Sequence[Edit]) -> list[Edit]:
    """`edits` with those that land on a framework's training call rewritten as its options."""
    return [_translated(e) or e for e in edits]


def _translated(e: Edit) -> Edit | None:
    runs = _framework_call(e.file, e.line)
    if runs == "train":
        return _hugging_face(e)
    if runs == "fit":
        return _lightning(e)
    return _accelerate(e)


def _hugging_face(e: Edit) -> Edit | None:
    config = _only_call(e.file, "TrainingArguments")
    if config is None:
        return None
    if e.op == "wrap_statement" and "autocast" in e.wrap:
        return _set(e.file, config, "TrainingArguments", {_half(e.wrap, "bf16", "fp16"): "True"})
    if e.op == "set_kwargs" and e.call == "DataLoader" and call_on_line(e.file, e.line, "DataLoader") is None:
        kwargs = {HF_LOADER[k]: v for k, v in e.kwargs.items() if k in HF_LOADER}
        return _set(e.file, config, "TrainingArguments", kwargs) if kwargs else None
    if (
        e.op == "set_kwargs"
        and e.call in ("AdamW", "Adam")
        and e.kwargs.get("fused") == "True"
        and call_on_line(e.file, e.line, e.call) is None
    ):
        return _set(e.file, config, "TrainingArguments", {"optim": '"adamw_torch_fused"'})
    return None


def _lightning(e: Edit) -> Edit | None:
    if not (e.op == "wrap_statement" and "autocast" in e.wrap) or not _imports(e.file, LIGHTNING_MODULES):
        return None
    trainer = _only_call(e.file, "Trainer")
    if trainer is None:
        return None
    return _set(e.file, trainer, "Trainer", {"precision": _half(e.wrap, '"bf16-mixed"', '"16-mixed"')})


def _accelerate(e: Edit) -> Edit | None:
    if not (e.op == "wrap_statement" and "autocast" in e.wrap) or not _imports(e.file, ACCELERATE_MODULES):
        return None
    accelerator = _only_call(e.file, "Accelerator")
    if accelerator is None:
        return None
    return _set(e.file, accelerator, "Accelerator", {"mixed_precision": _half(e.wrap, '"bf16"', '"fp16"')})


def _half(wrap: str, bf16: str, fp16: str) -> str:
    return fp16 if "float16" in wrap.replace("bfloat16", "") else bf16


def _set(path: str, call: ast.Call, name: str, kwargs: dict[str, str]) -> Edit:
    return Edit("set_kwargs", path, call.lineno, call=name, kwargs=kwargs)


def _framework_call(path: str, line: int) -> str | None:
    """ "train" or "fit" where the statement on `line` calls `<something>.train(...)` / `.fit(...)`."""
    stmt = statement_on_line(path, line) if line > 0 else None
    for node in ast.walk(stmt) if stmt is not None else ():
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("train", "fit")
        ):
            return node.func.attr
    return None


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
