"""`Facts`: the per-step quantities every rule reasons with, computed once from an `Analysis`. The profiler
slows the host, not the GPU's kernels, so where the unprofiled step time T is known the GPU's real idle
time is T − busy and each host-caused idle figure is scaled by `host_scale` (real idle / traced idle).
Without steps the traced time is one whole, so no rule extrapolates a per-step saving from a whole trace.
Every per-step figure is a mean over the analysis's steps (warm-up steps left out), so the busy time and
the idle time by cause add up to the step."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpudoctor.analysis.summary import Analysis


@dataclass(frozen=True)
class Facts:
    steps: int  # profiled steps averaged (1 when the trace has no steps: then the traced time)
    traced_step_us: float  # mean profiled step time (of the steps every figure here is a mean over)
    step_us: float  # the step time savings are a share of: unprofiled if known, else traced
    busy_us: float  # GPU busy per step (mean)
    traced_idle_us: float  # GPU idle per step, as traced (mean)
    idle_us: float  # real GPU idle per step: step_us − busy_us
    host_scale: float  # idle_us / traced_idle_us, in [0, 1]
    host_wait_us: float  # per step, as traced
    host_wait_after_sync_us: float
    sync_idle_us: float
    launch_gap_us: float
    dataloader_us: float  # host time in DataLoader __next__ per step
    dataloader_wait_us: float  # GPU host-wait idle while the host was in the DataLoader, as traced
    optimizer_us: float
    optimizer_wait_us: float  # GPU host-wait idle while the host was in Optimizer.step, as traced
    launch_count: float
    launch_us: float
    allocator_calls: float
    allocator_us: float
    optimizer_launches: float
    optimizer_kernel_us: float  # GPU time of the kernels Optimizer.step launched, per step
    kernel_us: float  # kernel time per step
    cpu_ops_us: float = 0.0  # host time in top-level PyTorch ops per step, as traced
    sync_call_us: float = 0.0  # host time in runtime calls that block on the GPU per step, as traced
    # idle before GPU work whose launching call the trace does not hold (cause unknown), per step
    other_idle_us: float = 0.0
    # A trace alone (no unprofiled step time): the profiler's estimated host cost per traced step and the
    # step it leaves (analysis.profiler_cost); None where the unprofiled step is known or nothing is known.
    profiler_est_us: float | None = None
    est_unprofiled_us: float | None = None
    # No steps: the "step" is the traced time as a whole, and every figure and saving is a share of it.
    whole_trace: bool = False

    @property
    def per(self) -> str:
        """'per step', or 'in the traced time' where there are no steps."""
        return "in the traced time" if self.whole_trace else "per step"

    @property
    def profiler_overhead(self) -> float | None:
        """Traced over unprofiled step time, minus one; None when the unprofiled time is unknown."""
        return self.traced_step_us / self.step_us - 1 if self.step_us != self.traced_step_us else None

    @property
    def launch_wait_us(self) -> float:
        """Real host-wait idle per step that neither a sync, the DataLoader nor the optimizer explains:
        the host was busy launching (or in Python between launches)."""
        explained = self.host_wait_after_sync_us + self.dataloader_wait_us + self.optimizer_wait_us
        return max(self.host_wait_us - explained, 0.0) * self.host_scale

    @property
    def busy_fraction(self) -> float:
        return min(self.busy_us / self.step_us, 1.0) if self.step_us > 0 else 0.0

    def pct(self, us: float) -> float:
        """A per-step time as a percentage of the step."""
        return 100.0 * us / self.step_us if self.step_us > 0 else 0.0

    @property
    def outside_ops_us(self) -> float:
        """Host time per traced step in neither a PyTorch op nor the DataLoader: the script's own
        Python (0 without steps)."""
        if not self.cpu_ops_us:
            return 0.0
        return max(self.traced_step_us - self.cpu_ops_us - self.dataloader_us, 0.0)

    @property
    def host_python_us(self) -> float:
        """Host time per traced step in neither a PyTorch op, the DataLoader nor a call that waits for
        the GPU: Python between the ops (a sync inside an op is taken out twice: an underestimate)."""
        return max(self.outside_ops_us - self.sync_call_us, 0.0)

    def per_step(self, total_us: float) -> float:
        return total_us / self.steps


def facts_of(a: Analysis, unprofiled_us: float | None = None) -> Facts | None:
    """None when the trace has no GPU activity: nothing for the GPU rules to say. Without steps the
    traced time is one whole: its host figures count (`Analysis.whole_trace`), and a step time measured
    without the profiler does not apply to it. `unprofiled_us` stands in for the analysis's unprofiled
    step time (the doctor passes the profiler-cost estimate's, to judge findings without the profiler)."""
    if a.window is None:
        return None
    whole = a.whole_trace
    if a.steps and all(s.gpu is not None for s in a.steps):
        rows = list(a.steps)
        traced = statistics.fmean(s.duration_us for s in rows)
    elif not a.steps and whole is not None and whole.gpu is not None:
        rows = [whole]
        traced = whole.duration_us
    else:
        rows = []
        traced = a.window.window_us
    n = max(len(rows), 1)
    if rows:
        busy = sum(s.gpu.busy_us for s in rows) / n  # type: ignore[union-attr]
        causes = {c: sum(s.gpu.idle_by_cause_us[c] for s in rows) / n for c in a.window.idle_by_cause_us}  # type: ignore[union-attr]
        after_sync = sum(s.gpu.host_wait_after_sync_us for s in rows) / n  # type: ignore[union-attr]
    else:  # an analysis saved before `whole_trace` existed: the GPU window, without host figures
        w = a.window
        busy, causes, after_sync = w.busy_us, dict(w.idle_by_cause_us), w.host_wait_after_sync_us

    def mean(attr: str) -> float:
        return sum(float(getattr(s.cpu, attr)) for s in rows) / n if rows else 0.0

    whole_trace = not a.steps
    known = unprofiled_us or a.unprofiled_step_us
    step = known if known and not whole_trace else traced
    cost = a.profiler_cost
    estimate = cost is not None and not a.unprofiled_step_us and not whole_trace and unprofiled_us is None
    traced_idle = max(traced - busy, 0.0)
    idle = max(step - busy, 0.0)
    return Facts(
        steps=n,
        traced_step_us=traced,
        step_us=step,
        busy_us=busy,
        traced_idle_us=traced_idle,
        idle_us=idle,
        host_scale=min(idle / traced_idle, 1.0) if traced_idle > 0 else 0.0,
        host_wait_us=causes.get("host_wait", 0.0),
        host_wait_after_sync_us=after_sync,
        sync_idle_us=causes.get("sync", 0.0),
        launch_gap_us=causes.get("launch_gap", 0.0),
        dataloader_us=mean("dataloader_us"),
        dataloader_wait_us=mean("dataloader_gpu_wait_us"),
        optimizer_us=mean("optimizer_us"),
        optimizer_wait_us=mean("optimizer_gpu_wait_us"),
        launch_count=mean("launch_count"),
        launch_us=mean("launch_us"),
        allocator_calls=mean("allocator_calls"),
        allocator_us=mean("allocator_us"),
        optimizer_launches=mean("optimizer_launches"),
        optimizer_kernel_us=mean("optimizer_kernel_us"),
        kernel_us=a.kernels.total_us / n,
        cpu_ops_us=mean("cpu_ops_us"),
        sync_call_us=mean("sync_us"),
        other_idle_us=causes.get("other", 0.0),
        whole_trace=whole_trace,
        profiler_est_us=cost.est_us if estimate and cost is not None else None,
        est_unprofiled_us=cost.est_unprofiled_us(traced, busy) if estimate and cost is not None else None,
    )
