"""`launch_overhead`: the GPU idles between many short kernels while the CPU launches them one by one.
Nsight Systems' "GPU gaps" and TensorBoard's "GPU utilization < 50%" rules, told apart from data
loading and synchronizations, which have rules of their own."""

from __future__ import annotations

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, pct, step_phrase, us
from gpudoctor.rules.batch import launch_wait_share
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix

MIN_LAUNCHES_PER_STEP = 100
MAX_MEAN_KERNEL_US = 50.0
# An inferred iteration can be a single op (a loop of identical tiny ops repeats every launch): then the
# launches come back to back — one at least every 20 µs of the step — over 100 or more in the trace.
MIN_LAUNCHES_PER_MS = 50.0

FIX = Fix(
    summary="Launch the step's kernels as one CUDA graph (torch.compile mode='reduce-overhead', or "
    "torch.cuda.CUDAGraph), or fuse them with torch.compile; give each launch more work.",
    snippet="""\
# Capture the step once, replay it with a single launch (static shapes, inputs copied into place):
step_fn = torch.compile(model, mode="reduce-overhead")
out = step_fn(inputs)

# or by hand, for inference:
static_in = inputs.clone()
stream = torch.cuda.Stream()
stream.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(stream):
    for _ in range(3):                       # warm up outside the graph
        model(static_in)
torch.cuda.current_stream().wait_stream(stream)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    static_out = model(static_in)
static_in.copy_(inputs)
graph.replay()                               # static_out now holds the result""",
)


def launch_overhead(a: Analysis, f: Facts) -> Finding | None:
    per_ms = 1000 * f.launch_count / f.traced_step_us if f.traced_step_us > 0 else 0.0
    dense = per_ms >= MIN_LAUNCHES_PER_MS and f.launch_count * f.steps >= MIN_LAUNCHES_PER_STEP
    if f.launch_count < MIN_LAUNCHES_PER_STEP and not dense:
        return None
    if f.launch_count <= 0:
        return None
    mean_kernel = f.kernel_us / f.launch_count
    if mean_kernel > MAX_MEAN_KERNEL_US:
        return None
    # Host-caused idle that neither data loading, the optimizer nor a synchronization explains; a CUDA
    # graph removes the ops' host work, not the script's own Python between them: the step cannot get
    # shorter than that, nor than the GPU's work.
    wait_us = f.launch_wait_us
    outside_us = f.outside_ops_us
    # Where kernels are under-filled by a small batch, the part of the wait a batch that fills the GPU
    # spreads over more samples is small_batch's; this finding claims the rest.
    share = launch_wait_share(a)
    saving_us = min(wait_us * share, max(f.step_us - max(f.busy_us, outside_us), 0.0))
    per_launch = f.launch_us / f.launch_count
    evidence = [
        f"{f.launch_count:.0f} kernel launches {f.per}; the mean kernel runs {us(mean_kernel)}, "
        f"{pct(100 * a.kernels.short_count_share)} of kernels under 10 µs.",
        f"The host spends {us(per_launch)} per launch call; the GPU waits for the host {us(wait_us)} "
        f"{step_phrase(f)} ({pct(f.pct(wait_us))}) and is busy {pct(100 * f.busy_fraction)} of it.",
    ]
    if share < 1:
        evidence.append(
            f"The kernels are too small to fill the GPU (small_batch): a batch that fills it shares "
            f"{pct(100 * (1 - share))} of this wait among more samples; this finding claims the rest."
        )
    elif saving_us < wait_us:
        evidence.append(
            f"The host also spends {us(outside_us)} {'of the traced time' if f.whole_trace else 'of each traced step'} outside PyTorch ops (the script's own "
            f"Python): a CUDA graph does not remove that, so at most {us(saving_us)} goes."
        )
    return finding(
        "launch_overhead",
        "The GPU waits while the CPU launches many short kernels",
        f.pct(saving_us),
        evidence,
        FIX,
        {
            "launches_per_step": f.launch_count,
            "mean_kernel_us": mean_kernel,
            "host_wait_us": wait_us,
            "outside_ops_us": outside_us,
        },
    )
