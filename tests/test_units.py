"""Human-readable units: three significant figures, never an exponent."""

from __future__ import annotations

import pytest

from gpudoctor.util.units import fmt_bytes, fmt_pct, fmt_rate, fmt_us


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (5, "5 B"),
        (2000, "1.95 KiB"),
        (1000 * 2**20, "1000 MiB"),
        (1023 * 2**20, "1023 MiB"),
        (1.5 * 2**30, "1.5 GiB"),
    ],
)
def test_bytes(n: float, text: str) -> None:
    assert fmt_bytes(n) == text


def test_durations_rates_and_shares() -> None:
    assert [fmt_us(0.5), fmt_us(12.3), fmt_us(4567), fmt_us(2.5e6)] == [
        "500 ns",
        "12.3 µs",
        "4.57 ms",
        "2.5 s",
    ]
    assert [fmt_us(999.7), fmt_us(999_999.9), fmt_us(0.9999)] == ["1 ms", "1 s", "1 µs"]  # no "1e+03 µs"
    assert fmt_rate(3.2e12) == "3.2 TB/s" and fmt_rate(10.7e9) == "10.7 GB/s"
    assert fmt_pct(0.256) == "25.6%" and fmt_pct(None) == "n/a"
