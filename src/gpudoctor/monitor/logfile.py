"""`--log FILE`: samples written as they come, as JSON lines (`.jsonl`, `.ndjson`, `.json`, optionally
`.gz`: a header line then one sample a line, readable back with `MonitorRecord.read_jsonl`) or as CSV
(`.csv`: one row per sample, flat columns, for spreadsheets and pandas)."""

from __future__ import annotations

import contextlib
import csv
import json
import time
from pathlib import Path
from typing import IO, Any

from gpudoctor.monitor.samples import GPM_FIELDS, GpuInfo, GpuSample, MonitorRecord, SystemInfo
from gpudoctor.util.errors import UsageError
from gpudoctor.util.outfile import close_live, open_live, output_error

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
FLUSH_EVERY_S = 1.0

CSV_COLUMNS = (
    "unix_s",
    "elapsed_s",
    "gpu",
    "gpu_util_pct",
    "mem_util_pct",
    "mem_used_bytes",
    "mem_total_bytes",
    "power_w",
    "power_instant_w",
    "power_limit_w",
    "temp_c",
    "mem_temp_c",
    "sm_clock_mhz",
    "sm_max_mhz",
    "mem_clock_mhz",
    "clock_events",
    "pcie_tx_bytes_per_s",
    "pcie_rx_bytes_per_s",
    "energy_j",
    *GPM_FIELDS,
    "processes",
    "process_count",
)


def log_format(path: Path) -> str:
    """ "jsonl" or "csv" from the file name, else a `UsageError`."""
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(".csv"):
        return "csv"
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    raise UsageError(f"--log {path}: name it .csv or .jsonl (optionally .gz) to choose the format")


class SampleLog:
    """Appends samples to a file as they come; flushed about once a second and on `close()`."""

    def __init__(
        self, path: Path, system: SystemInfo, devices: tuple[GpuInfo, ...], interval_s: float
    ) -> None:
        self.path = path
        self.format = log_format(path)
        self._max_mhz = {d.index: d.sm_max_mhz for d in devices}
        self._file: IO[str] = open_live(path)
        self._last_flush = time.monotonic()
        self._start_s: float | None = None
        self.rows = 0
        if self.format == "jsonl":
            header = MonitorRecord(system=system, devices=devices, interval_s=interval_s).header_json()
            self._file.write(json.dumps(header, separators=(",", ":")) + "\n")
            self._csv = None
        else:
            self._csv = csv.writer(self._file)
            self._csv.writerow(CSV_COLUMNS)

    def write(self, sample: GpuSample) -> None:
        if self._file.closed:
            return
        try:
            self._write(sample)
        except OSError as err:  # a full disk mid-run: one line naming the log, the samples so far kept
            with contextlib.suppress(OSError):
                close_live(self._file)
            raise output_error(self.path, err) from None

    def _write(self, sample: GpuSample) -> None:
        if self._csv is None:
            self._file.write(json.dumps(sample.to_json(), separators=(",", ":"), allow_nan=False) + "\n")
        else:
            if self._start_s is None:
                self._start_s = sample.mono_s
            self._csv.writerow(
                csv_row(sample, self._max_mhz.get(sample.index), sample.mono_s - self._start_s)
            )
        self.rows += 1
        now = time.monotonic()
        if now - self._last_flush >= FLUSH_EVERY_S:
            self._file.flush()
            self._last_flush = now

    def close(self) -> None:
        if not self._file.closed:
            try:
                close_live(self._file)
            except OSError as err:
                raise output_error(self.path, err) from None

    def __enter__(self) -> SampleLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def csv_row(s: GpuSample, sm_max_mhz: int | None, elapsed_s: float) -> list[Any]:
    gpm = s.gpm
    procs = s.processes
    return [
        f"{s.unix_s:.3f}",
        f"{elapsed_s:.3f}",
        s.index,
        s.gpu_util_pct,
        s.mem_util_pct,
        s.mem_used_bytes,
        s.mem_total_bytes,
        _num(s.power_w),
        _num(s.power_instant_w),
        _num(s.power_limit_w),
        s.temp_c,
        s.mem_temp_c,
        s.sm_clock_mhz,
        sm_max_mhz,
        s.mem_clock_mhz,
        "|".join(s.clock_events),
        _num(s.pcie_tx_bytes_per_s, 0),
        _num(s.pcie_rx_bytes_per_s, 0),
        _num(s.energy_j, 3),
        *(
            _num(getattr(gpm, f, None) if gpm else None)
            for f in (
                "sm_active_pct",
                "sm_occupancy_pct",
                "tensor_active_pct",
                "dram_bw_pct",
                "fp64_pct",
                "fp32_pct",
                "fp16_pct",
            )
        ),
        ";".join(f"{p.pid}:{p.used_memory_bytes if p.used_memory_bytes is not None else ''}" for p in procs)
        if procs
        else "",
        len(procs) if procs is not None else None,
    ]


def _num(value: float | None, digits: int = 2) -> str | None:
    return None if value is None else f"{value:.{digits}f}"
