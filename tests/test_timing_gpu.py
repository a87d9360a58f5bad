"""The timing core on a real GPU: CUDA-graph replay hides launch overhead (a tiny kernel's device time is
microseconds while its host latency is tens), device time agrees with a long back-to-back reference,
cold mode pays for L2 misses, a function that synchronizes falls back to eager calls with a note,
backward passes with grad_to_none, NVML clocks, rates against measured ceilings, verdicts, the CLI and
the explorer. Marked `gpu`; skipped where torch sees no CUDA device (CI)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from gpudoctor.cli.main import app  # noqa: E402
from gpudoctor.timing import Verdict, bench, compare, measured_ceilings  # noqa: E402
from gpudoctor.timing.cuda_backend import GraphCaptureError  # noqa: E402
from gpudoctor.timing.explore import explore  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
QUICK = {"min_time_s": 0.1, "timeout_s": 5.0}


def back_to_back_us(fn, calls: int = 50) -> float:
    """Reference device time: `calls` eager calls queued behind a long spin kernel, one event pair."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        torch.cuda._sleep(20_000_000)  # ~10 ms: the host enqueues everything before the GPU gets there
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / calls)
    return best


def test_matmul_device_time_agrees_with_a_back_to_back_reference() -> None:
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    m = bench(torch.mm, a, b, flops=2 * 4096**3, **QUICK)
    ref = back_to_back_us(lambda: torch.mm(a, b))
    assert m.device.startswith("cuda") and m.method == "cuda_graph" and m.calls_per_sample > 1
    assert m.median_us == pytest.approx(ref, rel=0.03)
    assert m.dtype == "bfloat16" and m.flop_rate and m.flop_rate > 1e14
    assert m.host_stats and m.host_stats.median > m.median_us


def test_a_tiny_kernel_has_microseconds_of_device_time_and_more_host_latency() -> None:
    x = torch.randn(1024, device="cuda")
    m = bench(torch.add, x, x, **QUICK)
    assert m.method == "cuda_graph" and m.calls_per_sample >= 100
    assert 0.3 < m.median_us < 5.0
    assert m.host_stats is not None and m.host_stats.median > m.median_us + 3.0
    assert not any("launch overhead" in n for n in m.notes)


def test_cold_mode_pays_for_l2_misses_on_l2_resident_data() -> None:
    x = torch.randn(1 << 21, device="cuda")  # 8 MB inputs: they stay in a 50 MB L2 when hot
    hot = bench(torch.add, x, x, **QUICK)
    cold = bench(torch.add, x, x, mode="cold", **QUICK)
    assert cold.calls_per_sample == 1 and cold.mode == "cold" and cold.method == "cuda_events"
    assert cold.median_us > 1.05 * hot.median_us


def test_a_function_that_synchronizes_falls_back_to_eager_calls() -> None:
    x = torch.randn(1 << 16, device="cuda")
    m = bench(lambda: (x + 1).sum().item(), **QUICK)
    assert m.method == "cuda_events"
    assert any("no CUDA graph" in n and "synchroniz" in n for n in m.notes)
    assert m.median_us > 0
    with pytest.raises(GraphCaptureError):
        bench(lambda: (x + 1).sum().item(), method="graph", **QUICK)
    assert torch.randn(4, device="cuda").isfinite().all()  # RNG and device fine afterwards


def test_a_capture_that_fails_leaves_the_rng_usable() -> None:
    x = torch.randn(1 << 16, device="cuda")

    def explicit_sync() -> None:  # not caught by sync-debug mode: the capture itself fails
        x.add_(1)
        torch.cuda.synchronize()

    m = bench(explicit_sync, **QUICK)
    assert m.method == "cuda_events" and any("no CUDA graph" in n for n in m.notes)
    assert torch.randn(1024, device="cuda").std() > 0.5
    assert torch.rand(4, device="cuda").max() < 1


