"""The plain timing the benchmark compares gpudoctor with, as a user would time a loop: after a warm-up
(at least EVERY_LOOP_SKIP steps and EVERY_LOOP_SKIP_S seconds), a window of at least EVERY_LOOP_MIN_S
seconds with the GPU synchronized at its two ends only (a sync per step would stop the host running
ahead). Off unless EVERY_LOOP_TIMING names the JSON file to write; `tick()` is called once per step
(iteration, optimizer step, generate call).

One window, then the process exits (a plain run); or, with EVERY_LOOP_CONTINUOUS=1, window after window
until the script ends, each written as it closes, with its perf_counter span: under `gpudoctor run` the
windows inside its light phase time the same steps the plain way, in the same process."""

from __future__ import annotations

import json
import os
import statistics
import time

_PATH = os.environ.get("EVERY_LOOP_TIMING")
_SKIP = int(os.environ.get("EVERY_LOOP_SKIP", "10"))
_SKIP_S = float(os.environ.get("EVERY_LOOP_SKIP_S", "3.0"))
_MIN_S = float(os.environ.get("EVERY_LOOP_MIN_S", "2.0"))
_CONTINUOUS = os.environ.get("EVERY_LOOP_CONTINUOUS") == "1"
_state: dict = {"n": 0, "first": None, "start": None, "start_n": 0, "ticks": [], "windows": []}


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _open() -> None:
    _sync()
    _state["start"], _state["start_n"] = time.perf_counter(), _state["n"]
    _state["ticks"] = [_state["start"]]


def tick() -> None:
    if _PATH is None:
        return
    now = time.perf_counter()
    _state["n"] += 1
    if _state["first"] is None:
        _state["first"] = now
    if _state["start"] is None:
        if _state["n"] >= _SKIP and now - _state["first"] >= _SKIP_S:
            _open()
        return
    _state["ticks"].append(now)
    if now - _state["start"] >= _MIN_S:
        _close()


def _close() -> None:
    _sync()
    end = time.perf_counter()
    seconds = end - _state["start"]
    steps = _state["n"] - _state["start_n"]
    gaps = [1e6 * (b - a) for a, b in zip(_state["ticks"], _state["ticks"][1:], strict=False)]
    window = {
        "steps": steps,
        "seconds": seconds,
        "step_us": 1e6 * seconds / steps,
        "host_median_us": statistics.median(gaps),
        "host_max_us": max(gaps),
        "warmup_steps": _state["start_n"],
        "span_s": [_state["start"], end],
    }
    _state["windows"].append(window)
    with open(_PATH, "w") as f:
        json.dump({**window, "windows": _state["windows"]}, f)
    if not _CONTINUOUS:
        os._exit(0)  # timed: the rest of the loop would only cost the benchmark time
    _open()
