"""GPU memory recording for `gpudoctor run`, driven by `runner.capture` at each step boundary: the
allocator's history (paused while steps are timed) and an out-of-memory observer from the first CUDA call,
each step's peaks and allocator counters, one step after the light phase in detail (snapshots, the full
history, per-module forward hooks, a census of parameters, gradients and optimizer state), and a snapshot
at the end of the traced phase. `result()` is `RunRecord.memory_run`; `write_files()` writes the
snapshots. `uninstall()` removes everything but torch's out-of-memory observer (made inert); a failure
here is a note, never the script's failure. What each costs: docs/memory.md."""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudoctor.runner.memory_probe import (
    ModuleProbe,
    OptimizerWatch,
    census,
    find_optimizers,
    find_roots,
    module_names,
    module_types,
)
from gpudoctor.runner.modules import compiled_by_script
from gpudoctor.runner.rundir import snapshot_name, write_snapshot
from gpudoctor.util.frames import frame_text, innermost_user_frame, is_library

RUN_SCHEMA = "gpudoctor.memory-run/1"
HISTORY_ENTRIES = 200_000  # alloc/free entries kept for the detail step (a few hundred bytes each)
MAX_FRAMES = 40
HISTORY_MODES = ("outside-light", "always", "off")
COUNTERS = ("alloc_retries", "device_allocs", "device_frees")  # counted per step (the others are levels)


@dataclass(frozen=True)
class MemoryOptions:
    history: str = "outside-light"  # when the allocator keeps Python stacks: outside-light, always, off
    detail: bool = True  # record the step after the light phase in detail
    timeline: bool = False  # torch.profiler's memory timeline (the traced phase must record memory,
    # shapes and stacks)


