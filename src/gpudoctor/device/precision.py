"""What reduced-precision math a device runs fast: `low_precision(vendor, capability, arch, name)` →
one of the `PROFILES`. Every piece of advice that names a precision follows it: NVIDIA's bfloat16 and TF32
tensor cores start at compute capability 8.0 (Ampere); Volta and Turing (7.x) have float16 tensor cores
only, so float16 autocast with a GradScaler is their fix; before 7.0 there are no tensor cores. AMD's
matrix cores (CDNA, MI100 and later) take bfloat16, and float32 as xf32 only on gfx94x (MI300). MTIA's
autocast runs float16 by default."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class LowPrecision:
    key: str  # stable name of the profile: advice is written once per profile
    family: str  # what the advice calls such devices: "Volta/Turing (sm_70-sm_75)"
    dtype: str  # the torch dtype a fix names: "bfloat16" or "float16"
    grad_scaler: bool  # float16 training needs loss scaling (a GradScaler)
    tf32: bool | None  # float32 matmuls and convolutions can run on the tensor cores; None: not known
    tensor_cores: bool | None  # matrix units for reduced precision; None: not known
    autocast_device: str  # torch.autocast's device_type
    known: bool = True  # False: nothing says what the device is; the advice names both choices


AMPERE_AND_LATER = LowPrecision(
    "sm80+", "Ampere and later (sm_80+)", "bfloat16", False, True, True, "cuda"
)  # fmt: skip
VOLTA_TURING = LowPrecision("sm70", "Volta/Turing (sm_70-sm_75)", "float16", True, False, True, "cuda")
NO_TENSOR_CORES = LowPrecision(
    "pre-sm70", "before Volta (below sm_70)", "float16", True, False, False, "cuda"
)
AMD = LowPrecision("amd", "AMD (ROCm)", "bfloat16", False, False, True, "cuda")
AMD_XF32 = LowPrecision("amd-xf32", "AMD MI300 (gfx94x)", "bfloat16", False, True, True, "cuda")
MTIA = LowPrecision("mtia", "MTIA", "float16", False, False, None, "mtia")
UNKNOWN = LowPrecision("unknown", "an unrecorded GPU", "bfloat16", False, None, None, "cuda", known=False)
PROFILES: tuple[LowPrecision, ...] = (
    AMPERE_AND_LATER,
    VOLTA_TURING,
    NO_TENSOR_CORES,
    AMD,
    AMD_XF32,
    MTIA,
    UNKNOWN,
)

# Where a trace names the GPU but not its compute capability: the common data-center and workstation
# parts, by the generation that decides the advice (first match wins).
_BY_NAME: tuple[tuple[re.Pattern[str], tuple[int, int]], ...] = tuple(
    (re.compile(p, re.I), cc)
    for p, cc in (
        (r"\b(H100|H200|H800|H20|GH200)\b", (9, 0)),
        (r"\b(B100|B200|GB200|B300)\b", (10, 0)),
        (r"\b(L4|L40S?|RTX 40\d0|RTX [456]000 Ada)\b", (8, 9)),
        (r"\b(A100|A800|A30)\b", (8, 0)),
        (r"\b(A10G?|A16|A2|A40|RTX A\d000|RTX 30\d0)\b", (8, 6)),
        (r"\b(T4|RTX 20\d0|Quadro RTX|TITAN RTX)\b", (7, 5)),
        (r"\b(V100|TITAN V|GV100)\b", (7, 0)),
        (r"\b(P100)\b", (6, 0)),
        (r"\b(P4|P40|GTX 10\d0|TITAN Xp?)\b", (6, 1)),
        (r"\b(K80|K40|M40|M60)\b", (3, 7)),
    )
)


def capability_from_name(name: str | None) -> tuple[int, int] | None:
    """The compute capability of a well-known NVIDIA GPU by its name; None for others."""
    if not name:
        return None
    return next((cc for pattern, cc in _BY_NAME if pattern.search(name)), None)


def low_precision(
    vendor: str | None,
    capability: tuple[int, int] | None,
    arch: str | None = None,
    name: str | None = None,
) -> LowPrecision:
    """The profile of a device from what a trace or torch says of it: `vendor` ("NVIDIA", "AMD", "MTIA",
    as `trace.content.Accelerator` names them; None: not recorded), its compute capability, its
    architecture (AMD: "gfx90a"), its name (used where the capability is missing)."""
    if vendor == "MTIA":
        return MTIA
    if vendor == "AMD":
        return AMD_XF32 if arch and arch.startswith("gfx94") else AMD
    cc = capability or (capability_from_name(name) if vendor in (None, "NVIDIA") else None)
    if cc is None:
        return UNKNOWN
    if cc >= (8, 0):
        return AMPERE_AND_LATER
    if cc >= (7, 0):
        return VOLTA_TURING
    return NO_TENSOR_CORES


def architecture_name(capability: tuple[int, int] | None) -> str | None:
    """NVIDIA's name for a compute capability's generation: "Volta" for 7.0; None where unknown."""
    if capability is None:
        return None
    names = {
        (6, 0): "Pascal", (6, 1): "Pascal", (7, 0): "Volta", (7, 2): "Volta", (7, 5): "Turing",
        (8, 0): "Ampere", (8, 6): "Ampere", (8, 7): "Ampere", (8, 9): "Ada", (9, 0): "Hopper",
        (10, 0): "Blackwell", (12, 0): "Blackwell",
    }  # fmt: skip
    return names.get(capability)
