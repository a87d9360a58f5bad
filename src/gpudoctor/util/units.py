"""Human-readable units. Inside gpudoctor times are float µs, sizes int bytes, rates per second;
only renderers call these."""

from __future__ import annotations

import math


def fmt_us(us: float | None) -> str:
    """A duration given in µs, in the unit that keeps 3 significant figures readable."""
    if us is None or (isinstance(us, float) and math.isnan(us)):
        return "n/a"
    a = abs(float(f"{us:.3g}"))  # rounded first: 999.7 µs reads "1 ms", never "1e+03 µs"
    if a >= 1e6:
        return f"{us / 1e6:.3g} s"
    if a >= 1e3:
        return f"{us / 1e3:.3g} ms"
    if a >= 1:
        return f"{us:.3g} µs"
    return f"{us * 1e3:.3g} ns"


def fmt_bytes(n: float | None) -> str:
    """A size in bytes with binary prefixes (KiB, MiB, GiB)."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "n/a"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            # 3 significant figures, but never an exponent (1000-1023 of a unit read "1e+03" otherwise)
            return f"{value:.0f} {unit}" if unit == "B" or value >= 100 else f"{value:.3g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def fmt_rate(bytes_per_s: float | None) -> str:
    """A bandwidth in decimal GB/s (TB/s from 1000 GB/s), as vendors and nvidia-smi quote it."""
    if bytes_per_s is None or math.isnan(bytes_per_s):
        return "n/a"
    if bytes_per_s >= 1e12:
        return f"{bytes_per_s / 1e12:.3g} TB/s"
    return f"{bytes_per_s / 1e9:.3g} GB/s"


def fmt_flops(rate: float | None) -> str:
    """FLOP/s with an SI prefix: "795 TFLOP/s"."""
    if rate is None or not math.isfinite(rate):
        return "n/a"
    for unit, scale in (("PFLOP/s", 1e15), ("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if rate >= scale:
            return f"{rate / scale:.3g} {unit}"
    return f"{rate:.3g} FLOP/s"


def fmt_pct(share: float | None, digits: int = 1) -> str:
    """A share in [0, 1] as a percentage."""
    if share is None or math.isnan(share):
        return "n/a"
    return f"{share * 100:.{digits}f}%"
