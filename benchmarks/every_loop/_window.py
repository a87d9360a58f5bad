"""The plain timing the benchmark compares gpudoctor with, as a user would time a loop: after a warm-up
(at least EVERY_LOOP_SKIP steps and EVERY_LOOP_SKIP_S seconds), a window of at least EVERY_LOOP_MIN_S
seconds with the GPU synchronized at its two ends only (a sync per step would stop the host running
ahead). Off unless EVERY_LOOP_TIMING names the JSON file to write; `tick()` is called once per step
(iteration, optimizer step, generate call). The host time of each step in the window is kept too, to
show stalls. Once the window is timed the process exits."""

from __future__ import annotations

import json
import os
import statistics
import time

_PATH = os.environ.get("EVERY_LOOP_TIMING")
_SKIP = int(os.environ.get("EVERY_LOOP_SKIP", "10"))
_SKIP_S = float(os.environ.get("EVERY_LOOP_SKIP_S", "3.0"))
_MIN_S = float(os.environ.get("EVERY_LOOP_MIN_S", "2.0"))
_state: dict = {"n": 0, "first": None, "start": None, "start_n": 0, "ticks": [], "done": False}


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def tick() -> None:
    if _PATH is None or _state["done"]:
        return
    now = time.perf_counter()
    _state["n"] += 1
    if _state["first"] is None:
        _state["first"] = now
    if _state["start"] is None:
        if _state["n"] >= _SKIP and now - _state["first"] >= _SKIP_S:
            _sync()
            _state["start"], _state["start_n"] = time.perf_counter(), _state["n"]
            _state["ticks"] = [_state["start"]]
        return
    _state["ticks"].append(now)
    if now - _state["start"] >= _MIN_S:
        _sync()
        seconds = time.perf_counter() - _state["start"]
        steps = _state["n"] - _state["start_n"]
        gaps = [1e6 * (b - a) for a, b in zip(_state["ticks"], _state["ticks"][1:], strict=False)]
        with open(_PATH, "w") as f:
            json.dump(
                {
                    "steps": steps,
                    "seconds": seconds,
                    "step_us": 1e6 * seconds / steps,
                    "host_median_us": statistics.median(gaps),
                    "host_max_us": max(gaps),
                    "warmup_steps": _state["start_n"],
                },
                f,
            )
        _state["done"] = True
        os._exit(0)  # timed: the rest of the loop would only cost the benchmark time
