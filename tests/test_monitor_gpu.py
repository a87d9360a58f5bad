"""The monitor on a real GPU through NVML: a reading has the basics, a bf16 matmul in this process is
seen (busy GPU, our pid, tensor cores where GPM exists), clocks can be read by torch's device UUID, and
`gpudoctor monitor --once --json` works. Marked `gpu`; skipped without CUDA or NVML (CI)."""

from __future__ import annotations

import json
import os
import time

import pytest
from typer.testing import CliRunner

torch = pytest.importorskip("torch")
pytest.importorskip("pynvml")

from gpudoctor.cli.main import app  # noqa: E402
from gpudoctor.monitor import ClockWatch, MonitorSession, NvmlUnavailable, open_backend, read_clocks  # noqa: E402
from gpudoctor.monitor.procs import ProcessTree  # noqa: E402


def _nvml_works() -> bool:
    try:
        open_backend(gpm=False).close()
    except NvmlUnavailable:
        return False
    return True


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or not _nvml_works(), reason="needs a CUDA GPU and NVML"
    ),
]


@pytest.fixture
def backend():
    b = open_backend()
    yield b
    b.close()


def _burn(seconds: float) -> None:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


def test_a_reading_has_the_basics(backend) -> None:
    info = backend.devices()[0]
    s = backend.read(0)
    assert info.sm_max_mhz and info.memory_total_bytes and info.name
    assert s.gpu_util_pct is not None and s.mem_total_bytes == info.memory_total_bytes
    assert s.sm_clock_mhz and s.power_w and s.temp_c is not None
    assert s.clock_event_mask is not None
    if info.architecture == "hopper":
        assert info.gpm_supported or "gpm" in info.missing


def test_a_matmul_in_this_process_is_seen(backend) -> None:
    _burn(0.5)  # CUDA context and cuBLAS ready before sampling
    with MonitorSession(backend, interval_s=0.1, owner=ProcessTree(os.getpid())) as session:
        _burn(3.0)
        summary = session.stop()
    d = summary.devices[0]
    assert d.gpu_util_mean_pct is not None and d.gpu_util_mean_pct > 80
    mine = [p for p in d.processes if p.pid == os.getpid()]
    assert mine and mine[0].owned is True and (mine[0].peak_memory_bytes or 0) > 0
    if d.gpm_means is not None:
        assert (d.gpm_means.tensor_active_pct or 0) > 10
    # the costly calls are paced per GPU (nvml_calls.Pace): 2% of a core for each GPU watched (a 4-GPU
    # host whose other GPUs ran other work took 2.9% for four)
    assert summary.sampler is not None and summary.sampler.cpu_share < 0.02 * len(summary.devices)


def test_clocks_by_torch_uuid_and_a_clock_watch(backend) -> None:
    uuid = str(torch.cuda.get_device_properties(0).uuid)
    state = read_clocks(uuid, backend)
    assert state.sm_mhz and state.sm_max_mhz and isinstance(state.events, tuple)
    with ClockWatch(uuid, backend=backend, interval_s=0.05) as watch:
        _burn(1.0)
    report = watch.report
    assert report.samples >= 5 and report.sm_mean_mhz and report.sm_max_mhz


def test_the_clocks_of_a_childs_gpu_over_its_timed_seconds() -> None:
    # the proof's reading: a watch on the GPU a child is given (CUDA_VISIBLE_DEVICES), the span by
    # time.monotonic() as the child wrote it
    from gpudoctor.runner.samplers import child_clocks

    clocks = child_clocks({"CUDA_VISIBLE_DEVICES": str(torch.cuda.get_device_properties(0).uuid)})
    assert clocks is not None
    with clocks:
        _burn(0.5)
        start = time.monotonic()
        _burn(1.0)
        end = time.monotonic()
    part, whole = clocks.between(start, end), clocks.between(0.0, time.monotonic())
    assert clocks.failed is None and part is not None and whole is not None
    assert 3 <= part.samples < whole.samples and part.sm_mean_mhz and part.power_mean_w


def test_once_json_on_the_gpu() -> None:
    result = CliRunner().invoke(app, ["monitor", "--once", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "gpudoctor.monitor-snapshot/1"
    assert doc["latest"][0]["sm_clock_mhz"] > 0
