"""The same API on the CPU: the CPU backend timed by a fake clock (exact figures), then for real on tiny
functions; garbage collection restored, `.grad` reset between calls, cold mode flushing; device
resolution; the measured-ceilings cache; and importing gpudoctor.timing without importing torch."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.device import ceilings as dc
from gpudoctor.timing import bench, resolve_device
from gpudoctor.timing.clock import NoSensor
from gpudoctor.timing.cpu_backend import CpuBackend, llc_bytes
from gpudoctor.timing.fakes import FakeClock
from gpudoctor.util.errors import NoGpuError, UsageError

torch = pytest.importorskip("torch")


def test_the_cpu_backend_times_with_the_host_clock() -> None:
    # GIVEN a function that costs exactly 3 µs of fake time
    clock = FakeClock()
    fn = lambda: clock.advance(3.0)  # noqa: E731
    # WHEN it is benched on the CPU backend with that clock
    backend = CpuBackend(fn, clock=clock)
    m = bench(fn, backend=backend, clock=clock, sensor=NoSensor("CPU"), min_time_s=0.01)
    # THEN every sample is 3 µs per call, batched to about the 1 ms sample target
    assert m.method == "host_timer"
    assert set(m.samples_us) == {3.0}
    assert m.calls_per_sample == 334
    assert m.stats.rel_ci == 0 and m.stop_reason == "noise_target"
    assert m.first_call_us == 3.0
    assert m.host_latency_us == ()  # on the CPU the samples are what the caller waits


def test_a_real_cpu_bench_of_a_tiny_function() -> None:
    m = bench(lambda: sum(range(50)), device="cpu", min_time_s=0.02, timeout_s=1.0)
    assert m.device == "cpu" and m.method == "host_timer"
    assert 0.01 < m.median_us < 100
    assert len(m.samples_us) >= 10 and m.calls_per_sample > 1
    assert m.environment.torch == torch.__version__ and m.environment.python
    assert not m.clocks.available


def test_args_and_kwargs_are_passed_and_cpu_tensors_pick_the_cpu() -> None:
    seen = []
    x = torch.ones(4)
    bench(lambda t, k=0: seen.append((t, k)), x, fn_kwargs={"k": 7}, min_time_s=0.0, timeout_s=0.2)
    assert seen and seen[0][0] is x and seen[0][1] == 7


def test_garbage_collection_is_off_while_timing_and_restored_after() -> None:
    states = []
    bench(lambda: states.append(gc.isenabled()), device="cpu", min_time_s=0.0, timeout_s=0.2, max_samples=20)
    assert not any(states)
    assert gc.isenabled()


def test_gc_is_restored_when_the_function_raises() -> None:
    def boom() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        bench(boom, device="cpu")
    assert gc.isenabled()


def test_grad_to_none_resets_grads_before_each_call() -> None:
    w = torch.ones(8, requires_grad=True)
    grads = []

    def step() -> None:
        grads.append(w.grad is None)
        (w * 2).sum().backward()

    bench(step, device="cpu", grad_to_none=[w], min_time_s=0.0, timeout_s=0.3, max_samples=20)
    assert all(grads)
    assert torch.equal(w.grad, torch.full((8,), 2.0))  # one backward's worth, not an accumulation


def test_cold_mode_flushes_before_each_single_call_sample() -> None:
    clock = FakeClock()
    backend = CpuBackend(lambda: clock.advance(5.0), clock=clock, cold=True, flush_bytes=1 << 16)
    flushes = []
    original = backend.flush
    backend.flush = lambda: (flushes.append(1), original())[1]  # type: ignore[method-assign]
    m = bench(lambda: None, backend=backend, clock=clock, sensor=NoSensor("CPU"), mode="cold", min_time_s=0.0)
    assert m.calls_per_sample == 1 and m.mode == "cold"
    assert len(flushes) >= len(m.samples_us)
    assert set(m.samples_us) == {5.0}  # the flush is outside the timed region


def test_llc_size_is_read_or_defaulted() -> None:
    assert llc_bytes() >= 1 << 20


def test_device_resolution() -> None:
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto", (torch.ones(1),)) == "cpu"
    with pytest.raises(UsageError):
        resolve_device("tpu:0")
    with pytest.raises(UsageError):
        resolve_device("meta")
    if not torch.cuda.is_available():
        with pytest.raises(NoGpuError):
            resolve_device("cuda")
        assert resolve_device("auto") == "cpu"


def test_graph_or_events_need_a_gpu() -> None:
    with pytest.raises(UsageError, match="needs a CUDA device"):
        bench(lambda: None, device="cpu", method="graph")


# ---- ceilings ----
def test_ceilings_are_measured_once_and_cached(tmp_path: Path) -> None:
    calls = []

    def fake_timer(fn) -> float:
        calls.append(fn)
        return 1000.0  # 1 ms for everything

    sizes = {"copy_bytes": 1 << 20, "matmul_n": 64}
    c = dc.get_ceilings("cpu", time_us=fake_timer, directory=tmp_path, **sizes)
    assert len(calls) == 3  # memcpy, a copy kernel, one matmul
    assert c.copy_bytes_per_s == pytest.approx(2 * (1 << 20) / 1e-3)
    assert c.matmul_flops["float32"] == pytest.approx(2 * 64**3 / 1e-3)
    assert c.device_name and "threads" in c.device_key
    n = len(calls)
    again = dc.get_ceilings("cpu", time_us=fake_timer, directory=tmp_path, **sizes)
    assert again == c and len(calls) == n  # from the cache
    dc.get_ceilings("cpu", time_us=fake_timer, directory=tmp_path, remeasure=True, **sizes)
    assert len(calls) == 2 * n


def test_a_corrupt_or_old_cache_is_measured_again(tmp_path: Path) -> None:
    (tmp_path / dc.CACHE_FILE).write_text("{corrupt")
    assert dc.load_cached("cpu", tmp_path) is None
    key, _ = dc.device_identity("cpu")
    (tmp_path / dc.CACHE_FILE).write_text(json.dumps({key: {"schema_version": 0}}))
    assert dc.load_cached("cpu", tmp_path) is None


def test_the_cache_directory_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dc.CACHE_ENV, str(tmp_path / "x"))
    assert dc.cache_dir() == tmp_path / "x"
    monkeypatch.delenv(dc.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert dc.cache_dir() == tmp_path / "gpudoctor"


def test_matmul_precision_is_restored_after_measuring() -> None:
    before = torch.get_float32_matmul_precision()
    dc.measure_ceilings(
        "cpu", lambda fn: (fn(), 10.0)[1], copy_bytes=1 << 10, matmul_n=8, dtypes=("float32",)
    )
    assert torch.get_float32_matmul_precision() == before


def test_bench_uses_given_ceilings_without_measuring() -> None:
    c = dc.Ceilings(device_key="k", device_name="cpu", copy_bytes_per_s=1e9, matmul_flops={"float32": 1e9})
    x = torch.ones(16)
    m = bench(torch.add, x, x, nbytes=192, flops=16, ceilings=c, min_time_s=0.0, timeout_s=0.3)
    assert m.dtype == "float32"
    assert m.bandwidth_share is not None and m.flops_share is not None


def test_importing_the_timing_core_does_not_import_torch() -> None:
    code = "import sys, gpudoctor.timing, gpudoctor.timing.pytest_plugin; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
