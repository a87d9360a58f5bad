"""Advice that names a precision, written once per device profile (`analysis.precision.PROFILES`): the
dtype an autocast names, the loss scaling float16 training needs, the compression hook a gradient
all-reduce can use. A rule keeps one `Fix` per profile (`per_profile`) and picks the one of its trace's
device (`for_device`); where the trace does not say what the device is, the fix names both choices."""

from __future__ import annotations

from collections.abc import Callable

from gpudoctor.analysis.precision import PROFILES, LowPrecision
from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.finding import Fix

BEFORE_AMPERE = "before sm_80 (Ampere): torch.float16, with a GradScaler"
SCALER = 'scaler = torch.amp.GradScaler("cuda")   # torch < 2.3: torch.cuda.amp.GradScaler()'


def per_profile(make: Callable[[LowPrecision], Fix]) -> dict[str, Fix]:
    """One fix per device profile, by its key."""
    return {p.key: make(p) for p in PROFILES}


def for_device(fixes: dict[str, Fix], a: Analysis) -> Fix:
    """The fix written for the analysis's device."""
    return fixes[a.low_precision.key]


def autocast(p: LowPrecision) -> str:
    """The `with torch.autocast(...)` line (its comment names the other choice where the device is unknown)."""
    line = f'with torch.autocast(device_type="{p.autocast_device}", dtype=torch.{p.dtype}):'
    return line + (f"   # {BEFORE_AMPERE}" if not p.known else "")


def backward(p: LowPrecision, optimizer: bool = True) -> str:
    """The backward (and optimizer step) after an autocast forward: through the GradScaler for float16."""
    if p.grad_scaler:
        lines = [
            "scaler.scale(loss).backward()             # scaled: small float16 gradients stay above zero"
        ]
        if optimizer:
            lines += ["scaler.step(optimizer)", "scaler.update()"]
        return "\n".join(lines)
    return "loss.backward()\noptimizer.step()" if optimizer else "loss.backward()"


def setup(p: LowPrecision) -> str:
    """What a training loop creates once before its steps under this autocast ("" for none)."""
    return SCALER + "\n" if p.grad_scaler else ""


def dtype_phrase(p: LowPrecision) -> str:
    """The precision a summary names: "bfloat16", "float16 (with a GradScaler when training)", or both
    choices where the device is unknown."""
    if not p.known:
        return "bfloat16 (float16 with a GradScaler before Ampere, sm_80)"
    if p.grad_scaler:
        return "float16 (with a GradScaler when training)"
    return p.dtype


def compress_hook(p: LowPrecision) -> str:
    """DDP's gradient compression hook for the device: bfloat16 where it has it, else float16."""
    return "bf16_compress_hook" if p.dtype == "bfloat16" else "fp16_compress_hook"


def compress_comment(p: LowPrecision) -> str:
    """The comment beside the hook where the device is unknown ("" otherwise)."""
    return " (fp16_compress_hook before Ampere, sm_80)" if not p.known else ""
