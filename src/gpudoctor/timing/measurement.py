"""`Measurement`: one benchmarked function, with every raw sample kept, how it was timed, the clocks
around the run, the environment, and the statistics and rates derived from the samples. Saved and loaded
as versioned JSON (`save_measurements` / `load_measurements`); derived figures are recomputed on load."""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from gpudoctor.device.ceilings import Ceilings
from gpudoctor.timing.clock import ClockReading
from gpudoctor.timing.stats import Stats, summarize
from gpudoctor.util.errors import GpudoctorError, UsageError
from gpudoctor.util.jsonfile import read_json
from gpudoctor.util.outfile import write_json
from gpudoctor.util.serial import from_jsonable, to_jsonable
from gpudoctor.util.units import fmt_us

SCHEMA = "gpudoctor.measurement"
SCHEMA_VERSION = 1
FILE_SCHEMA = "gpudoctor.bench"

MODES = ("hot", "cold")
METHODS = ("auto", "graph", "events", "host")
THROTTLED = ("flag", "discard")


class BenchFileError(GpudoctorError):
    """A file that is not a readable gpudoctor benchmark result."""


@dataclass(frozen=True)
class BenchOptions:
    """How to measure. Every field is a keyword of `bench()`."""

    mode: str = "hot"  # "cold": L2 (or the CPU's last-level cache) flushed before every sample
    method: str = "auto"  # auto | graph (CUDA graph replay) | events (eager calls) | host (sync + host clock)
    min_samples: int = 10
    max_samples: int = 100_000
    min_time_s: float = 0.25  # of sampling, after warm-up
    max_noise: float = 0.005  # stop once the median's 95% interval is within ±this fraction
    timeout_s: float = 10.0  # warm-up and sampling (host latency adds at most a tenth); beats min_samples
    warmup_min_s: float = 0.05  # enough for an idle GPU to raise its clocks
    warmup_max_s: float = 2.0
    warmup_window: int = 5
    warmup_tolerance: float = 0.01
    sample_target_us: float = 1000.0  # calls per sample are chosen so that a sample lasts about this long
    max_calls_per_sample: int = 1000
    throttled: str = "flag"  # flag | discard: what to do with samples taken while the GPU was throttled
    host_latency: bool = True  # also time single calls as a caller waits for them
    cooldown: float | None = None  # GPU idle after each sample, × its length (None: 1 on a GPU, 0 on the CPU)
    kernel_time: bool = False  # also record single calls' kernels with CUPTI (torch.profiler)
    disable_gc: bool = True  # as timeit does: a collection inside a sample is not the function's time

    def validate(self) -> BenchOptions:
        if self.mode not in MODES:
            raise UsageError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.method not in METHODS:
            raise UsageError(f"method must be one of {', '.join(METHODS)}, not {self.method!r}")
        if self.throttled not in THROTTLED:
            raise UsageError(f"throttled must be one of {', '.join(THROTTLED)}, not {self.throttled!r}")
        positive = ("min_samples", "max_samples", "timeout_s", "sample_target_us", "max_calls_per_sample",
                    "warmup_window", "max_noise")  # fmt: skip
        for name in positive:
            if not getattr(self, name) > 0:
                raise UsageError(f"{name} must be positive, not {getattr(self, name)!r}")
        if self.cooldown is not None and self.cooldown < 0:
            raise UsageError(f"cooldown must not be negative, not {self.cooldown!r}")
        for name in ("min_time_s", "warmup_min_s", "warmup_max_s", "warmup_tolerance"):
            if getattr(self, name) < 0:
                raise UsageError(f"{name} must not be negative, not {getattr(self, name)!r}")
        if self.max_samples < self.min_samples:
            raise UsageError("max_samples must be at least min_samples")
        return self

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> BenchOptions:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise UsageError(
                f"unknown bench option(s): {', '.join(unknown)} (known: {', '.join(sorted(known))})"
            )
        return replace(cls(), **kwargs).validate()


@dataclass(frozen=True)
class Warmup:
    samples: int
    time_us: float
    steady: bool  # False: stopped by its time limit while the timings were still moving


@dataclass(frozen=True)
class KernelTimes:
    """The GPU activities of single synchronized calls, from CUPTI: per call, the sum of their durations
    (the figure Nsight Compute and a Kineto trace give). Not `grouped`: calls launched different numbers
    of kernels, and `per_call_us` holds only the mean."""

    per_call_us: tuple[float, ...]
    kernels_per_call: float
    names: tuple[str, ...] = ()  # by total time, longest first
    grouped: bool = True


