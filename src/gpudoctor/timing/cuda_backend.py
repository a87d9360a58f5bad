"""The CUDA backend. Device time comes from CUDA events around a sample whose launches the GPU cannot
catch up with: a spin kernel (`torch.cuda._sleep`) holds the stream while the host enqueues the start
event and the calls, so launch overhead stays out (nvbench's "blocking kernel"). Short work is captured
`calls` times into one CUDA graph and replayed, so that the calls run back to back with no launch gaps;
cold mode reads a buffer twice the size of L2 before the spin, outside the timed region."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpudoctor.timing.kernels import profile_kernels
from gpudoctor.timing.measurement import KernelTimes
from gpudoctor.timing.runner import Plan
from gpudoctor.util.errors import GpudoctorError

DEFAULT_L2_BYTES = 50 << 20
MAX_SPIN_US = 20_000.0  # longer than this and the function is launch-bound: say so instead of waiting
SPIN_MARGIN_US = 20.0
FIRST_GUESS_CYCLES_PER_US = 1000.0  # corrected after the first sample from the spin's measured length
MAX_ATTEMPTS = 3
BUSY_WAIT_US = 2000.0  # shorter rests spin on the host: sleep oversleeps, and a core woken from it is slow


class GraphCaptureError(GpudoctorError):
    """method="graph" was asked for and the function cannot be captured into a CUDA graph."""


class CudaBackend:
    has_host_latency = True
    # Back to back, heavy kernels (a bf16 matmul) hit the power limit and the SM clock drops by ~10%,
    # more or less from run to run; resting as long as each sample keeps the clock at its peak.
    default_cooldown = 1.0

    def __init__(
        self,
        fn: Callable[[], object],
        *,
        device_index: int,
        cold: bool = False,
        method: str = "auto",
        grad_to_none: Sequence[Any] = (),
        flush_bytes: int | None = None,
    ) -> None:
        import torch

        self._torch = torch
        self._fn = fn
        self._dev = torch.device("cuda", device_index)
        self.device = f"cuda:{device_index}"
        self._cold = cold
        self._method = method
        self._grads = tuple(grad_to_none)
        props = torch.cuda.get_device_properties(self._dev)
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or DEFAULT_L2_BYTES)
        self._flush_buf = (
            torch.zeros((flush_bytes or 2 * self.l2_bytes) // 4, dtype=torch.float32, device=self._dev)
            if cold
            else None
        )
        self._sleep = getattr(torch.cuda, "_sleep", None)
        self._cycles_per_us = FIRST_GUESS_CYCLES_PER_US
        self._spin_us = 2 * SPIN_MARGIN_US
        self._events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        self._graph: Any = None
        self._calls = 1
        self._host_mode = False
        self._first_us = 0.0
        self._measuring = False
        self._measured = 0
        self._exposed = 0  # measured samples whose spin ended before the host had enqueued them
        self._enqueue_per_call: list[float] = []
        self._device_per_call: list[float] = []

    # ---- pieces ----
    def _reset_grads(self) -> None:
        for t in self._grads:
            t.grad = None

    def _flush(self) -> None:
        if self._flush_buf is not None:
            # A read, not a write: a written buffer leaves L2 full of dirty lines that the timed work
            # would then write back to memory inside its own timed region.
            self._flush_buf.amax()

    def _sync(self) -> None:
        self._torch.cuda.synchronize(self._dev)

    def _body(self) -> None:
        if self._graph is not None:
            self._graph.replay()
            return
        fn, reset = self._fn, self._reset_grads
        for _ in range(self._calls):
            reset()
            fn()

    # ---- Backend ----
    def first_call(self) -> float:
        self._sync()
        self._reset_grads()
        t0 = time.perf_counter_ns()
        self._fn()
        self._sync()
        self._first_us = (time.perf_counter_ns() - t0) / 1e3
        return self._first_us

    def estimate_call_us(self) -> float:
        self._calls, self._graph = 1, None
        reps = 1 if self._first_us > 50_000 else 3  # the first of three also tunes the spin's length
        return min(self.sample() for _ in range(reps))

    def prepare(self, calls: int) -> Plan:
        if self._method == "host":
            self._calls, self._host_mode = calls, True
            return Plan("host_sync", calls)
        calls = 1 if self._cold and self._method != "graph" else calls
        self._calls = calls
        notes: tuple[str, ...] = ()
        if self._method == "graph" or (self._method == "auto" and calls > 1):
            # A capture that fails leaves torch's CUDA RNG unusable, so a function that synchronizes
            # with the host (the usual reason) is found by sync-debug mode first, without capturing.
            reason = self._synchronizes()
            try:
                if reason:
                    raise RuntimeError(f"the function synchronizes with the host ({reason})")
                self._graph = self._capture(calls)
                return Plan("cuda_graph", calls, self._sleep_note())
            except Exception as err:
                if self._method == "graph":
                    raise GraphCaptureError(
                        f"the function cannot be captured into a CUDA graph: {_one_line(err)}"
                    ) from err
                notes = (
                    f"no CUDA graph: {_one_line(err)}; timed {calls} eager calls per sample behind a "
                    "spin kernel instead",
                )
        return Plan("cuda_events", calls, notes + self._sleep_note())

    def _synchronizes(self) -> str | None:
        """Why one call of the function would synchronize with the host, or None."""
        torch = self._torch
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            self._reset_grads()
            self._fn()
        except RuntimeError as err:
            if "synchroniz" in str(err):
                return str(err).strip().splitlines()[0][:160]
            raise
        finally:
            torch.cuda.set_sync_debug_mode(previous)
        return None

    def _sleep_note(self) -> tuple[str, ...]:
        if self._sleep is None:
            return ("torch.cuda._sleep is missing: samples may include launch overhead",)
        return ()

    def _capture(self, calls: int) -> Any:
        torch = self._torch
        stream = torch.cuda.current_stream(self._dev)
        side = torch.cuda.Stream(self._dev)
        side.wait_stream(stream)
        with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph's docs ask
            for _ in range(2):
                self._reset_grads()
                self._fn()
        stream.wait_stream(side)
        generator = torch.cuda.default_generators[self._dev.index]
        saved_rng = generator.clone_state() if hasattr(generator, "clone_state") else None
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                for _ in range(calls):
                    self._reset_grads()
                    self._fn()
            graph.replay()
            self._sync()
        except Exception:
            with contextlib.suppress(Exception):  # the capture's own error is the one to report
                graph.reset()
                self._sync()
            if saved_rng is not None:  # a failed capture leaves the generator "capturing": undo that
                with contextlib.suppress(Exception):
                    generator.graphsafe_set_state(saved_rng)
            raise
        return graph

    def sample(self) -> float:
        if self._host_mode:
            return self._host_sample()
        for _ in range(MAX_ATTEMPTS):
            elapsed_us, exposed = self._timed_sample()
            if not exposed:
                break  # else the host was late (woken from a rest, preempted): the spin now covers it
        if self._measuring:
            self._measured += 1
            self._exposed += exposed
        return elapsed_us

    def _timed_sample(self) -> tuple[float, bool]:
        """One sample: [flush] e0 spin e1 body e2. Returns the µs from e1 to e2 and whether the spin
        ended before the host had enqueued the body (then launch gaps may be inside the sample)."""
        e0, e1, e2 = self._events
        self._flush()  # eager calls reset grads one by one; a graph replays what its capture did
        e0.record()
        cycles = self._spin(self._spin_us)
        e1.record()
        t0 = time.perf_counter_ns()
        self._body()
        e2.record()
        enqueue_us = (time.perf_counter_ns() - t0) / 1e3
        e2.synchronize()
        spin_us = e0.elapsed_time(e1) * 1e3
        elapsed_us = e1.elapsed_time(e2) * 1e3
        if cycles and spin_us > 0:
            self._cycles_per_us = cycles / spin_us
        self._spin_us = min(MAX_SPIN_US, 1.5 * enqueue_us + SPIN_MARGIN_US)
        if self._measuring and self._graph is None:
            self._enqueue_per_call.append(enqueue_us / self._calls)
            self._device_per_call.append(elapsed_us / self._calls)
        return elapsed_us, bool(cycles) and spin_us < enqueue_us

    def _spin(self, us: float) -> int:
        if self._sleep is None:
            return 0
        cycles = max(1000, int(us * self._cycles_per_us))
        self._sleep(cycles)
        return cycles

    def _host_sample(self) -> float:
        self._sync()
        self._reset_grads()
        self._flush()
        self._sync()
        t0 = time.perf_counter_ns()
        fn, reset = self._fn, self._reset_grads
        for _ in range(self._calls):
            reset()
            fn()
        self._sync()
        return (time.perf_counter_ns() - t0) / 1e3

    def start_measuring(self) -> None:
        self._measuring = True

    def host_latency(self) -> float:
        self._sync()
        self._reset_grads()
        if self._cold:
            self._flush()
            self._sync()
        t0 = time.perf_counter_ns()
        self._fn()
        self._sync()
        return (time.perf_counter_ns() - t0) / 1e3

    def rest(self, us: float) -> None:
        rest(us)  # the sample was synchronized: the GPU is idle meanwhile

    def kernel_times(self, calls: int) -> KernelTimes | str:
        return profile_kernels(self._fn, calls, self._sync, self._reset_grads)

    def notes(self) -> tuple[str, ...]:
        out = []
        if self._exposed:
            out.append(
                f"in {self._exposed} of {self._measured} samples the host was still launching when the spin "
                "kernel ended: those may include launch overhead"
            )
        if self._enqueue_per_call:
            # a low percentile: the launch cost itself, not the times the host was preempted or slow
            enqueue = sorted(self._enqueue_per_call)[len(self._enqueue_per_call) // 10]
            device = sorted(self._device_per_call)[len(self._device_per_call) // 2]
            if enqueue > device:
                out.append(
                    f"launch-bound: launching one call takes {enqueue:.3g} µs on the host, more than its "
                    f"{device:.3g} µs on the GPU; back to back, the GPU would wait for the CPU"
                )
        return tuple(out)

    def close(self) -> None:
        if self._graph is not None:
            self._graph.reset()
            self._graph = None
        self._flush_buf = None
        self._sync()


def rest(us: float) -> None:
    """Wait `us` µs on the host: busy for short waits, sleeping for long ones."""
    if us >= BUSY_WAIT_US:
        time.sleep(us / 1e6)
        return
    end = time.perf_counter_ns() + us * 1e3
    while time.perf_counter_ns() < end:
        pass


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200]}" if text else type(err).__name__
