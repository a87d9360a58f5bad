"""The real NVML backend (`PynvmlBackend`) on a stand-in for the pynvml module: every NVML error becomes a
missing value with a reason, unsupported calls are not repeated, rates come from counters, GPM metrics
come from two GPM samples, processes are merged and named, and NVML is shut down on close."""

from __future__ import annotations

import time
import types
from typing import Any

import pytest

from gpudoctor.monitor.backend import NvmlUnavailable, nvml_reason
from gpudoctor.monitor.nvml import PynvmlBackend, import_pynvml
from gpudoctor.monitor.nvml_calls import Pace

NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND, LIB_NOT_FOUND, GPU_LOST = 3, 4, 6, 12, 15


class FakeNvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return f"code {self.value}"


def _obj(**kw: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**kw)


class FakeNvml(types.ModuleType):
    """Enough of pynvml for the backend, with knobs: `fail` maps a function name to an error code;
    `calls` counts calls per function; `gpm=False` makes the GPU pre-Hopper."""

    NVMLError = FakeNvmlError
    nvmlMemory_v2 = 0x02000028
    NVML_GPM_METRICS_GET_VERSION = 1

    def __init__(
        self,
        *,
        gpus: int = 1,
        gpm: bool = True,
        fail: dict[str, int] | None = None,
        fields: bool = True,
        processes: list[tuple[int, int | None]] | None = None,
    ) -> None:
        super().__init__("pynvml")
        self.gpus, self.gpm, self.fields = gpus, gpm, fields
        self.fail = dict(fail or {})
        self.calls: dict[str, int] = {}
        self.cpu_cost_s: dict[str, float] = {}  # CPU time a call burns, by name
        self.field_cost_s: dict[int, float] = {}  # CPU time each field id adds to nvmlDeviceGetFieldValues
        self.inited = 0
        self.tick = 0  # advances the counters at each utilization read
        self.processes = processes if processes is not None else [(4242, 10 << 30)]
        self.freed = 0

        def c_nvmlGpmMetricsGet_t() -> Any:
            return _obj(
                version=0,
                numMetrics=0,
                sample1=None,
                sample2=None,
                metrics=[_obj(metricId=0, nvmlReturn=0, value=0.0) for _ in range(16)],
            )

        self.c_nvmlGpmMetricsGet_t = c_nvmlGpmMetricsGet_t

    def __getattr__(self, name: str) -> Any:
        impl = getattr(type(self), "_" + name, None)
        if impl is None:
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            end = time.thread_time() + self.cpu_cost_s.get(name, 0.0)
            while time.thread_time() < end:
                pass
            if name in self.fail:
                raise FakeNvmlError(self.fail[name])
            return impl(self, *args, **kwargs)

        return call

    def _nvmlInit(self) -> None:
        self.inited += 1

    def _nvmlShutdown(self) -> None:
        self.inited -= 1

    def _nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def _nvmlDeviceGetHandleByIndex(self, i: int) -> Any:
        return _obj(index=i)

    def _nvmlSystemGetDriverVersion(self) -> str:
        return "580.159.04"

    def _nvmlSystemGetNVMLVersion(self) -> str:
        return "13.580.159.04"

    def _nvmlSystemGetCudaDriverVersion(self) -> int:
        return 13000

    def _nvmlDeviceGetName(self, h: Any) -> str:
        return "NVIDIA H100 80GB HBM3"

    def _nvmlDeviceGetUUID(self, h: Any) -> str:
        return f"GPU-0000000{h.index}-aaaa-bbbb-cccc-dddddddddddd"

    def _nvmlDeviceGetPciInfo(self, h: Any) -> Any:
        return _obj(busId=b"00000000:18:00.0")

    def _nvmlDeviceGetMemoryInfo(self, h: Any, version: int | None = None) -> Any:
        return _obj(used=20 << 30, total=80 << 30)

    def _nvmlDeviceGetMaxClockInfo(self, h: Any, kind: int) -> int:
        return 1980 if kind == 1 else 2619

    def _nvmlDeviceGetEnforcedPowerLimit(self, h: Any) -> int:
        return 700_000

    def _nvmlDeviceGetArchitecture(self, h: Any) -> int:
        return 9

    def _nvmlDeviceGetCudaComputeCapability(self, h: Any) -> tuple[int, int]:
        return (9, 0)

    def _nvmlDeviceGetMigMode(self, h: Any) -> tuple[int, int]:
        return (0, 0)

    def _nvmlDeviceGetFieldValues(self, h: Any, ids: list[int]) -> list[Any]:
        out = []
        end = time.thread_time() + sum(self.field_cost_s.get(fid, 0.0) for fid in ids)
        while time.thread_time() < end:
            pass
        for fid in ids:
            supported = self.fields and fid in (197, 198, 83, 186, 82, 74, 75)
            value = {
                197: 1_000_000 * self.tick,
                198: 4_000_000 * self.tick,
                83: 5_000_000 + 100_000 * self.tick,
                186: 650_000,
                82: 48,
                74: 50_000_000 * self.tick,
                75: 0,
            }.get(fid, 0)
            out.append(
                _obj(nvmlReturn=0 if supported else NOT_SUPPORTED, valueType=3, value=_obj(ullVal=value))
            )
        return out

    def _nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return 0x4

    def _nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        self.tick += 1
        return _obj(gpu=97, memory=40)

    def _nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return 690_500

    def _nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        return 61

    def _nvmlDeviceGetClockInfo(self, h: Any, kind: int) -> int:
        return 1755 if kind == 1 else 2619

    def _nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        return [_obj(pid=pid, usedGpuMemory=mem) for pid, mem in self.processes]

    def _nvmlDeviceGetGraphicsRunningProcesses(self, h: Any) -> list[Any]:
        return []

    def _nvmlDeviceGetProcessUtilization(self, h: Any, since: int) -> list[Any]:
        return [_obj(pid=pid, timeStamp=since + 10, smUtil=88) for pid, _ in self.processes[:1]]

    def _nvmlSystemGetProcessName(self, pid: int) -> bytes:
        return b"/usr/bin/python3"

    def _nvmlDeviceGetPcieThroughput(self, h: Any, counter: int) -> int:
        return 1000

    def _nvmlGpmQueryDeviceSupport(self, h: Any) -> Any:
        return _obj(isSupportedDevice=int(self.gpm))

    def _nvmlGpmSampleAlloc(self) -> Any:
        return _obj(taken=0)

    def _nvmlGpmSampleFree(self, sample: Any) -> None:
        self.freed += 1

    def _nvmlGpmSampleGet(self, h: Any, sample: Any) -> Any:
        sample.taken += 1
        return sample

    def _nvmlGpmMetricsGet(self, req: Any) -> Any:
        values = {2: 96.0, 3: 30.0, 5: 71.5, 10: 35.0, 11: 0.0, 12: 3.0, 13: 1.0, 20: 10.0, 21: 20.0}
        for slot in req.metrics[: req.numMetrics]:
            slot.nvmlReturn = 0 if slot.metricId in values else NOT_SUPPORTED
            slot.value = values.get(slot.metricId, 0.0)
        return req