@dataclass(frozen=True)
class ClockInfo:
    """The GPU's SM clock and clock-event reasons read through NVML around the run."""

    available: bool
    reason: str | None = None  # why not available
    max_sm_mhz: float | None = None
    before: ClockReading = field(default_factory=ClockReading)
    after: ClockReading = field(default_factory=ClockReading)
    reasons_seen: tuple[str, ...] = ()  # every reason bit seen during sampling


@dataclass(frozen=True)
class Environment:
    gpudoctor: str
    python: str
    platform: str
    torch: str | None = None
    cuda: str | None = None
    driver: str | None = None
    torch_threads: int | None = None
    timestamp: str = ""

    @classmethod
    def capture(cls, driver: str | None = None) -> Environment:
        from gpudoctor.util.version import __version__

        torch = sys.modules.get("torch")
        return cls(
            gpudoctor=__version__,
            python=platform.python_version(),
            platform=platform.platform(terse=True),
            torch=getattr(torch, "__version__", None),
            cuda=getattr(getattr(torch, "version", None), "cuda", None),
            driver=driver,
            torch_threads=torch.get_num_threads() if torch is not None else None,
            timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )


@dataclass(frozen=True)
class Measurement:
    """Times are per call of the function, in µs. `samples_us[i]` is the mean of `calls_per_sample`
    back-to-back calls (replayed from one CUDA graph when `method` is "cuda_graph")."""

    label: str
    device: str  # "cuda:0", "cpu"
    device_name: str
    method: str  # cuda_graph | cuda_events | host_sync | host_timer
    mode: str  # hot | cold
    calls_per_sample: int
    samples_us: tuple[float, ...]  # device time per call, one per sample (on the CPU: host time)
    throttled: tuple[bool, ...]  # per sample: NVML reported a throttle reason right before or after it
    sample_sm_mhz: tuple[float | None, ...]  # per sample: SM clock right after it
    host_latency_us: tuple[float, ...]  # single calls as a caller waits for them, synchronization included
    first_call_us: float  # the very first call, compilation and autotuning included
    warmup: Warmup
    stop_reason: str  # noise_target | max_samples | timeout
    elapsed_s: float
    options: BenchOptions
    clocks: ClockInfo
    environment: Environment
    nbytes: int | None = None
    flops: float | None = None
    dtype: str | None = None  # names the FLOP/s ceiling: bfloat16, float16, tf32, float32
    ceilings: Ceilings | None = None
    kernels: KernelTimes | None = None
    notes: tuple[str, ...] = ()
    schema_version: int = SCHEMA_VERSION

    # ---- derived, recomputed from the samples ----
    @cached_property
    def used_samples_us(self) -> np.ndarray:
        """The samples the statistics use: all of them, or the unthrottled ones with throttled="discard"
        (unless fewer than 3 would remain)."""
        x = np.asarray(self.samples_us, dtype=np.float64)
        if self.options.throttled == "discard" and any(self.throttled):
            keep = ~np.asarray(self.throttled, dtype=bool)
            if keep.sum() >= 3:
                return x[keep]
        return x

    @cached_property
    def stats(self) -> Stats:
        return summarize(self.used_samples_us)

    @cached_property
    def host_stats(self) -> Stats | None:
        return summarize(self.host_latency_us) if self.host_latency_us else None

    @cached_property
    def kernel_stats(self) -> Stats | None:
        return summarize(self.kernels.per_call_us) if self.kernels and self.kernels.per_call_us else None

    @property
    def median_us(self) -> float:
        return self.stats.median

    @property
    def throttled_count(self) -> int:
        return sum(self.throttled)

    @property
    def bandwidth(self) -> float | None:
        """Achieved bytes/s at the median time."""
        return self.nbytes / (self.median_us * 1e-6) if self.nbytes and self.median_us > 0 else None

    @property
    def flop_rate(self) -> float | None:
        return self.flops / (self.median_us * 1e-6) if self.flops and self.median_us > 0 else None

    @property
    def bandwidth_share(self) -> float | None:
        """Achieved bandwidth over the device's measured copy bandwidth."""
        if self.bandwidth is None or self.ceilings is None or not self.ceilings.copy_bytes_per_s:
            return None
        return self.bandwidth / self.ceilings.copy_bytes_per_s

    @property
    def flops_share(self) -> float | None:
        peak = self.ceilings.flops_for(self.dtype) if self.ceilings else None
        return self.flop_rate / peak if self.flop_rate is not None and peak else None

    @property
    def warnings(self) -> tuple[str, ...]:
        """What makes this number less trustworthy, in words."""
        s = self.stats
        out = []
        if s.noisy:
            out.append(f"noisy: IQR is {s.rel_iqr:.0%} of the median")
        if self.stop_reason == "timeout" and not s.rel_ci <= self.options.max_noise:
            out.append(
                f"timeout before the noise target: median known to ±{s.rel_ci:.2%}, "
                f"target ±{self.options.max_noise:.2%}"
            )
        if len(self.samples_us) < self.options.min_samples:
            out.append(f"only {len(self.samples_us)} samples (timeout before min_samples)")
        if self.throttled_count:
            kept = "discarded" if len(self.used_samples_us) < len(self.samples_us) else "kept"
            reasons = ", ".join(self.clocks.reasons_seen) or "?"
            out.append(
                f"{self.throttled_count} of {len(self.samples_us)} samples throttled ({reasons}); {kept}"
            )
        if not self.warmup.steady:
            out.append(f"timings still moving after {self.warmup.time_us / 1e6:.2g} s of warm-up")
        if self.device.startswith("cuda") and s.median < 0.05:
            out.append("no GPU work measured: does the function launch kernels on this device?")
        return tuple(out)

    def __repr__(self) -> str:
        """A short summary, as torch.utils.benchmark's Measurement prints: the median, its spread and
        interval, how it was measured, and the warnings; the samples stay in `samples_us`."""
        s = self.stats
        lines = [
            f"<gpudoctor.Measurement {self.label!r} on {self.device} ({self.device_name})>",
            f"  median {fmt_us(s.median)}  IQR {fmt_us(s.iqr)} ({fmt_us(s.q1)} to {fmt_us(s.q3)})  "
            f"95% CI ±{s.rel_ci:.2%}",
            f"  {s.n:,} samples × {self.calls_per_sample:,} calls, {self.method}, {self.mode} cache; "
            f"stopped by {self.stop_reason} after {self.elapsed_s:.3g} s",
        ]
        host = self.host_stats
        if host is not None:
            lines.append(f"  host latency (call + sync) median {fmt_us(host.median)}")
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    __str__ = __repr__

    # ---- JSON ----
    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"schema": SCHEMA, **to_jsonable(self)}
        host = self.host_stats
        doc["summary"] = {  # for readers of the file; ignored on load
            "device_time_us": to_jsonable(self.stats),
            "host_latency_us": to_jsonable(host) if host else None,
            "kernel_time_us": to_jsonable(self.kernel_stats) if self.kernel_stats else None,
            "bandwidth_bytes_per_s": self.bandwidth,
            "flops_per_s": self.flop_rate,
            "bandwidth_share": self.bandwidth_share,
            "flops_share": self.flops_share,
            "warnings": list(self.warnings),
        }
        return to_jsonable(doc)

    @classmethod
    def from_json(cls, data: Any) -> Measurement:
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise BenchFileError("not a gpudoctor measurement (no 'schema': 'gpudoctor.measurement')")
        if data.get("schema_version") != SCHEMA_VERSION:
            raise BenchFileError(
                f"measurement schema version {data.get('schema_version')!r}; this gpudoctor reads {SCHEMA_VERSION}"
            )
        body = {k: v for k, v in data.items() if k not in ("schema", "summary")}
        try:
            return from_jsonable(cls, body)
        except (TypeError, ValueError, KeyError) as err:
            raise BenchFileError(f"malformed measurement {data.get('label')!r}: {err}") from None


