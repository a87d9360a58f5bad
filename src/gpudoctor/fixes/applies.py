"""Whether a fix has anything to change in this script, from what the observing baseline round saw it
do: a fix whose call site the loop never reaches per step (no `empty_cache()` in the loop, no
`zero_grad(set_to_none=False)`), or whose change is already made (TF32 already on, workers already
there), "does not apply" and is not run — timing a change that changes nothing can only produce a false
verdict."""

from __future__ import annotations

from gpudoctor.fixes.catalog import spec_of
from gpudoctor.fixes.observe import Observations


def why_not(fix: str, obs: Observations, steps: int) -> str | None:
    """Why `fix` has nothing to change here ("does not apply: …"), or None when it may."""
    reason = spec_of(fix).why_not(obs, fix.partition(":")[2], steps)
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