def backend(nvml: FakeNvml, **kw: Any) -> PynvmlBackend:
    return PynvmlBackend(nvml, process_interval_s=0.0, **kw)


# --- opening ---------------------------------------------------------------------------------------


def test_static_info_is_read_once_at_open() -> None:
    b = backend(FakeNvml())
    (info,) = b.devices()
    assert info.name == "NVIDIA H100 80GB HBM3" and info.architecture == "hopper"
    assert info.sm_max_mhz == 1980 and info.mem_max_mhz == 2619 and info.power_limit_w == 700.0
    assert info.pci_bus_id == "00000000:18:00.0" and info.compute_capability == (9, 0)
    assert info.gpm_supported and info.pcie_source == "gpm" and info.mig_enabled is False
    system = b.system()
    assert system.driver_version == "580.159.04" and system.cuda_driver_version == "13.0"


def test_no_library_is_one_clear_error() -> None:
    # GIVEN NVML's library missing WHEN opening THEN NvmlUnavailable says so in one line
    with pytest.raises(NvmlUnavailable, match=r"libnvidia-ml\.so\.1 not found") as err:
        backend(FakeNvml(fail={"nvmlInit": LIB_NOT_FOUND}))
    assert err.value.exit_code == 2 and "\n" not in str(err.value)


def test_no_gpu_is_one_clear_error_and_nvml_is_shut_down() -> None:
    nvml = FakeNvml(gpus=0)
    with pytest.raises(NvmlUnavailable, match="sees no NVIDIA GPU"):
        backend(nvml)
    assert nvml.inited == 0


def test_pynvml_on_a_machine_without_driver_is_nvml_unavailable() -> None:
    pytest.importorskip("pynvml")
    try:
        b = PynvmlBackend()
    except NvmlUnavailable as err:
        assert str(err).startswith("NVML is not available: ")
    else:  # a GPU machine
        b.close()


def test_import_pynvml_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "pynvml":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    with pytest.raises(NvmlUnavailable, match=r"pip install 'gpudoctor\[nvml\]'"):
        import_pynvml()