def save_measurements(
    path: str | Path, measurements: list[Measurement] | tuple[Measurement, ...], inputs: tuple[Path, ...] = ()
) -> Path:
    """Write the measurements through `util.outfile` (atomically; never over one of `inputs`)."""
    doc = {
        "schema": FILE_SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "measurements": [m.to_json() for m in measurements],
    }
    return write_json(path, doc, inputs=inputs)


def load_measurements(path: str | Path) -> list[Measurement]:
    """A file written by `save_measurements` (or one measurement's JSON)."""
    path = Path(path)
    if not path.exists():
        raise BenchFileError(f"{path}: no such file")
    try:
        data = read_json(path, "gpudoctor benchmark file")
    except UsageError as err:
        raise BenchFileError(str(err)) from None
    if isinstance(data, dict) and data.get("schema") == SCHEMA:
        return [Measurement.from_json(data)]
    if not isinstance(data, dict) or data.get("schema") != FILE_SCHEMA:
        raise BenchFileError(f"{path}: not a gpudoctor benchmark file (schema {FILE_SCHEMA!r})")
    items = data.get("measurements")
    if not isinstance(items, list):
        raise BenchFileError(f"{path}: 'measurements' is not a list")
    try:
        return [Measurement.from_json(m) for m in items]
    except BenchFileError as err:
        raise BenchFileError(f"{path}: {err}") from None
