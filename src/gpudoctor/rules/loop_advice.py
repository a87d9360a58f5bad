"""Advice fitted to the loop: what kind of loop a trace recorded (training, inference, `generate`), with
a loader or not, and the model's name where the trace or the run says it — and the code a host-side
finding shows for that loop. A training loop's snippet (DataLoader workers, `loss.item()`) is wrong for an
inference loop without a loader, and both are wrong for `generate`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Fix

TRAINING, INFERENCE, GENERATE = "training", "inference", "generate"
_BACKWARD = re.compile(r"Backward\d*$|^autograd::engine::evaluate_function")
_CALL = re.compile(r"one call of (?:[\w.]*\.)?(\w+)\.(forward|generate)\b")
_GENERATE = re.compile(r"\bgenerate\b")


@dataclass(frozen=True)
class Loop:
    kind: str  # TRAINING, INFERENCE or GENERATE
    loader: bool  # batches come from a DataLoader
    model: str | None  # the model's class, where the trace or `gpudoctor run` names it ("BertModel")
    half: str = "bfloat16"  # the 16-bit dtype the device runs fast (analysis.precision): float16 before sm_80


def loop_of(a: Analysis, f: Facts) -> Loop:
    """The loop the trace recorded, from what ran in its steps."""
    source = a.steps_source
    said = " ".join(filter(None, (source.description, source.call) if source else ()))
    m = _CALL.search(said)
    model = m.group(1) if m else (source.call if source and source.call else None)
    evidence = a.batch_evidence or ()
    loader = f.dataloader_us > 0 or any("DataLoader" in e for e in evidence)
    generate = bool(source and source.calls_per_step) or bool(_GENERATE.search(said))
    training = (
        f.optimizer_us > 0
        or any("optimizer" in e for e in evidence)
        or any(_BACKWARD.search(o.name) for o in a.ops)
    )
    kind = TRAINING if training else GENERATE if generate else INFERENCE
    return Loop(kind, loader, model, a.low_precision.dtype)


def host_python_fix(loop: Loop) -> Fix:
    """What takes the host's Python off the critical path, written for this loop."""
    model = loop.model or "model"
    named = f"  # your {loop.model}" if loop.model else ""
    if loop.kind == GENERATE:
        return Fix(
            summary="Generation runs one forward per token from Python: a static KV cache lets "
            "torch.compile capture the decoding step as CUDA graphs, so each token is one launch; "
            "generate for several prompts at once.",
            snippet=f"""\
{model.lower()}.generation_config.cache_implementation = "static"   # fixed-shape KV cache{named}
{model.lower()}.forward = torch.compile({model.lower()}.forward, mode="reduce-overhead", fullgraph=True)
out = {model.lower()}.generate(**inputs, max_new_tokens=128)            # batch prompts: inputs of several""",
        )
    if loop.kind == INFERENCE:
        feed = (
            "loader = DataLoader(dataset, batch_size=64, num_workers=8, pin_memory=True)  # larger batches\n"
            if loop.loader
            else ""
        )
        return Fix(
            summary="The host's Python between ops is the step: capture the forward as CUDA graphs "
            '(torch.compile(mode="reduce-overhead")), give each call more work (a larger batch), and run '
            "it in half precision; keep results on the GPU and read them back in batches.",
            snippet=f"""\
{feed}{model.lower()} = {model.lower()}.to(torch.{loop.half}).eval(){named}
compiled = torch.compile({model.lower()}, mode="reduce-overhead")   # CUDA graphs: one launch per call
with torch.inference_mode():
    for batch in batches:                             # 8 -> 64 samples per call: fewer calls per sample
        preds.append(compiled(batch.to("cuda", torch.{loop.half}, non_blocking=True)).argmax(-1))
results = torch.cat(preds).cpu()                      # one read back at the end, not one per call""",
        )
    loader_lines = (
        "loader = torch.utils.data.DataLoader(dataset, batch_size=64, num_workers=8,   # prepare data in workers\n"
        "                                     pin_memory=True, persistent_workers=True)\n"
        if loop.loader
        else ""
    )
    return Fix(
        summary="Take per-step Python off the training thread's critical path: log and compute metrics every "
        "N steps, prepare data in DataLoader workers, keep values on the GPU; torch.compile removes the "
        "framework's own Python between ops. In a data-parallel run, every rank waits for the slowest one.",
        snippet=f"""\
{loader_lines}compiled_step = torch.compile(train_step)          # fewer Python-level ops per step{named}
for step, (inputs, targets) in enumerate(loader):
    loss = compiled_step(inputs.to("cuda", non_blocking=True), targets.to("cuda", non_blocking=True))
    if step % 100 == 0:                              # log rarely: reading the loss syncs too
        print(f"step {{step}} loss {{loss.item():.4f}}")""",
    )


def host_sync_fix(loop: Loop, training_fix: Fix) -> Fix:
    """Reading results back every step, written for this loop (a training loop: `training_fix`)."""
    if loop.kind == TRAINING:
        return training_fix
    model = (loop.model or "model").lower()
    return Fix(
        summary="Keep each call's results on the GPU and read them back in batches (or copy them into "
        "pinned memory with non_blocking=True and read them a step later); find hidden syncs with "
        "torch.cuda.set_sync_debug_mode.",
        snippet=f"""\
torch.cuda.set_sync_debug_mode("warn")       # warns at every synchronizing call (debug only)
preds = []
with torch.inference_mode():
    for batch in batches:
        preds.append({model}(batch).argmax(-1))   # stays on the GPU: no .item() / .cpu() / print per call
        if len(preds) == 64:                      # one synchronization every 64 calls
            results.extend(torch.cat(preds).tolist())
            preds.clear()""",
    )


# Every variant, unnamed: what tests/test_rules_fixes.py checks compiles against the installed torch.
HOST_PYTHON_FIXES = {
    f"{kind}{'+loader' if loader else ''}": host_python_fix(Loop(kind, loader, None))
    for kind in (TRAINING, INFERENCE, GENERATE)
    for loader in (False, True)
} | {f"{INFERENCE}+float16": host_python_fix(Loop(INFERENCE, False, None, "float16"))}
HOST_SYNC_INFERENCE_FIX = host_sync_fix(Loop(INFERENCE, False, None), Fix("", ""))