def test_kernel_time_of_a_tiny_kernel_from_cupti() -> None:
    x = torch.randn(1024, device="cuda")
    m = bench(torch.add, x, x, kernel_time=True, **QUICK)
    assert m.kernels is not None and m.kernels.grouped and m.kernels.kernels_per_call == 1
    assert "elementwise" in m.kernels.names[0]
    assert 0.5 < m.kernel_stats.median < 5.0


def test_backward_with_grad_to_none_under_graph_replay() -> None:
    w = torch.randn(512, 512, device="cuda", requires_grad=True)
    x = torch.randn(256, 512, device="cuda")
    m = bench(lambda: (x @ w).sum().backward(), grad_to_none=[w], **QUICK)
    assert m.method == "cuda_graph"
    expected = x.sum(0, keepdim=True).t().expand(512, 512)
    torch.testing.assert_close(w.grad, expected, rtol=1e-3, atol=1e-3)  # one pass, not accumulated


def test_host_method_times_sync_and_host_clock() -> None:
    x = torch.randn(1 << 20, device="cuda")
    dev = bench(torch.add, x, x, **QUICK)
    host = bench(torch.add, x, x, method="host", **QUICK)
    assert host.method == "host_sync"
    assert host.median_us >= dev.median_us


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is None, reason="needs pynvml")
def test_nvml_clocks_are_read_around_every_sample() -> None:
    x = torch.randn(1 << 20, device="cuda")
    m = bench(torch.add, x, x, **QUICK)
    assert m.clocks.available and m.clocks.max_sm_mhz and m.clocks.max_sm_mhz > 500
    assert all(c is not None and c > 0 for c in m.sample_sm_mhz)
    assert len(m.throttled) == len(m.samples_us)
    assert m.environment.driver


def test_rates_and_shares_of_the_measured_ceilings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUDOCTOR_CACHE_DIR", str(tmp_path))
    c = measured_ceilings("cuda")
    assert c.copy_bytes_per_s > 1e12 and c.matmul_flops["bfloat16"] > 3e14
    assert (tmp_path / "ceilings.json").exists()
    n = 1 << 26
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    m = bench(torch.add, x, y, nbytes=3 * 4 * n, **QUICK)
    assert m.ceilings == c
    assert 0.6 < m.bandwidth_share < 1.1  # an add streams like a copy: close to the copy ceiling


def test_verdicts_on_the_gpu() -> None:
    n = 1 << 24
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    xs, ys = x[: int(n * 0.9)], y[: int(n * 0.9)]
    base = bench(lambda: torch.add(x, y), label="add", **QUICK)
    same = bench(lambda: torch.add(x, y), label="add again", **QUICK)
    smaller = bench(lambda: torch.add(xs, ys), label="add 90%", **QUICK)
    assert compare(base, same).verdict is Verdict.SAME
    assert compare(base, smaller).verdict is Verdict.FASTER


def test_the_bench_command_on_the_gpu(tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    r = CliRunner(env={"COLUMNS": "140"}).invoke(
        app, ["bench", "x + y", "--setup", "x = torch.randn(1 << 20, device='cuda'); y = x.clone()",
              "--bytes", str(12 << 20), "--min-time", "0.1", "--save", str(out)],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "CUDA graph replay" in r.stdout and "host latency" in r.stdout
    assert out.exists()


def test_explore_finds_where_the_gpu_wins() -> None:
    result = explore(["add"], sizes=[1024, 1 << 24], point_options={"timeout_s": 1.0})
    small, large = result.op_points("add")
    assert all(p.gpu_us and p.gpu_sync_us and p.gpu_transfer_us and p.cpu_us for p in (small, large))
    assert large.gpu_us < large.cpu_us
    assert large.gpu_sync_us < large.gpu_transfer_us
    by_scenario = {c.scenario: c for c in result.crossovers}
    assert by_scenario["gpu"].size is not None
