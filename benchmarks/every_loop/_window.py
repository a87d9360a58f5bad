"""The plain timing the benchmark compares gpudoctor with, as a user would time a loop: after the warm-up,
a window of at least `min_s` seconds with the GPU synchronized at its two ends only (a sync per step would
stop the host running ahead). Off unless EVERY_LOOP_TIMING names the JSON file to write; `tick()` is
called once per step (iteration, optimizer step, generate call)."""

from __future__ import annotations

import json
import os
import time

_PATH = os.environ.get("EVERY_LOOP_TIMING")
_SKIP = int(os.environ.get("EVERY_LOOP_SKIP", "10"))
_MIN_S = float(os.environ.get("EVERY_LOOP_MIN_S", "2.0"))
_state = {"n": 0, "start": None, "start_n": 0, "done": False}


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def tick() -> None:
    if _PATH is None or _state["done"]:
        return
    _state["n"] += 1
    n = _state["n"]
    if n == _SKIP:
        _sync()
        _state["start"], _state["start_n"] = time.perf_counter(), n
        return
    if _state["start"] is not None and time.perf_counter() - _state["start"] >= _MIN_S:
        _sync()
        seconds = time.perf_counter() - _state["start"]
        steps = n - _state["start_n"]
        with open(_PATH, "w") as f:
            json.dump({"steps": steps, "seconds": seconds, "step_us": 1e6 * seconds / steps}, f)
        _state["done"] = True
