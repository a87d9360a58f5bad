"""NVML GPM (GPU Performance Monitoring, Hopper and newer): SM activity, tensor-core activity and DRAM
bandwidth between two GPM samples. `GpmReader.open` says why GPM is unavailable when it is; each
`read` takes a new GPM sample and returns the metrics over the interval since the previous one."""

from __future__ import annotations

import contextlib
import math
import time
from types import ModuleType
from typing import Any

from gpudoctor.monitor.backend import nvml_reason
from gpudoctor.monitor.samples import GpmMetrics

# NVML_GPM_METRIC_* ids (nvml.h) -> GpmMetrics field; the PCIe pair is MiB/s.
METRIC_IDS: tuple[tuple[str, int], ...] = (
    ("sm_active_pct", 2),
    ("sm_occupancy_pct", 3),
    ("tensor_active_pct", 5),
    ("dram_bw_pct", 10),
    ("fp64_pct", 11),
    ("fp32_pct", 12),
    ("fp16_pct", 13),
    ("pcie_tx_mib_s", 20),
    ("pcie_rx_mib_s", 21),
)
_MIB = 1 << 20


class GpmReader:
    """Two GPM sample buffers used in turn: the newest reading becomes the start of the next interval."""

    def __init__(self, nvml: ModuleType, handle: Any) -> None:
        self._nvml, self._handle = nvml, handle
        self._samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
        self._prev_s: float | None = None
        self._request = nvml.c_nvmlGpmMetricsGet_t()

    @classmethod
    def open(cls, nvml: ModuleType, handle: Any) -> tuple[GpmReader | None, str | None]:
        """A reader, or None and why GPM cannot be read on this GPU."""
        query = getattr(nvml, "nvmlGpmQueryDeviceSupport", None)
        if query is None:
            return None, "this nvidia-ml-py has no GPM calls (upgrade nvidia-ml-py)"
        try:
            if not query(handle).isSupportedDevice:
                return None, "this GPU has no GPM (NVML GPM needs Hopper or newer)"
            reader = cls(nvml, handle)
        except nvml.NVMLError as err:
            return None, f"GPM: {nvml_reason(err)}"
        try:
            nvml.nvmlGpmSampleGet(handle, reader._samples[0])
        except nvml.NVMLError as err:
            reader.close()
            return None, f"GPM sampling failed: {nvml_reason(err)}"
        reader._prev_s = time.monotonic()
        return reader, None

    def read(self, mono_s: float) -> tuple[GpmMetrics | None, tuple[float | None, float | None], str | None]:
        """(metrics, (pcie tx, rx) bytes/s, reason when there are no metrics)."""
        nvml = self._nvml
        prev, cur = self._samples
        try:
            nvml.nvmlGpmSampleGet(self._handle, cur)
        except nvml.NVMLError as err:
            self._prev_s = None
            return None, (None, None), f"GPM sampling failed: {nvml_reason(err)}"
        prev_s, self._prev_s = self._prev_s, mono_s
        self._samples.reverse()  # `cur` starts the next interval
        if prev_s is None:
            return None, (None, None), "first GPM reading after a failed one (GPM measures between two)"
        req = self._request
        req.version = nvml.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(METRIC_IDS)
        req.sample1, req.sample2 = prev, cur
        for slot, (_, metric_id) in zip(req.metrics, METRIC_IDS, strict=False):
            slot.metricId = metric_id
        try:
            nvml.nvmlGpmMetricsGet(req)
        except nvml.NVMLError as err:
            return None, (None, None), f"GPM metrics failed: {nvml_reason(err)}"
        values: dict[str, float | None] = {}
        for slot, (name, _) in zip(req.metrics, METRIC_IDS, strict=False):
            value = float(slot.value)
            values[name] = value if slot.nvmlReturn == 0 and math.isfinite(value) else None
        tx, rx = values.pop("pcie_tx_mib_s"), values.pop("pcie_rx_mib_s")
        metrics = GpmMetrics(interval_s=mono_s - prev_s, **values)
        return metrics, (tx * _MIB if tx is not None else None, rx * _MIB if rx is not None else None), None

    def close(self) -> None:
        for sample in self._samples:
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlGpmSampleFree(sample)
        self._samples = []