class MemoryRecorder:
    def __init__(self, options: MemoryOptions = MemoryOptions()) -> None:
        self.options = options
        self.root_hint: Callable[[], Any] | None = None  # the model the steps call, once known
        self.notes: list[str] = []
        self.steps: list[dict[str, Any]] = []
        self.snapshots: dict[str, tuple[int, Any]] = {}  # name -> (steps seen, torch's snapshot dict)
        self.timeline: dict[str, Any] | None = None
        self.oom: dict[str, Any] | None = None
        self.census_start: dict[str, Any] | None = None
        self.census: dict[str, Any] | None = None
        self.modules: list[dict[str, Any]] = []
        self.detail_step: int | None = None
        self.capacity: int | None = None
        self.budget: int | None = None
        self.history = "off" if options.history == "off" else "not started: CUDA was never used"
        self._installed = False
        self._cuda: bool | None = None
        self._device: Any = None
        self._watch = OptimizerWatch()
        self._probe: ModuleProbe | None = None
        self._roots: list[Any] = []
        self._counters: dict[str, int] = {}
        self._last_counters: dict[str, int] | None = None
        self._steps_seen = 0
        self._queued: Any = None
        self._script: str | None = None  # the script's path, as it runs

    # -- installation ---------------------------------------------------------------------------------
    def install(self) -> MemoryRecorder:
        import torch

        self._installed = True
        self._watch.install()
        if torch.cuda.is_available():
            # after torch's own CUDA initialisation, never before: the script may still set
            # PYTORCH_CUDA_ALLOC_CONF or choose its device
            self._queued = self._on_cuda_init
            torch.cuda._lazy_call(self._queued)
        return self

    def uninstall(self) -> None:
        """Safe to call twice, also after a failure."""
        if not self._installed:
            return
        self._installed = False
        self._watch.remove()
        self._end_detail_hooks()
        import torch

        queued = getattr(torch.cuda, "_queued_calls", None)
        if isinstance(queued, list):  # CUDA never started: take our call out of torch's queue
            queued[:] = [c for c in queued if not (isinstance(c, tuple) and c and c[0] is self._queued)]
        if self._cuda_started():
            self._set_history(None)
        # torch keeps its out-of-memory observers for good: nothing of the script (its model, through
        # the step detector's hint) may stay reachable from here once the run is over
        self.root_hint, self._roots, self._probe = None, [], None
        if _OOM_TARGET[0] is not None and _OOM_TARGET[0]() is self:
            _OOM_TARGET[0] = None

    def _on_cuda_init(self) -> None:
        if not self._installed:
            return
        try:
            self._set_history("state")
            _observe_oom(self)
        except Exception as err:  # an old torch, or an allocator without history (a custom allocator)
            self.notes.append(f"allocator history not recorded: {type(err).__name__}: {err}")
            self.history = f"not recorded: {err}"

    def _cuda_started(self) -> bool:
        import torch

        return torch.cuda.is_available() and torch.cuda.is_initialized()

    def _set_history(self, mode: str | None) -> None:
        """`state`: Python stacks of live blocks; `all`: also every alloc/free; None: off."""
        if self.options.history == "off" and mode is not None:
            return
        import torch

        record = torch.cuda.memory._record_memory_history
        if mode is None:
            record(enabled=None)
        elif mode == "state":
            record(enabled="state", context="state", stacks="python")
            self.history = f"python stacks of live blocks, {self.options.history}"
        else:
            try:
                record(
                    enabled="all",
                    context="alloc",
                    stacks="python",
                    max_entries=HISTORY_ENTRIES,
                    clear_history=True,
                )
            except TypeError:  # a torch without clear_history
                record(enabled="all", context="alloc", stacks="python", max_entries=HISTORY_ENTRIES)

    # -- step boundaries ----------------------------------------------------------------------------
    def _find_roots(self, collect: bool = True) -> list[Any]:
        """The script's models: the one its steps call, where the step detector knows it (a gc scan
        would also count models that only something else keeps alive), else every root module."""
        hinted = self.root_hint() if self.root_hint is not None else None
        return [hinted] if hinted is not None else find_roots(collect)

    def end_step(self, phase: str, steps_seen: int) -> None:
        """A step of `phase` has just ended (called before the capture moves to its next phase)."""
        self._steps_seen = steps_seen
        try:
            if self._cuda is None and phase != "warmup":
                self._start()
            if not self._cuda:
                return
            detail = self.detail_step is not None and not self.modules and self._probe is not None
            if phase in ("light", "traced"):
                self._record_step("detail" if detail else phase)
            if detail:
                self._end_detail()
        except Exception as err:
            self._fail(err)

    def begin_step(self, phase: str, previous: str) -> None:
        """The next step belongs to `phase`; `previous` was the phase of the one that ended."""
        try:
            if self._cuda is None and phase != "warmup":
                self._start()
            if self._cuda:
                self._reset_peaks()
            if previous != "light" and phase == "light":
                if self._cuda:
                    self._light_started()
            elif previous == "light" and phase != "light":
                self._light_ended(phase)
            elif previous == "traced" and phase == "done" and self._cuda and self.snapshots:
                self.snapshots["traced_end"] = (self._steps_seen, self._snapshot())
        except Exception as err:
            self._fail(err)

    def _start(self) -> None:
        import torch

        self._script = _script_path()
        self._cuda = self._cuda_started()
        self._device = (
            torch.device("cuda", torch.cuda.current_device()) if self._cuda else torch.device("cpu")
        )

    def _light_started(self) -> None:
        import torch

        free, total = torch.cuda.mem_get_info()
        self.capacity = int(total)
        self.budget = int(free) + int(torch.cuda.memory_reserved())
        if self.options.history == "outside-light":
            self._set_history(None)

    def _light_ended(self, phase: str) -> None:
        if not self._cuda:
            self.census = census(self._watch.optimizers, self._find_roots(), self._device, self._steps_seen)
            return
        if self.options.history == "outside-light":
            self._set_history("state")
        if phase == "traced" and self.options.detail:
            self._start_detail()
        else:
            self.census = census(self._watch.optimizers, self._find_roots(), self._device, self._steps_seen)

    def restart(self) -> None:
        """The capture starts its warm-up again (the step was found to be another): forget the steps."""
        try:
            if self._cuda and self.options.history == "outside-light":
                self._set_history("state")
        except Exception as err:
            self._fail(err)
        self.steps = []

    def finish(self) -> None:
        """The script ended or the capture stopped early: close the detail step if it is open."""
        self._end_detail_hooks()

    # -- the detail step ----------------------------------------------------------------------------
    def _start_detail(self) -> None:
        self._roots = self._find_roots()
        self.census_start = census(self._watch.optimizers, self._roots, self._device, self._steps_seen)
        self.snapshots["detail_start"] = (self._steps_seen, self._snapshot())
        self._set_history("all")
        self.detail_step = self._steps_seen + 1
        if any(compiled_by_script(r) for r in self._roots):
            # global module hooks would make a compiled model recompile (`model.compile()` too)
            self.notes.append("no activations per module: the model is compiled (torch.compile)")
            self._probe = ModuleProbe({}, self._allocated, cuda=True)  # not installed: no hooks
        else:
            self._probe = ModuleProbe(module_names(self._roots), self._allocated, cuda=True).install()

    def _end_detail(self) -> None:
        assert self._probe is not None
        self._probe.remove()
        self.snapshots["detail_end"] = (self._steps_seen, self._snapshot())
        self._set_history("state")
        self.census = census(self._watch.optimizers, self._roots, self._device, self._steps_seen)
        self.modules = self._probe.modules()
        self._probe = None

    def _end_detail_hooks(self) -> None:
        if self._probe is not None:
            self._probe.remove()
            self._probe = None

    # -- allocator statistics -------------------------------------------------------------------------
    def _stats(self) -> dict[str, int]:
        """The step's figures from the allocator: torch's nested statistics read directly where it has
        them (torch.cuda.memory_stats() flattens ~100 entries in Python at every call)."""
        import torch

        nested = getattr(torch._C, "_cuda_memoryStats", None)
        if nested is not None:
            raw = nested(self._device.index)

            def get(key: str, sub: str = "current") -> int:
                value = raw.get(key, 0)
                return int(value["all"][sub] if isinstance(value, dict) else value)

        else:
            flat = torch.cuda.memory_stats(self._device)

            def get(key: str, sub: str = "current") -> int:
                return int(flat.get(f"{key}.all.{sub}", flat.get(key, 0)))

        return {
            "peak_allocated": get("allocated_bytes", "peak"),
            "peak_reserved": get("reserved_bytes", "peak"),
            "allocated": get("allocated_bytes"),
            "reserved": get("reserved_bytes"),
            "inactive_split_bytes": get("inactive_split_bytes"),
            "alloc_retries": get("num_alloc_retries"),
            "device_allocs": get("num_device_alloc"),
            "device_frees": get("num_device_free"),
        }

    def _record_step(self, phase: str) -> None:
        stats = self._stats()
        self._last_counters = {k: stats[k] for k in COUNTERS}
        row: dict[str, Any] = {"step": self._steps_seen, "phase": phase}
        for key, value in stats.items():
            if key in COUNTERS:
                row[key] = value - self._counters.get(key, value)
            else:
                row[key] = value
        self.steps.append(row)

    def _reset_peaks(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(self._device)
        if self._last_counters is not None:  # read at this boundary already: a reset leaves counts alone
            self._counters, self._last_counters = self._last_counters, None
        else:
            stats = self._stats()
            self._counters = {k: stats[k] for k in COUNTERS}

    def _allocated(self) -> int:
        import torch

        return int(torch.cuda.memory_allocated(self._device))

    def _snapshot(self) -> Any:
        import torch

        return torch.cuda.memory._snapshot()

    # -- out of memory ----------------------------------------------------------------------------------
    def _on_oom(self, device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        """torch's allocator calls this when an allocation fails, before it raises: what is alive now is
        what filled the memory."""
        if not self._installed or self.oom is not None:
            return
        try:
            stack = [
                {"filename": f.filename, "line": f.lineno or 0, "name": f.name}
                for f in reversed(traceback.extract_stack())
            ]
            user = innermost_user_frame(stack)
            script = self._script or _script_path()
            in_script = next((f for f in stack if script and os.path.realpath(f["filename"]) == script), None)
            import torch

            device_obj = torch.device("cuda", device)
            if self._device is None:
                self._device, self._cuda = device_obj, True
            if self.capacity is None:
                with contextlib.suppress(Exception):
                    self.capacity = int(torch.cuda.get_device_properties(device).total_memory)
            self.oom = {
                "step": self._steps_seen,
                "device": device,
                "requested": int(alloc),
                "device_allocated": int(device_allocated),
                "device_free": int(device_free),
                "failing_line": frame_text(user) if user is not None else None,
                "script_line": frame_text(in_script) if in_script is not None else None,
                "stack": [frame_text(f) for f in stack if not is_library(f["filename"])][:MAX_FRAMES],
            }
            self.snapshots["oom"] = (self._steps_seen, self._snapshot())
            # no gc.collect() here: it could run the script's finalizers in the middle of an allocation
            roots = self._find_roots(collect=False)
            self.oom["census"] = census(find_optimizers(), roots, device_obj, self._steps_seen)
        except Exception as err:
            self.notes.append(f"the out-of-memory snapshot failed: {type(err).__name__}: {err}")

    # -- the profiler's memory timeline ---------------------------------------------------------------
    def on_trace_ready(self, prof: Any) -> None:
        """From the traced phase's profiler, before its events are cleared."""
        if not self.options.timeline:
            return
        from gpudoctor.runner.memory_profile import timeline_doc

        try:
            if self._device is None:
                self._start()
            roots = self._find_roots()
            names = module_names(roots)
            self.timeline = timeline_doc(prof, names, module_types(roots, names), self._device)
        except Exception as err:
            self.notes.append(f"torch.profiler's memory timeline failed: {type(err).__name__}: {err}")

    # -- results ------------------------------------------------------------------------------------
    def _fail(self, err: Exception) -> None:
        self.notes.append(f"memory recording stopped at step {self._steps_seen}: {type(err).__name__}: {err}")
        self._cuda = False
        self._end_detail_hooks()

    def result(self) -> dict[str, Any] | None:
        """The record, naming the files `write_files` writes; None when nothing was recorded."""
        if not (self.steps or self.snapshots or self.timeline or self.census or self.oom):
            return None
        return {
            "schema": RUN_SCHEMA,
            "device": str(self._device) if self._device is not None else "cpu",
            "script": self._script,
            "script_source": _script_source(self._script) if self.steps else None,  # a leak's keeping line
            "capacity": self.capacity,
            "budget": self.budget,
            "training": self._watch.stepped,
            "history": self.history,
            "steps": self.steps,
            "detail_step": self.detail_step if self.modules or "detail_end" in self.snapshots else None,
            "census_start": self.census_start,
            "census": self.census,
            "modules": self.modules,
            "snapshots": {
                name: {"file": snapshot_name(name), "step": step}
                for name, (step, _) in self.snapshots.items()
            },
            "timeline": {"file": snapshot_name("timeline")} if self.timeline is not None else None,
            "oom": self.oom,
            "notes": list(self.notes),
        }

    def write_files(self, out_dir: Path) -> None:
        for name, (_, snapshot) in self.snapshots.items():
            write_snapshot(out_dir, name, trim_frames(snapshot))
        if self.timeline is not None:
            write_snapshot(out_dir, "timeline", self.timeline)


# The recorder told of an out-of-memory error, held weakly: torch's observers cannot be removed, so one
# function is attached, once, and it finds the recorder of the run in progress (if any) here.
_OOM_TARGET: list[weakref.ref[MemoryRecorder] | None] = [None]
_OOM_ATTACHED = [False]


def _observe_oom(recorder: MemoryRecorder) -> None:
    import torch

    _OOM_TARGET[0] = weakref.ref(recorder)
    if not _OOM_ATTACHED[0]:
        torch._C._cuda_attach_out_of_memory_observer(_on_oom)
        _OOM_ATTACHED[0] = True


def _on_oom(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
    recorder = _OOM_TARGET[0]() if _OOM_TARGET[0] is not None else None
    if recorder is not None:
        recorder._on_oom(device, alloc, device_allocated, device_free)


def _script_path() -> str | None:
    """The running script (runpy sets sys.argv[0] to it, also with -m)."""
    return os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else None  # as runner.launch runs it


MAX_SCRIPT_SOURCE = 256 * 1024


def _script_source(path: str | None) -> str | None:
    """The script's text, for the analysis to find the line that keeps a leak's tensors; None if it
    cannot be read or is larger than MAX_SCRIPT_SOURCE."""
    try:
        if path and os.path.getsize(path) <= MAX_SCRIPT_SOURCE:
            with open(path, encoding="utf-8") as f:
                return f.read()
    except (OSError, UnicodeDecodeError):
        pass
    return None


def trim_frames(value: Any) -> Any:
    """The snapshot with each `frames` list cut to the frames that say something: gpudoctor's and
    runpy's own frames (outermost) left out, at most MAX_FRAMES."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == "frames" and isinstance(v, list):
                out[k] = [f for f in v if not _ours(f)][:MAX_FRAMES]
            else:
                out[k] = trim_frames(v)
        return out
    if isinstance(value, (list, tuple)):
        return [trim_frames(v) for v in value]
    return value


def _ours(frame: Any) -> bool:
    name = str(frame.get("filename", "")) if isinstance(frame, dict) else ""
    return "/gpudoctor/" in name or name.endswith("runpy.py") or name == "<frozen runpy>"
