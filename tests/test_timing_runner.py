"""The measuring loop on a seeded cost model and a fake clock (no GPU, no waiting): calls per sample,
warm-up until steady (not a fixed count), the stopping rule (minimum samples and time, noise target,
timeout, maximum samples), throttled samples flagged or discarded, host latency apart, and the
Measurement that comes out (statistics, rates, warnings, JSON)."""

from __future__ import annotations

import json

import pytest

from gpudoctor.device.ceilings import Ceilings
from gpudoctor.timing import BenchOptions, Measurement, bench
from gpudoctor.timing.fakes import CostModel, FakeBackend, FakeClock, ScriptedSensor
from gpudoctor.timing.runner import choose_calls, is_steady
from gpudoctor.util.errors import UsageError


def fake_bench(
    model: CostModel, *, episode_fn=None, cold: bool = False, **options
) -> tuple[Measurement, FakeBackend]:
    clock = FakeClock()
    backend = FakeBackend(model, clock, cold=cold, throttled=episode_fn)
    sensor = ScriptedSensor(clock, episode_fn)
    m = bench(
        lambda: None, backend=backend, clock=clock, sensor=sensor, mode="cold" if cold else "hot", **options
    )
    assert backend.closed
    return m, backend


# ---- calls per sample ----
def test_short_work_is_batched_to_fill_a_sample() -> None:
    opts = BenchOptions()
    assert choose_calls(2.0, opts) == 500  # 1000 µs target / 2 µs
    assert choose_calls(400.0, opts) == 3
    assert choose_calls(5000.0, opts) == 1
    assert choose_calls(0.001, opts) == opts.max_calls_per_sample


def test_cold_mode_times_one_call_per_sample() -> None:
    assert choose_calls(2.0, BenchOptions(mode="cold")) == 1
    m, backend = fake_bench(CostModel(base_us=2.0), cold=True)
    assert backend.calls == 1 and m.calls_per_sample == 1 and m.mode == "cold"


def test_samples_are_per_call_times() -> None:
    m, backend = fake_bench(CostModel(base_us=2.0, noise=0.001))
    assert m.calls_per_sample == backend.calls
    assert 490 <= m.calls_per_sample <= 510  # 1000 µs target over the ~2 µs estimate
    assert m.median_us == pytest.approx(2.0, rel=0.01)


# ---- warm-up ----
def test_warmup_lasts_until_the_timings_are_steady() -> None:
    flat, _ = fake_bench(CostModel(base_us=100, noise=0.002))
    slow_start = CostModel(base_us=100, noise=0.002, ramp=0.5, ramp_tau=300)  # 50% slower at first
    ramp, _ = fake_bench(slow_start)
    assert flat.warmup.steady and ramp.warmup.steady
    assert ramp.warmup.samples > 3 * flat.warmup.samples  # not a fixed count
    assert flat.warmup.time_us >= 0.05e6  # at least warmup_min_s, for the clocks to rise
    # after warm-up the slow start is gone from the samples
    assert ramp.median_us == pytest.approx(100, rel=0.02)


def test_warmup_gives_up_at_its_time_limit_and_says_so() -> None:
    m, _ = fake_bench(CostModel(base_us=1000, noise=0.001, ramp=5.0, ramp_tau=300), warmup_max_s=0.1)
    assert not m.warmup.steady
    assert m.warmup.time_us >= 0.1e6
    assert any("still moving" in w for w in m.warnings)


def test_is_steady_tolerates_noise_but_not_a_trend() -> None:
    assert is_steady([100, 101, 99, 100, 100, 100, 99, 101, 100, 100], 5, 0.01)
    assert not is_steady([130, 128, 126, 124, 122, 110, 108, 106, 104, 102], 5, 0.01)
    slow_trend = [100 * (1 + 0.2 * 0.995**i) for i in range(60)]  # -0.1% per sample, still 15% high
    assert not is_steady(slow_trend, 5, 0.01)
    assert not is_steady([100, 100], 5, 0.01)


