"""Kernel time: the GPU activities (kernels, copies, memsets) of single, synchronized calls, as CUPTI
records them through torch.profiler — the durations Nsight Compute and a Kineto trace report. It answers
"how long do this function's kernels run", apart from the gaps between them and the launch pipelining
that back-to-back device time includes."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

from gpudoctor.timing.measurement import KernelTimes

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
MAX_NAMES = 8


def profile_kernels(
    fn: Callable[[], object], calls: int, sync: Callable[[], None], before_call: Callable[[], None]
) -> KernelTimes | str:
    """Run `calls` calls under torch.profiler (CUDA activity only), synchronizing after each so that
    every call's kernels run alone, as under ncu. Returns the per-call sums, or why there are none."""
    from torch.profiler import ProfilerActivity, profile

    before_call()
    fn()  # outside the profile: the profiler's own start-up work stays out
    sync()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                before_call()
                fn()
                sync()
        activities = _gpu_activities(prof)
    except Exception as err:  # CUPTI missing or busy (another profiler running): a reason, not a crash
        return f"kernel time not measured: {type(err).__name__}: {str(err)[:120]}"
    return summarize_activities(activities, calls)


def summarize_activities(activities: list[tuple[float, float, str]], calls: int) -> KernelTimes | str:
    """(start_us, duration_us, name) of every GPU activity of `calls` calls, in time order, → per-call
    sums. Calls are told apart by count, so every call must launch the same number of activities."""
    if not activities:
        return "kernel time not measured: the profiler saw no GPU activity"
    activities = sorted(activities)
    per_call = len(activities) / calls
    totals: dict[str, float] = {}
    for _, dur, name in activities:
        totals[name] = totals.get(name, 0.0) + dur
    names = tuple(sorted(totals, key=totals.__getitem__, reverse=True)[:MAX_NAMES])
    if per_call != int(per_call):
        mean = sum(d for _, d, _ in activities) / calls
        return KernelTimes(per_call_us=(mean,), kernels_per_call=per_call, names=names, grouped=False)
    k = int(per_call)
    sums = tuple(sum(d for _, d, _ in activities[i : i + k]) for i in range(0, len(activities), k))
    return KernelTimes(per_call_us=sums, kernels_per_call=per_call, names=names, grouped=True)


def _gpu_activities(prof: Any) -> list[tuple[float, float, str]]:
    try:
        from torch.autograd import DeviceType

        return [
            (e.start_ns() / 1e3, e.duration_ns() / 1e3, e.name())
            for e in prof.profiler.kineto_results.events()
            if e.device_type() == DeviceType.CUDA
        ]
    except AttributeError:  # a torch without kineto_results: read the exported trace instead
        return _from_chrome_trace(prof)


def _from_chrome_trace(prof: Any) -> list[tuple[float, float, str]]:
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
    finally:
        os.unlink(path)
    return [
        (float(e["ts"]), float(e["dur"]), str(e.get("name", "")))
        for e in events
        if e.get("cat") in GPU_CATEGORIES and "dur" in e
    ]
