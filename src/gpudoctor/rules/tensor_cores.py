"""`tensor_cores_unused`: matmul and convolution time in fp32 kernels that run on the SIMT cores, not
the tensor cores (bf16 is 10-15× faster on Hopper). TensorBoard's "AMP eligible" rule, from the kernels
that actually ran; its fix follows the device (`rules.precision`): bfloat16 or TF32 from sm_80, float16
with a GradScaler on Volta and Turing, nothing before sm_70 (no tensor cores). `tf32_not_bf16`: matmuls
and convolutions on float32 tensors that do run on the tensor cores, in TF32 (cuDNN's convolutions by
default, matmuls under `set_float32_matmul_precision("high")`): bfloat16 runs them nearly twice as fast."""

from __future__ import annotations

from gpudoctor.analysis import classify
from gpudoctor.analysis.precision import LowPrecision
from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, kernel, pct, step_phrase, us
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix
from gpudoctor.rules.precision import autocast, backward, for_device, per_profile, setup
from gpudoctor.util.units import fmt_flops

# bf16 tensor cores run about 15× as fast as fp32 SIMT, so such a kernel keeps at most about 1/15 of its
# time; 0.9 leaves room for what does not speed up.
SPEEDUP_SHARE = 0.9
# bf16 against TF32 tensor cores on an H100 (8192³ matmuls; docs/results.md, "Constants"); the measured
# ceilings of the device stand in for them where the roofline has both
BF16_FLOPS, TF32_FLOPS = 775e12, 416e12

_SUMMARY = {
    "sm80+": "Run matmuls and convolutions in bfloat16 under autocast (or allow TF32 for float32).",
    "sm70": "Run matmuls and convolutions in float16 under autocast, with a GradScaler when training: "
    "Volta and Turing tensor cores take float16.",
    "pre-sm70": "This GPU has no tensor cores (they start at sm_70, Volta); float16 autocast still halves "
    "the bytes each op moves.",
    "amd": "Run matmuls and convolutions in bfloat16 under autocast: AMD's matrix cores take bfloat16 "
    "(float32 runs on them, as xf32, only on MI300).",
    "amd-xf32": "Run matmuls and convolutions in bfloat16 under autocast (or let float32 matmuls run as "
    "xf32 on MI300's matrix cores).",
    "mtia": "Run matmuls and convolutions in float16 under MTIA's autocast.",
    "unknown": "Run matmuls and convolutions in bfloat16 under autocast (or allow TF32 for float32) on "
    "Ampere (sm_80) and later; before it, in float16 with a GradScaler.",
}
_TF32_LINES = {
    "sm80+": """
# or keep float32 tensors and let matmuls use TF32 tensor cores (about 1e-3 relative precision):
torch.set_float32_matmul_precision("high")
torch.backends.cudnn.allow_tf32 = True""",
    "amd-xf32": """
# or keep float32 tensors and let matmuls run as xf32 (MI300; ROCm's hipBLASLt: HIPBLASLT_ALLOW_TF32=1):
torch.set_float32_matmul_precision("high")""",
    "unknown": """
# or, on sm_80 and later, keep float32 tensors and let matmuls use TF32 tensor cores:
torch.set_float32_matmul_precision("high")
torch.backends.cudnn.allow_tf32 = True""",
}


def _fix(p: LowPrecision) -> Fix:
    snippet = f"""\
{setup(p)}{autocast(p)}
    outputs = model(inputs)
    loss = criterion(outputs, targets)
{backward(p)}{_TF32_LINES.get(p.key, "")}"""
    return Fix(summary=_SUMMARY[p.key], snippet=snippet)


FIXES = per_profile(_fix)
FIX = FIXES["sm80+"]
# What the faster path is, where the roofline has no measured ceilings of the device.
_FASTER = {
    "sm80+": "bfloat16 tensor cores run such work an order of magnitude faster.",
    "sm70": "{device} has float16 tensor cores, several times faster than its float32 cores, and no "
    "bfloat16 or TF32 ones (those start at sm_80, Ampere): float16 autocast with a GradScaler is the way on.",
    "amd": "AMD's matrix cores run such work in bfloat16 several times faster than float32.",
    "amd-xf32": "AMD's matrix cores run such work in bfloat16 several times faster than float32.",
    "mtia": "MTIA runs such work faster in float16.",
    "unknown": "Tensor cores run such work several times to an order of magnitude faster in reduced "
    "precision: bfloat16 or TF32 from sm_80 (Ampere), float16 on sm_70-sm_75.",
}


