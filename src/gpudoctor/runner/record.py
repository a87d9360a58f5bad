"""`RunRecord`: what `gpudoctor run` captured from a script — the light phase's step times (no profiler),
the traced phase's, torch.cuda memory statistics, NVML samples (or why there are none), the environment,
and how the script ended. Serializable (`to_json`/`from_json`, schema `gpudoctor.run/1`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from gpudoctor.util.serial import Serialized, to_jsonable

SCHEMA = "gpudoctor.run/1"
# The argv of a `gpudoctor.profile()` block's record: (this, the file of its code); a script's is its own.
PROFILE_ARGV0 = "gpudoctor.profile()"


@dataclass(frozen=True)
class Settling:
    """How the light phase's steps settled (`runner.settle`): the unsettled head left out of its times,
    whether every quarter of the rest is within `tolerance` of their mean, those quarters' means, and
    how long the phase ran past its plan waiting to settle."""

    dropped_us: tuple[float, ...]
    settled: bool
    quarter_means_us: tuple[float, ...]
    tolerance: float
    extended_s: float = 0.0


@dataclass(frozen=True)
class StepTimes:
    """Step times of one phase, from one clock: `cuda_events` (GPU stream time between step boundaries)
    or `perf_counter` (host wall time, on the CPU)."""

    clock: str
    times_us: tuple[float, ...] = ()
    # When the phase's first and last marks were made, by the host's perf_counter (seconds): to set the
    # phase beside timings the script makes itself.
    host_span_s: tuple[float, float] | None = None
    # the light phase's: the unsettled steps left out of `times_us`, and whether the rest settled
    settling: Settling | None = None

    @property
    def median_us(self) -> float | None:
        import statistics  # here: it imports decimal and fractions, and the command line starts without

        return statistics.median(self.times_us) if self.times_us else None

    @property
    def mean_us(self) -> float | None:
        """The phase's whole time over its steps: the step time a loop's throughput reflects."""
        return sum(self.times_us) / len(self.times_us) if self.times_us else None


@dataclass(frozen=True)
class StepFound:
    """What a step of the script is, and how gpudoctor found it (`runner.discovery.StepDefinition`)."""

    source: str  # explicit, optimizer, module, call, dataloader, loop, window
    description: str  # "one call of BertModel.forward"
    module: str | None = None  # the root module's class
    calls_per_step: float | None = None  # root module calls per step, as measured in the light phase

    @classmethod
    def of(cls, definition: Any, calls_per_step: float | None, root: str | None = None) -> StepFound:
        """`root`: the root module's class where the definition names none (a step of the optimizer,
        with the root module called in it, several times under gradient accumulation)."""
        return cls(definition.source, definition.description, definition.module or root, calls_per_step)


@dataclass(frozen=True)
class Environment:
    python: str
    torch: str | None = None
    cuda: str | None = None  # torch.version.cuda
    cudnn: int | None = None
    device: str = "cpu"  # "cuda:0" or "cpu"
    gpu_name: str | None = None
    driver: str | None = None  # from NVML, when it is there
    tf32_matmul: bool | None = None  # torch.backends.cuda.matmul.allow_tf32
    tf32_cudnn: bool | None = None
    float32_matmul_precision: str | None = None
    cudnn_benchmark: bool | None = None
    cudnn_deterministic: bool | None = None
    deterministic_algorithms: bool | None = None
    torch_threads: int | None = None
    torch_interop_threads: int | None = None
    cpu_count: int | None = None


@dataclass(frozen=True)
class RunRecord(Serialized):
    """One `gpudoctor run`. Times in µs, sizes in bytes; a capability that was missing is `None` with
    its reason (`nvml_missing`, `memory_missing`)."""

    json_schema: ClassVar[str | None] = SCHEMA
    json_what: ClassVar[str] = "a gpudoctor run record"

    argv: tuple[str, ...]  # the script's sys.argv
    started_at: str  # ISO 8601, UTC
    options: dict[str, Any]  # warmup, light_steps, steps, light, with_stack, ...
    environment: Environment | None
    outcome: str  # completed, stopped (by gpudoctor after capture), exit, exception, interrupted
    exit_code: int
    steps_seen: int  # step boundaries seen in all
    light: StepTimes | None = None
    traced: StepTimes | None = None  # the profiled (active) steps, same clock as `light`
    trace_files: tuple[str, ...] = ()  # relative to the run directory
    # torch.cuda.memory_stats() subset at the end of the light phase; its peaks are the last light
    # step's (runner.memory resets them at every step boundary: memory_run has each step's)
    memory: dict[str, int] | None = None
    memory_missing: str | None = None
    nvml_samples: tuple[dict[str, Any], ...] = ()  # GpuSample.to_json() during the light phase
    nvml_summary: dict[str, Any] | None = None  # MonitorSummary.to_json()
    nvml_missing: str | None = None
    # runner.memory's record (schema gpudoctor.memory-run/1): per-step peaks, the detail step, the
    # out-of-memory moment; the snapshots it names are under memory/ in the run directory
    memory_run: dict[str, Any] | None = None
    error: str | None = None  # the script's exception, one line
    notes: tuple[str, ...] = ()
    step: StepFound | None = None  # how the script's step was found (None in records before it was)
    schema: str = field(default=SCHEMA)

    @property
    def profiler_overhead(self) -> float | None:
        """Traced over light median step time, minus one; None when either phase has no steps."""
        light = self.light.median_us if self.light else None
        traced = self.traced.median_us if self.traced else None
        if not light or not traced:
            return None
        return traced / light - 1

    def to_json(self) -> dict[str, Any]:
        doc = to_jsonable(self)
        doc["profiler_overhead"] = self.profiler_overhead
        doc["light_median_us"] = self.light.median_us if self.light else None
        doc["traced_median_us"] = self.traced.median_us if self.traced else None
        return doc
