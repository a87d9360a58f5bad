"""Whether a fix has anything to change in this script, from what the observing baseline round saw it
do: a fix whose call site the loop never reaches per step (no `empty_cache()` in the loop, no
`zero_grad(set_to_none=False)`), or whose change is already made (TF32 already on, workers already
there), "does not apply" and is not run — timing a change that changes nothing can only produce a false
verdict."""

from __future__ import annotations

from gpudoctor.fixes.observe import Observations, SiteCount


def per_step(calls: tuple[SiteCount, ...], steps: int) -> bool:
    """Called in the loop: at least once every other step of the observing run (a call made once, at
    the start or the end of training, is not)."""
    return sum(c.count for c in calls) >= max(2, steps // 2)


def why_not(fix: str, obs: Observations, steps: int) -> str | None:
    """Why `fix` has nothing to change here ("does not apply: …"), or None when it may."""
    kind, _, arg = fix.partition(":")
    root = obs.root
    loaders = [lo for lo in obs.loaders if lo.iterated]
    reason: str | None = None
    if kind == "no_empty_cache" and not per_step(obs.empty_cache, steps):
        n = sum(c.count for c in obs.empty_cache)
        reason = f"torch.cuda.empty_cache() is not called in the loop ({n} call{'s' if n != 1 else ''} in {steps} steps)"
    elif kind == "zero_grad_none" and not per_step(obs.zero_grad_keep, steps):
        reason = "zero_grad(set_to_none=False) is not called in the loop"
    elif kind == "fused_optimizer" and not any(not o.fused and o.fusable for o in obs.optimizers):
        unfusable = sorted({o.cls for o in obs.optimizers if not o.fusable})
        reason = "no torch.optim optimizer that is not fused was built" + (
            f" ({', '.join(unfusable)} has no fused or foreach implementation)" if unfusable else ""
        )
    elif kind == "tf32" and obs.float32_matmul_precision != "highest":
        reason = f"float32 matmul precision is already {obs.float32_matmul_precision!r}"
    elif kind in ("compile", "autocast", "channels_last", "cudnn_benchmark", "sdpa") and root is None:
        reason = "no nn.Module with parameters was called"
    elif kind == "compile" and root is not None and root.compiled:
        reason = "the script compiles the model itself (torch.compile)"
    elif kind == "autocast" and root is not None and root.autocast is not None:
        reason = f"{root.cls} already runs under {root.autocast} autocast"
    elif kind == "autocast" and root is not None and root.dtype != "float32":
        reason = f"the root module's parameters are {root.dtype}, not float32"
    elif kind in ("channels_last", "cudnn_benchmark") and root is not None and not root.conv2d:
        reason = f"{root.cls} has no Conv2d"
    elif kind == "cudnn_benchmark" and not obs.cuda:
        reason = "no CUDA device: cuDNN is not used"
    elif kind == "cudnn_benchmark" and obs.cudnn_benchmark:
        reason = "torch.backends.cudnn.benchmark is already on"
    elif kind == "sdpa" and root is not None and root.hf_attention != "eager":
        reason = f"{root.cls} is not a Hugging Face model with eager attention"
    elif kind in ("workers", "pin_memory", "batch") and not loaders:
        reason = "no DataLoader is iterated"
    elif kind == "workers" and all(lo.iterable for lo in loaders):
        reason = "the DataLoader's dataset is an IterableDataset"
    elif kind == "workers" and arg.isdigit() and min(lo.num_workers for lo in loaders) >= int(arg):
        reason = f"the DataLoader already has {min(lo.num_workers for lo in loaders)} workers"
    elif kind == "pin_memory" and all(lo.pin_memory for lo in loaders):
        reason = "the DataLoader already pins its batches"
    elif kind == "pin_memory" and not obs.cuda:
        reason = "no CUDA device: nothing is copied to a GPU"
    return f"does not apply: {reason}" if reason else None


def why_not_on_top(fix: str, kept: tuple[str, ...]) -> str | None:
    """Why `fix` has nothing left to change once `kept` is (the configuration it would be tried on top
    of): TF32 under bfloat16 autocast, which runs the matmuls and convolutions — forward and backward —
    in bfloat16 (on timm's ConvNeXt it measured +0.3%, CI −0.8..+1.3%, on the H100: a block round spent).
    The script's own autocast keeps TF32 from being offered at all (`candidates`)."""
    if fix == "tf32" and "autocast" in kept:
        return (
            "does not apply: the kept bfloat16 autocast runs the matmuls and convolutions in bfloat16, "
            "leaving TF32 no float32 matmul to speed up"
        )
    return None
