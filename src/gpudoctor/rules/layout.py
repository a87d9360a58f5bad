"""`conv_layout`: convolutions in NCHW under reduced precision, where cuDNN converts every activation
to NHWC and back around each tensor-core convolution."""

from __future__ import annotations

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, kernel, pct, step_phrase, us
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix

FIX = Fix(
    summary="Put the model and its inputs in channels_last memory format.",
    snippet="""\
model = model.to(memory_format=torch.channels_last)
inputs = inputs.to("cuda", memory_format=torch.channels_last, non_blocking=True)
with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
    loss = criterion(model(inputs), targets)""",
)


# The share of NCHW normalization time the layout change can save: channels_last batch norm runs faster
# NHWC kernels (docs/results.md, "Constants").
NCHW_NORM_SAVING = 0.6


def conv_layout(a: Analysis, f: Facts) -> Finding | None:
    cats = a.kernels.time_by_category_us
    if not cats.get("convolution"):
        return None
    layout_us = f.per_step(cats.get("layout", 0.0))
    if f.pct(layout_us) < 1:
        return None
    nchw_norm_us = f.per_step(a.kernels.nchw_normalization_us)
    saving_us = layout_us + NCHW_NORM_SAVING * nchw_norm_us
    names = [k.name for k in a.kernels.top if k.category == "layout"]
    evidence = [
        f"Layout conversions (NCHW↔NHWC) take {us(layout_us)} of GPU time {step_phrase(f)} "
        f"({pct(f.pct(layout_us))}), around {us(f.per_step(cats['convolution']))} of convolutions"
        + (f"; e.g. {kernel(names[0])}." if names else "."),
        "Tensor-core convolutions want NHWC; in channels_last the conversions disappear.",
    ]
    if nchw_norm_us:
        evidence.append(
            f"Batch norm runs its NCHW kernels for {us(nchw_norm_us)} {f.per}; its channels_last kernels "
            f"are about twice as fast."
        )
    return finding(
        "conv_layout",
        "Convolutions convert NCHW activations to NHWC and back",
        f.pct(saving_us),
        evidence,
        FIX,
        {
            "layout_us": layout_us,
            "nchw_normalization_us": nchw_norm_us,
            "convolution_us": f.per_step(cats["convolution"]),
        },
    )
