"""What a capture samples beside its step times: the allocator's statistics at the light phase's end,
NVML samples through the light phase (a `MonitorSession` in a background thread), and when the memory
recorder reads the allocator at a step boundary (`MemoryCadence`). A missing capability is a reason,
never an error."""

from __future__ import annotations

from typing import Any

from gpudoctor.runner.environment import cuda_uuid
from gpudoctor.runner.phases import LiveOptions

MEMORY_KEYS = (
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "reserved_bytes.all.current",
    "reserved_bytes.all.peak",
    "num_alloc_retries",
    "num_ooms",
    "num_device_alloc",
    "num_device_free",
)
MEMORY_EVERY_S = 0.02  # light-phase memory statistics at most this often (each group's peak),
MEMORY_EACH_STEPS = 5  # after the first steps of the phase, each read alone


def allocator_statistics(cuda: bool) -> tuple[dict[str, int] | None, str | None]:
    """torch.cuda's memory statistics now (MEMORY_KEYS), or why there are none."""
    if not cuda:
        return None, "no CUDA device in use: torch.cuda memory statistics are GPU-only"
    import torch

    stats = torch.cuda.memory_stats()
    return {k: int(stats[k]) for k in MEMORY_KEYS if k in stats}, None


class MemoryCadence:
    """When the allocator's statistics are read at a step boundary. Reading them costs tens of µs: in
    the light phase, after its first MEMORY_EACH_STEPS steps, once per group of steps at least
    MEMORY_EVERY_S long (each group's peak), so that the step time keeps the reads out; in every other
    phase, at each boundary."""

    def __init__(self) -> None:
        self.read_at = 0.0  # when the statistics were last read
        self.light_rows = 0  # light-phase steps whose statistics were read

    def due(self, phase: str, now: float) -> bool:
        """Whether the step of `phase` that ends `now` is read (and counted, in the light phase)."""
        rows = self.light_rows if phase == "light" else 0
        due = phase != "light" or rows < MEMORY_EACH_STEPS or now - self.read_at >= MEMORY_EVERY_S
        if phase == "light" and due:
            self.light_rows += 1
        return due

    def read(self, now: float) -> None:
        self.read_at = now

    def restart(self) -> None:
        self.light_rows = 0


class NvmlSampling:
    """The light phase's NVML samples of the GPU this process uses (every GPU where its UUID is not
    found), and their summary; or why there are none (turned off, no CUDA device, no NVML)."""

    def __init__(self, options: LiveOptions) -> None:
        self.options = options
        self.samples: tuple[dict[str, Any], ...] = ()
        self.summary: dict[str, Any] | None = None
        self.missing: str | None = None
        self._running: Any = None  # (backend, session)

    def start(self, cuda: bool) -> None:
        if not self.options.nvml:
            self.missing = "turned off (--no-nvml)"
            return
        if not cuda:
            self.missing = "no CUDA device in use"
            return
        from gpudoctor.monitor import MonitorSession, open_backend
        from gpudoctor.util.errors import GpudoctorError

        try:
            backend = open_backend()
        except (GpudoctorError, OSError) as err:
            self.missing = str(err)
            return
        try:
            devices = [backend.resolve(cuda_uuid())]
        except Exception:  # an unknown UUID (MIG, another namespace): watch every GPU
            devices = None
        session = MonitorSession(backend, interval_s=self.options.nvml_interval_s, devices=devices, keep=None)
        self._running = (backend, session.start())

    def stop(self) -> None:
        """Stop sampling and keep what was sampled; nothing when not running."""
        if self._running is None:
            return
        (backend, session), self._running = self._running, None
        try:
            summary = session.stop(raise_error=False)
            self.samples = tuple(s.to_json() for s in session.sampler.samples())
            self.summary = summary.to_json()
        finally:
            backend.close()


class ChildClocks:
    """The clocks of the GPU a child process runs on and the host beside it (`monitor.host`), sampled
    from this process while the `with` block runs (nothing in the child); a sampler that fails leaves
    no readings of its own, never the block's failure."""

    def __init__(self, watch: Any | None, host: Any | None = None) -> None:
        self._watch = watch  # a monitor.ClockWatch, not started; None: no NVML here
        self._host = host  # a monitor.host.HostWatch, not started; None: no /proc here
        self.failed: str | None = None if watch is not None else "no NVML"
        self.host_failed: str | None = None if host is not None else "no /proc"

    def __enter__(self) -> ChildClocks:
        if self.failed is None:
            try:
                self._watch.__enter__()
            except Exception as err:  # NVML's own errors: the child runs all the same
                self.failed = f"{type(err).__name__}: {err}"
        if self.host_failed is None:
            try:
                self._host.__enter__()
            except Exception as err:  # /proc unreadable, or the reading thread's error
                self.host_failed = f"{type(err).__name__}: {err}"
        return self

    def __exit__(self, *exc: object) -> None:
        if self.failed is None:
            try:
                self._watch.__exit__(None, None, None)
            except Exception as err:  # the sampler thread's error, raised here
                self.failed = f"{type(err).__name__}: {err}"
        if self.host_failed is None:
            try:
                self._host.__exit__(None, None, None)
            except Exception as err:  # /proc unreadable, or the reading thread's error
                self.host_failed = f"{type(err).__name__}: {err}"

    def between(self, start: float, end: float) -> Any | None:
        """A `monitor.ClockReport` over the samples read from `start` to `end` (time.monotonic(),
        system-wide on Linux: a child's readings of it compare), or None where sampling failed."""
        return None if self.failed else self._watch.report_between(start, end)

    def host_between(self, start: float, end: float) -> Any | None:
        """A `monitor.host.HostReport` from `start` to `end`, or None where reading /proc failed."""
        return None if self.host_failed else self._host.report_between(start, end)


def child_clocks(
    env: dict[str, str], interval_s: float = 0.2, host_interval_s: float = 0.5
) -> ChildClocks | None:
    """`ChildClocks` on the GPU a child started with `env` runs on — the first of its
    CUDA_VISIBLE_DEVICES (an index, or a UUID), else GPU 0 — and on the host; the GPU's part left out
    where NVML cannot read it (no NVML, no GPU, a MIG slice), the host's where there is no /proc; None
    where neither can be read."""
    from gpudoctor.monitor.host import HostWatch

    host = HostWatch(interval_s=host_interval_s) if HostWatch.available() else None
    watch = _clock_watch(env, interval_s)
    return None if watch is None and host is None else ChildClocks(watch, host)


def _clock_watch(env: dict[str, str], interval_s: float) -> Any | None:
    from gpudoctor.monitor.clocks import ClockWatch
    from gpudoctor.util.errors import GpudoctorError

    first = env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    device: int | str = int(first) if first.isdigit() else first
    if isinstance(device, str) and (not device or device.lower().startswith("mig-")):
        return None  # no device, or a MIG slice (NVML reads a whole GPU's clocks)
    try:
        return ClockWatch(device, interval_s=interval_s)
    except (GpudoctorError, OSError):
        return None
