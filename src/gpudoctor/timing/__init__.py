"""The one timing core: `bench(fn, *args, **options) -> Measurement` on the GPU (CUDA events around
CUDA-graph replays, launch overhead excluded, host latency apart) and the CPU, `compare` with a verdict,
saved measurements and regression checks. Importing it imports no torch."""

from gpudoctor.timing.api import bench, measured_ceilings, resolve_device
from gpudoctor.timing.compare import Comparison, RegressionCheck, Verdict, check_regression, compare
from gpudoctor.timing.measurement import (
    BenchFileError,
    BenchOptions,
    Measurement,
    load_measurements,
    save_measurements,
)
from gpudoctor.timing.stats import Stats, summarize

__all__ = [
    "BenchFileError",
    "BenchOptions",
    "Comparison",
    "Measurement",
    "RegressionCheck",
    "Stats",
    "Verdict",
    "bench",
    "check_regression",
    "compare",
    "load_measurements",
    "measured_ceilings",
    "resolve_device",
    "save_measurements",
    "summarize",
]
