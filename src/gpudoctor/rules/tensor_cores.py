"""`tensor_cores_unused`: matmul and convolution time in fp32 kernels that run on the SIMT cores, not
the tensor cores (bf16 is 10-15× faster on Hopper). TensorBoard's "AMP eligible" rule, from the kernels
that actually ran. `tf32_not_bf16`: matmuls and convolutions on float32 tensors that do run on the tensor
cores, in TF32 (cuDNN's convolutions by default, matmuls under `set_float32_matmul_precision("high")`):
bfloat16 runs them nearly twice as fast."""

from __future__ import annotations

from gpudoctor.analysis import classify
from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, kernel, pct, step_phrase, us
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix
from gpudoctor.util.units import fmt_flops

# bf16 tensor cores run about 15× as fast as fp32 SIMT, so such a kernel keeps at most about 1/15 of its
# time; 0.9 leaves room for what does not speed up.
SPEEDUP_SHARE = 0.9
# bf16 against TF32 tensor cores on an H100 (8192³ matmuls; docs/results.md, "Constants"); the measured
# ceilings of the device stand in for them where the roofline has both
BF16_FLOPS, TF32_FLOPS = 775e12, 416e12

FIX = Fix(
    summary="Run matmuls and convolutions in bfloat16 under autocast (or allow TF32 for float32).",
    snippet="""\
with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
    outputs = model(inputs)
    loss = criterion(outputs, targets)
loss.backward()
optimizer.step()

# or keep float32 tensors and let matmuls use TF32 tensor cores (about 1e-3 relative precision):
torch.set_float32_matmul_precision("high")
torch.backends.cudnn.allow_tf32 = True""",
)


def tensor_cores_unused(a: Analysis, f: Facts) -> Finding | None:
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
        _against_ceilings(a) or "bfloat16 tensor cores run such work an order of magnitude faster.",
    ]
    return finding(
        "tensor_cores_unused",
        "Matmuls and convolutions run in float32 without tensor cores",
        f.pct(saving_us),
        evidence,
        FIX,
        {"fp32_matmul_conv_us": fp32_us, "step_us": f.step_us},
    )


def _against_ceilings(a: Analysis) -> str | None:
    """Where the roofline knows their FLOPs: how close the float32 kernels are to the GPU's measured
    float32 ceiling, and how much higher its bfloat16 ceiling is."""
    r = a.roofline
    if r is None or r.ceilings is None:
        return None
    fp32 = [p for p in r.points if p.dtype == "float32" and p.family in ("matmul", "convolution")]
    peak32, peak16 = r.ceilings.flops.get("float32"), r.ceilings.flops.get("bfloat16")
    time_us = sum(p.time_us for p in fp32)
    if not fp32 or not peak32 or not peak16 or time_us <= 0:
        return None
    achieved = sum(p.flops for p in fp32) / (time_us / 1e6)
    return (
        f"Where their FLOPs are known they reach {fmt_flops(achieved)}, {pct(100 * achieved / peak32)} of "
        f"the GPU's measured float32 ceiling ({fmt_flops(peak32)}): float32 is their limit. Its measured "
        f"bfloat16 ceiling is {fmt_flops(peak16)}, {peak16 / peak32:.0f}× higher."
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
