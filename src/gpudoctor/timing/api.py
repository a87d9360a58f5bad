"""`bench(fn, *args, **options) -> Measurement`: the one entry point of the timing core, for the GPU
and the CPU alike. It picks the device, builds the backend and the NVML sensor, runs the measuring loop
and packs the outcome with its clocks, environment and (for bytes/FLOPs) the device's ceilings."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from contextlib import ExitStack
from typing import Any

from gpudoctor.device import ceilings as device_ceilings
from gpudoctor.device.ceilings import Ceilings
from gpudoctor.timing.clock import ClockSensor, HostClock, NoSensor, PerfCounterClock, open_nvml_sensor
from gpudoctor.timing.cpu_backend import CpuBackend
from gpudoctor.timing.measurement import BenchOptions, ClockInfo, Environment, Measurement
from gpudoctor.timing.runner import Backend, BenchTimeout, run
from gpudoctor.util.errors import NoGpuError, UsageError
from gpudoctor.util.gcpause import gc_paused

# Options for quick, rough figures (the ceilings, the explorer): enough to rank, not to publish.
QUICK = {"min_samples": 5, "min_time_s": 0.05, "max_noise": 0.01, "timeout_s": 3.0, "warmup_max_s": 0.5}


def bench(
    fn: Callable[..., object],
    *args: Any,
    fn_kwargs: Mapping[str, Any] | None = None,
    device: str = "auto",
    label: str | None = None,
    grad_to_none: Iterable[Any] | None = None,
    nbytes: int | None = None,
    flops: float | None = None,
    dtype: str | None = None,
    ceilings: Ceilings | bool | None = None,
    clock: HostClock | None = None,
    sensor: ClockSensor | None = None,
    backend: Backend | None = None,
    **options: Any,
) -> Measurement:
    """Time `fn(*args, **fn_kwargs)` and return every sample with its statistics.

    Args:
        device: "auto" (the device of the tensor arguments; else CUDA if there is one), "cpu",
            "cuda" or "cuda:N".
        grad_to_none: tensors whose `.grad` is set to None before every call, so that a backward pass
            does not accumulate into them.
        nbytes, flops: the bytes one call must move and the FLOPs it must do; they give the achieved
            bandwidth and FLOP/s and, with the device's measured ceilings, their share of them.
        dtype: which FLOP/s ceiling the share refers to ("bfloat16", "float16", "tf32", "float32");
            by default the dtype of the first floating-point tensor argument.
        ceilings: a `Ceilings` to use; True or None: the cached ones, measured once if missing (only
            when nbytes or flops is given); False: none.
        clock, sensor, backend: seams for tests (host clock, GPU clock sensor, device backend).
        **options: the fields of `BenchOptions` (mode="cold", min_time_s=..., max_noise=..., ...).
    """
    opts = BenchOptions.from_kwargs(**options)
    call = functools.partial(fn, *args, **(fn_kwargs or {})) if args or fn_kwargs else fn
    clock = clock or PerfCounterClock()
    grads = tuple(grad_to_none or ())
    name = label or getattr(fn, "__qualname__", None) or repr(fn)
    if backend is None:
        device = resolve_device(device, args, fn_kwargs)
        backend = _make_backend(call, device, opts, clock, grads)
    own_sensor = sensor is None
    if sensor is None:
        sensor = _open_sensor(backend.device)
    try:
        with ExitStack() as stack:
            if backend.device.startswith("cuda"):
                import torch

                stack.enter_context(torch.cuda.device(torch.device(backend.device)))
            if opts.disable_gc:
                stack.enter_context(gc_paused())
            outcome = run(backend, opts, clock, sensor)
    except BenchTimeout as err:
        raise BenchTimeout(f"{name}: {err}") from None
    finally:
        backend.close()
        if own_sensor:
            sensor.close()
    dtype = dtype or infer_dtype(args, backend.device)
    used_ceilings = _resolve_ceilings(ceilings, backend.device, nbytes, flops)
    return Measurement(
        label=name,
        device=backend.device,
        device_name=_device_name(backend.device),
        method=outcome.plan.method,
        mode=opts.mode,
        calls_per_sample=outcome.plan.calls,
        samples_us=outcome.samples_us,
        throttled=outcome.throttled,
        sample_sm_mhz=tuple(r.sm_mhz for r in outcome.readings),
        host_latency_us=outcome.host_latency_us,
        first_call_us=outcome.first_call_us,
        warmup=outcome.warmup,
        stop_reason=outcome.stop_reason,
        elapsed_s=outcome.elapsed_s,
        options=opts,
        clocks=ClockInfo(
            available=sensor.available,
            reason=sensor.reason,
            max_sm_mhz=sensor.max_sm_mhz,
            before=outcome.before,
            after=outcome.after,
            reasons_seen=outcome.reasons_seen,
        ),
        environment=Environment.capture(
            driver=driver_version() if backend.device.startswith("cuda") else None
        ),
        nbytes=nbytes,
        flops=flops,
        dtype=dtype,
        ceilings=used_ceilings,
        kernels=outcome.kernels,
        notes=outcome.notes,
    )


def resolve_device(device: str, args: tuple[Any, ...] = (), kwargs: Mapping[str, Any] | None = None) -> str:
    """The device to run on, "cpu" or "cuda:N", for a device option; NoGpuError for CUDA where there is none."""
    import torch

    if device == "auto":
        for t in _tensors([*args, *(kwargs or {}).values()]):
            if t.device.type == "cuda":
                return f"cuda:{t.device.index}"
        if any(True for _ in _tensors([*args, *(kwargs or {}).values()])):
            return "cpu"
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise UsageError(
            f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', not {device!r} ({err})"
        ) from None
    if dev.type == "cpu":
        return "cpu"
    if dev.type != "cuda":
        raise UsageError(f"gpudoctor benchmarks 'cpu' and 'cuda' devices, not {device!r}")
    if not torch.cuda.is_available():
        raise NoGpuError(f"device {device!r} asked for, but torch sees no CUDA GPU")
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        raise NoGpuError(f"no CUDA device {index} (torch sees {torch.cuda.device_count()})")
    return f"cuda:{index}"


def _tensors(values: Iterable[Any]) -> Iterable[Any]:
    import torch

    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (x for x in v if isinstance(x, torch.Tensor))
        elif isinstance(v, dict):
            yield from (x for x in v.values() if isinstance(x, torch.Tensor))


def _make_backend(
    call: Callable[[], object], device: str, opts: BenchOptions, clock: HostClock, grads: tuple[Any, ...]
) -> Backend:
    if device == "cpu":
        if opts.method not in ("auto", "host"):
            raise UsageError(f"method {opts.method!r} needs a CUDA device; on the CPU the host clock times")
        return CpuBackend(call, clock=clock, cold=opts.mode == "cold", grad_to_none=grads)
    from gpudoctor.timing.cuda_backend import CudaBackend

    index = int(device.split(":")[1])
    return CudaBackend(
        call, device_index=index, cold=opts.mode == "cold", method=opts.method, grad_to_none=grads
    )


def _open_sensor(device: str) -> ClockSensor:
    if not device.startswith("cuda"):
        return NoSensor("CPU: no GPU clocks to read")
    import torch

    index = int(device.split(":")[1])
    uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "") or None
    return open_nvml_sensor(uuid, index)


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    return device_ceilings.cpu_name()


def driver_version() -> str | None:
    """The NVIDIA driver's version through NVML, or None."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        return None


def infer_dtype(values: Iterable[Any], device: str) -> str | None:
    """The FLOP/s ceiling that fits the first floating-point tensor among `values` on `device`."""
    for t in _tensors(values):
        if not str(t.device).startswith(device.split(":")[0]):
            continue
        if t.is_floating_point():
            name = str(t.dtype).removeprefix("torch.")
            if name == "float32" and device.startswith("cuda"):
                import torch

                return "float32" if torch.get_float32_matmul_precision() == "highest" else "tf32"
            return name
    return None


def _resolve_ceilings(
    ceilings: Ceilings | bool | None, device: str, nbytes: int | None, flops: float | None
) -> Ceilings | None:
    if isinstance(ceilings, Ceilings):
        return ceilings
    if ceilings is False or (nbytes is None and flops is None):
        return None
    return measured_ceilings(device)


def measured_ceilings(device: str, *, remeasure: bool = False) -> Ceilings:
    """The device's ceilings from the cache, measured with `bench` (quick options) the first time."""
    device = resolve_device(device)

    def time_us(fn: Callable[[], object]) -> float:
        return bench(fn, device=device, host_latency=False, ceilings=False, **QUICK).median_us

    return device_ceilings.get_ceilings(device, time_us=time_us, remeasure=remeasure)