# ---- stopping rule ----
def test_quiet_work_stops_at_the_noise_target_after_the_minimums() -> None:
    m, _ = fake_bench(CostModel(base_us=100, noise=0.002), min_samples=10, min_time_s=0.25, max_noise=0.005)
    assert m.stop_reason == "noise_target"
    assert len(m.samples_us) >= 10
    sampling_s = len(m.samples_us) * (m.calls_per_sample * 100 + 30) / 1e6
    assert sampling_s >= 0.25
    assert m.stats.rel_ci <= 0.005
    assert not m.warnings


def test_noisy_work_runs_to_the_timeout_and_is_flagged() -> None:
    m, _ = fake_bench(CostModel(base_us=100, noise=0.4), timeout_s=1.0, max_noise=0.001)
    assert m.stop_reason == "timeout"
    assert 1.0 <= m.elapsed_s <= 1.1 + 0.01  # the host-latency phase adds at most a tenth
    assert any("noisy" in w for w in m.warnings)
    assert any("timeout before the noise target" in w for w in m.warnings)


def test_the_timeout_wins_over_min_samples() -> None:
    m, _ = fake_bench(CostModel(base_us=200_000, noise=0.01), timeout_s=1.0, min_samples=50)
    assert m.stop_reason == "timeout"
    assert 1 <= len(m.samples_us) < 50
    assert any("only" in w and "samples" in w for w in m.warnings)


def test_max_samples_caps_the_run() -> None:
    m, _ = fake_bench(CostModel(base_us=100, noise=0.3), min_samples=10, max_samples=40, timeout_s=100)
    assert m.stop_reason == "max_samples" and len(m.samples_us) == 40


# ---- throttling ----
def episode(t_us: float) -> bool:
    return 0.5e6 <= t_us < 0.8e6


def test_throttled_samples_are_flagged_and_kept_by_default() -> None:
    m, _ = fake_bench(CostModel(base_us=100, noise=0.002), episode_fn=episode, max_noise=1e-6, timeout_s=1.5)
    assert 0 < m.throttled_count < len(m.samples_us)
    assert "sw_thermal_slowdown" in m.clocks.reasons_seen
    assert m.clocks.available and m.clocks.max_sm_mhz == 1980
    assert len(m.used_samples_us) == len(m.samples_us)
    assert any("throttled" in w and "kept" in w for w in m.warnings)
    # a sample is flagged when the reading before or after it shows a throttle reason
    flagged_clocks = {c for c, t in zip(m.sample_sm_mhz, m.throttled, strict=True) if t}
    unflagged_clocks = {c for c, t in zip(m.sample_sm_mhz, m.throttled, strict=True) if not t}
    assert 1500.0 in flagged_clocks and unflagged_clocks == {1980.0}


def test_throttled_samples_can_be_discarded() -> None:
    kw = {"episode_fn": episode, "max_noise": 1e-6, "timeout_s": 1.5}
    kept, _ = fake_bench(CostModel(base_us=100, noise=0.002, throttle_slowdown=2.0), **kw)
    dropped, _ = fake_bench(
        CostModel(base_us=100, noise=0.002, throttle_slowdown=2.0), throttled="discard", **kw
    )
    assert len(dropped.used_samples_us) == len(dropped.samples_us) - dropped.throttled_count
    assert dropped.used_samples_us.max() < 150  # the 2× slow samples are out...
    assert kept.stats.max > 150  # ...where flagging alone keeps them
    assert any("discarded" in w for w in dropped.warnings)


def test_when_every_sample_is_throttled_they_are_all_kept() -> None:
    m, _ = fake_bench(CostModel(base_us=100), episode_fn=lambda t: True, throttled="discard")
    assert m.throttled_count == len(m.samples_us)
    assert len(m.used_samples_us) == len(m.samples_us)
    assert any("kept" in w for w in m.warnings)


# ---- cooldown, kernel time ----
def test_cooldown_rests_the_device_after_every_sample() -> None:
    m, backend = fake_bench(CostModel(base_us=100, noise=0.001), cooldown=1.0)
    sample_us = m.calls_per_sample * 100
    samples = backend.samples
    assert backend.rested_us == pytest.approx(samples * sample_us, rel=0.01)
    assert m.median_us == pytest.approx(100, rel=0.01)  # the rest is outside the samples