def test_close_frees_gpm_samples_and_shuts_down_once() -> None:
    nvml = FakeNvml(gpus=2)
    with backend(nvml) as b:
        b.read(0)
    assert nvml.inited == 0 and nvml.freed == 4
    b.close()
    assert nvml.inited == 0


# --- readings --------------------------------------------------------------------------------------


def test_a_reading_has_every_metric_in_its_unit() -> None:
    b = backend(FakeNvml())
    first = b.read(0)
    s = b.read(0)
    # the summary counters are in the first reading, then only now and then (and in full readings)
    assert first.energy_j is not None and first.energy_j > 5000
    assert first.violation_ns["power"] > 0 and first.violation_ns["thermal"] == 0
    assert "sync_boost" not in first.violation_ns  # not supported by this GPU
    assert s.energy_j is None and s.violation_ns == {} and "every 30 s" in s.missing["energy_j"]
    assert b.read(0, full=True).energy_j is not None
    assert s.gpu_util_pct == 97 and s.mem_util_pct == 40
    assert s.mem_used_bytes == 20 << 30 and s.mem_total_bytes == 80 << 30 and s.mem_used_share == 0.25
    assert s.power_w == pytest.approx(690.5) and s.power_instant_w == 650.0 and s.power_limit_w == 700.0
    assert s.temp_c == 61 and s.mem_temp_c == 48
    assert s.sm_clock_mhz == 1755 and s.mem_clock_mhz == 2619
    assert (
        s.clock_event_mask == 0x4 and s.clock_events == ("sw_power_cap",) and s.slowdowns == ("sw_power_cap",)
    )
    assert s.gpm is not None and s.gpm.sm_active_pct == 96.0 and s.gpm.tensor_active_pct == 71.5
    assert s.gpm.interval_s > 0
    (p,) = s.processes or ()
    assert p.pid == 4242 and p.used_memory_bytes == 10 << 30 and p.sm_util_pct == 88 and p.kind == "compute"
    assert s.read_ms >= 0
    assert "gpm" not in s.missing and "power_w" not in s.missing


def test_pcie_rate_comes_from_gpm_first() -> None:
    s = backend(FakeNvml()).read(0)
    assert s.pcie_tx_bytes_per_s == 10 * (1 << 20) and s.pcie_rx_bytes_per_s == 20 * (1 << 20)


def test_without_gpm_pcie_rate_comes_from_the_byte_counters() -> None:
    b = backend(FakeNvml(gpm=False))
    assert b.devices()[0].pcie_source == "counters"
    first = b.read(0, full=True)
    assert first.pcie_tx_bytes_per_s is None and "two readings" in first.missing["pcie_tx_bytes_per_s"]
    second = b.read(0, full=True)  # 1 tick of the fake's counters later
    dt = second.mono_s - first.mono_s
    assert second.pcie_tx_bytes_per_s == pytest.approx(1_000_000 / dt)
    assert second.pcie_rx_bytes_per_s == pytest.approx(4_000_000 / dt)
    assert (
        b.read(0).pcie_tx_bytes_per_s == second.pcie_tx_bytes_per_s
    )  # held until the counters are read again


def test_without_gpm_or_counters_pcie_rate_comes_from_the_throughput_windows() -> None:
    b = backend(FakeNvml(fields=False, gpm=False))
    assert b.devices()[0].pcie_source == "throughput"
    assert b.read(0).pcie_tx_bytes_per_s == 1000 * 1024


def test_costly_field_values_are_read_rarely() -> None:
    # GIVEN the field costs measured on an H200: energy 2.2 ms, the thermal counter 0.41 ms, others ~4 µs
    nvml = FakeNvml()
    nvml.field_cost_s.update({83: 2.2e-3, 75: 0.41e-3})
    b = backend(nvml)
    # THEN the cheap live fields are read every time, the summary counters every 30 s or rarer
    assert b.pacing(0)["live_fields"] == 0.0 and b.pacing(0)["summary_counters"] >= 30
    calls = nvml.calls["nvmlDeviceGetFieldValues"]
    for _ in range(20):
        assert b.read(0).mem_temp_c == 48
    assert nvml.calls["nvmlDeviceGetFieldValues"] == calls + 20 + 1  # live each time, summary the first time
    b.read(0, full=True)
    assert nvml.calls["nvmlDeviceGetFieldValues"] == calls + 21 + 2