def tensor_cores_unused(a: Analysis, f: Facts) -> Finding | None:
    p = a.low_precision
    if p.tensor_cores is False:  # nothing faster to move the work to
        return None
    fp32_us = f.per_step(a.kernels.no_tensor_core_us)
    saving_us = SPEEDUP_SHARE * fp32_us
    if f.pct(saving_us) < 1:
        return None
    names = [
        k.name for k in a.kernels.top if k.tensor_cores is False and k.category in ("matmul", "convolution")
    ]
    evidence = [
        f"{us(fp32_us)} {step_phrase(f)} ({pct(f.pct(fp32_us))}) is matmul/convolution in float32 kernels "
        f"that do not use tensor cores" + (f", e.g. {kernel(names[0])}." if names else "."),
        _against_ceilings(a, p) or _FASTER[p.key].format(device=a.device_phrase or "This GPU"),
    ]
    return finding(
        "tensor_cores_unused",
        "Matmuls and convolutions run in float32 without tensor cores",
        f.pct(saving_us),
        evidence,
        for_device(FIXES, a),
        {"fp32_matmul_conv_us": fp32_us, "step_us": f.step_us},
    )


def _against_ceilings(a: Analysis, p: LowPrecision) -> str | None:
    """Where the roofline knows their FLOPs: how close the float32 kernels are to the GPU's measured
    float32 ceiling, and how much higher its ceiling in the device's reduced precision is."""
    r = a.roofline
    if r is None or r.ceilings is None:
        return None
    fp32 = [pt for pt in r.points if pt.dtype == "float32" and pt.family in ("matmul", "convolution")]
    peak32, peak16 = r.ceilings.flops.get("float32"), r.ceilings.flops.get(p.dtype)
    time_us = sum(pt.time_us for pt in fp32)
    if not fp32 or not peak32 or not peak16 or time_us <= 0:
        return None
    achieved = sum(pt.flops for pt in fp32) / (time_us / 1e6)
    return (
        f"Where their FLOPs are known they reach {fmt_flops(achieved)}, {pct(100 * achieved / peak32)} of "
        f"the GPU's measured float32 ceiling ({fmt_flops(peak32)}): float32 is their limit. Its measured "
        f"{p.dtype} ceiling is {fmt_flops(peak16)}, {peak16 / peak32:.0f}× higher."
    )


TF32_FIX = Fix(
    summary="Run the forward (and so the backward) under bfloat16 autocast: matmuls and convolutions on "
    "bfloat16 tensor cores, and half the bytes moved between them. Keep the loss and the optimizer in "
    "float32 (autocast does).",
    snippet="""\
with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
    outputs = model(inputs)
    loss = criterion(outputs, targets)
loss.backward()
optimizer.step()""",
)


def tf32_not_bf16(a: Analysis, f: Facts) -> Finding | None:
    if a.low_precision.dtype != "bfloat16":  # TF32 runs only where bfloat16 does: nothing to move to
        return None
    tf32_us = f.per_step(a.kernels.tf32_us)
    ratio, measured_on = _bf16_over_tf32(a)
    saving_us = (1 - 1 / ratio) * tf32_us
    if f.pct(saving_us) < 1:
        return None
    names = [
        k.name
        for k in a.kernels.top
        if k.category in ("matmul", "convolution") and k.tensor_cores and classify.is_tf32(k.name)
    ]
    evidence = [
        f"{us(tf32_us)} {step_phrase(f)} ({pct(f.pct(tf32_us))}) is matmul/convolution on float32 tensors, "
        f"in TF32 on the tensor cores" + (f", e.g. {kernel(names[0])}." if names else "."),
        f"bfloat16 tensor cores run such work {ratio:.1f}× as fast ({measured_on}), and bfloat16 tensors "
        "halve the bytes every op between them moves; the estimate counts only the matmuls and convolutions.",
    ]
    return finding(
        "tf32_not_bf16",
        "Matmuls and convolutions run on float32 tensors (TF32), not bfloat16",
        f.pct(saving_us),
        evidence,
        TF32_FIX,
        {"tf32_matmul_conv_us": tf32_us, "bf16_over_tf32": ratio, "step_us": f.step_us},
    )


def _bf16_over_tf32(a: Analysis) -> tuple[float, str]:
    """How much faster bfloat16 tensor cores run a large matmul than TF32 ones, and where that was
    measured: the device's ceilings where the roofline has both, else the H100's."""
    c = a.roofline.ceilings if a.roofline is not None else None
    bf16 = c.flops.get("bfloat16") if c is not None else None
    tf32 = c.flops.get("tf32") if c is not None else None
    if c is not None and bf16 and tf32 and bf16 > tf32:
        return bf16 / tf32, f"{c.device_name}'s measured matmul ceilings"
    return BF16_FLOPS / TF32_FLOPS, "an H100's, measured on 8192³ matmuls: 775 against 416 TFLOP/s"