def test_no_cooldown_where_the_device_asks_for_none() -> None:
    _, backend = fake_bench(CostModel(base_us=100))
    assert backend.rested_us == 0


def test_kernel_time_is_recorded_on_request() -> None:
    m, _ = fake_bench(CostModel(base_us=100, noise=0.001), kernel_time=True)
    assert m.kernels is not None and m.kernels.names == ("fake_kernel",)
    assert m.kernel_stats.median == pytest.approx(90, rel=0.01)
    back = Measurement.from_json(json.loads(json.dumps(m.to_json())))
    assert back.kernels == m.kernels
    plain, _ = fake_bench(CostModel(base_us=100))
    assert plain.kernels is None and plain.kernel_stats is None


# ---- host latency, first call ----
def test_host_latency_is_measured_apart_from_device_time() -> None:
    m, _ = fake_bench(CostModel(base_us=5.0, noise=0.001, host_us=15.0))
    assert m.median_us == pytest.approx(5.0, rel=0.01)
    assert m.host_stats is not None and m.host_stats.median == pytest.approx(20.0, rel=0.02)
    assert m.first_call_us > 20 * 5.0


def test_host_latency_can_be_skipped() -> None:
    m, _ = fake_bench(CostModel(base_us=5.0), host_latency=False)
    assert m.host_latency_us == () and m.host_stats is None


# ---- rates and ceilings ----
CEILINGS = Ceilings(
    device_key="k", device_name="fake", copy_bytes_per_s=2e12, matmul_flops={"bfloat16": 800e12}
)


def test_bytes_and_flops_give_rates_and_shares_of_the_ceilings() -> None:
    clock = FakeClock()
    m = bench(lambda: None, backend=FakeBackend(CostModel(base_us=100, noise=0), clock), clock=clock,
              sensor=ScriptedSensor(clock), nbytes=100_000_000, flops=40e9, dtype="bfloat16",
              ceilings=CEILINGS)  # fmt: skip
    assert m.bandwidth == pytest.approx(1e12)
    assert m.flop_rate == pytest.approx(400e12)
    assert m.bandwidth_share == pytest.approx(0.5)
    assert m.flops_share == pytest.approx(0.5)


def test_no_ceiling_for_the_dtype_is_no_share() -> None:
    clock = FakeClock()
    m = bench(lambda: None, backend=FakeBackend(CostModel(base_us=100), clock), clock=clock,
              sensor=ScriptedSensor(clock), flops=1e9, dtype="float64", ceilings=CEILINGS)  # fmt: skip
    assert m.flop_rate is not None and m.flops_share is None
    assert m.bandwidth is None and m.bandwidth_share is None


# ---- options ----
@pytest.mark.parametrize(
    "bad",
    [
        {"mode": "warm"},
        {"method": "magic"},
        {"min_samples": 0},
        {"max_noise": -1},
        {"throttled": "ignore"},
        {"min_samples": 10, "max_samples": 5},
        {"no_such_option": 1},
    ],
)
def test_bad_options_are_usage_errors(bad: dict) -> None:
    with pytest.raises(UsageError):
        bench(lambda: None, device="cpu", **bad)


# ---- JSON ----
def test_a_measurement_survives_json_with_its_raw_samples() -> None:
    m, _ = fake_bench(CostModel(base_us=50, noise=0.01), episode_fn=episode, timeout_s=1.0, max_noise=1e-6)
    doc = json.loads(json.dumps(m.to_json(), allow_nan=False))
    assert doc["schema"] == "gpudoctor.measurement" and doc["schema_version"] == 1
    assert doc["summary"]["device_time_us"]["median"] == pytest.approx(m.median_us)
    back = Measurement.from_json(doc)
    assert back == m
    assert back.samples_us == m.samples_us and back.throttled == m.throttled
    assert back.stats == m.stats and back.warnings == m.warnings