def test_costly_live_fields_are_paced_by_their_cpu_cost() -> None:
    # GIVEN a GPU where reading the HBM temperature costs 5 ms of CPU
    nvml = FakeNvml()
    nvml.field_cost_s[82] = 5e-3
    b = backend(nvml)
    # THEN it is read rarely enough to take at most 0.2% of a core (5 ms / 0.2% = 2.5 s), the value held
    assert b.pacing(0)["live_fields"] >= 2.4
    first, later = b.read(0), b.read(0)
    assert first.mem_temp_c == later.mem_temp_c == 48
    assert first.power_instant_w == 650.0 and later.power_instant_w is None  # an instant value is not held


def test_a_costly_call_is_paced_by_its_cpu_cost() -> None:
    pace = Pace(base_s=1.0, share=0.002)
    assert pace.due(0.0)
    pace.done(0.0, cost_s=0.005)
    assert pace.interval_s == pytest.approx(2.5) and not pace.due(2.0) and pace.due(2.5)
    pace.done(2.5, cost_s=0.0001)  # smoothed: one cheap call does not undo the cost seen
    assert pace.interval_s == pytest.approx((0.7 * 0.005 + 0.3 * 0.0001) / 0.002)


def test_unsupported_call_is_missing_with_a_reason_and_not_asked_again() -> None:
    # GIVEN a GPU whose NVML does not support power readings
    nvml = FakeNvml(fail={"nvmlDeviceGetPowerUsage": NOT_SUPPORTED})
    b = backend(nvml)
    # WHEN read three times THEN power is None with the reason, and NVML was asked only once
    for _ in range(3):
        s = b.read(0)
        assert s.power_w is None and s.missing["power_w"] == "not supported on this GPU or driver"
    assert nvml.calls["nvmlDeviceGetPowerUsage"] == 1
    assert s.gpu_util_pct == 97  # the rest of the reading is whole


def test_a_transient_error_is_retried() -> None:
    nvml = FakeNvml(fail={"nvmlDeviceGetTemperature": GPU_LOST})
    b = backend(nvml)
    assert b.read(0).missing["temp_c"].startswith("the GPU has fallen off the bus")
    del nvml.fail["nvmlDeviceGetTemperature"]
    assert b.read(0).temp_c == 61


def test_gpm_unavailable_says_why() -> None:
    b = backend(FakeNvml(gpm=False))
    assert not b.devices()[0].gpm_supported
    s = b.read(0)
    assert s.gpm is None and "Hopper or newer" in s.missing["gpm"]
    denied = backend(FakeNvml(fail={"nvmlGpmSampleGet": NO_PERMISSION}))
    assert "no permission" in denied.devices()[0].missing["gpm"]
    off = backend(FakeNvml(), gpm=False)
    assert off.read(0).missing["gpm"] == "GPM reading turned off"


def test_process_list_failure_is_none_not_empty() -> None:
    b = backend(
        FakeNvml(
            fail={
                "nvmlDeviceGetComputeRunningProcesses": NO_PERMISSION,
                "nvmlDeviceGetGraphicsRunningProcesses": NO_PERMISSION,
            }
        )
    )
    s = b.read(0)
    assert s.processes is None and "no permission" in s.missing["processes"]


def test_processes_are_read_at_their_own_pace() -> None:
    nvml = FakeNvml()
    b = PynvmlBackend(nvml, process_interval_s=3600)
    for _ in range(5):
        assert b.read(0).processes is not None
    assert nvml.calls["nvmlDeviceGetComputeRunningProcesses"] == 1


def test_process_memory_not_available_is_none() -> None:
    s = backend(FakeNvml(processes=[(1, None), (2, 5 << 20)])).read(0)
    assert [(p.pid, p.used_memory_bytes) for p in s.processes or ()] == [(1, None), (2, 5 << 20)]


def test_read_clocks_decodes_the_reasons() -> None:
    c = backend(FakeNvml()).read_clocks(0)
    assert (c.sm_mhz, c.sm_max_mhz, c.mem_mhz) == (1755, 1980, 2619)
    assert c.events == ("sw_power_cap",) and c.throttled and c.sm_share == pytest.approx(1755 / 1980)
    assert c.power_w == pytest.approx(690.5)


def test_resolve_by_uuid_with_or_without_prefix() -> None:
    b = backend(FakeNvml(gpus=2))
    assert b.resolve("GPU-00000001-aaaa-bbbb-cccc-dddddddddddd") == 1
    assert b.resolve("00000001-AAAA-bbbb-cccc-dddddddddddd") == 1
    with pytest.raises(NvmlUnavailable, match="no GPU 7"):
        b.resolve(7)


def test_reasons_for_errors_are_short() -> None:
    assert nvml_reason(FakeNvmlError(NOT_SUPPORTED)) == "not supported on this GPU or driver"
    assert nvml_reason(FakeNvmlError(NOT_FOUND)) == "NVML error: code 6"
