"""One point of a batch-size sweep, in its own process: `python -m gpudoctor.runner.batch --batch B
--result FILE [options] -- script.py [args]` runs the script with its batch size set to B
(`runner.batch_knob`) through a warm-up and a light phase, stops it, and writes what it measured
(`gpudoctor.batch-point/1`; status `oom` where it ran out of memory). `training` is whether the script
called backward or stepped a torch optimizer (`TrainingWatch`), whatever phase the point reached."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

POINT_SCHEMA = "gpudoctor.batch-point/1"


def measure_batch(
    target: str,
    args: list[str],
    batch: int,
    *,
    module: bool = False,
    warmup: int = 2,
    light_steps: int = 10,
    light_seconds: float = 0.5,
    warmup_seconds: float = 0.0,
    option: str | None = None,
) -> dict[str, Any]:
    """Run the script at `batch` in this process; the point as a JSON-able dict."""
    from gpudoctor.runner.batch_knob import BatchKnob
    from gpudoctor.runner.capture import LiveCapture, LiveOptions
    from gpudoctor.runner.launch import run_script

    options = LiveOptions(
        warmup=warmup,
        warmup_seconds=warmup_seconds,
        light_steps=light_steps,
        light_seconds=light_seconds,
        light_only=True,
        nvml=False,
        memory_history="off",
        settle=False,  # a point is its --light-steps and --light-seconds, as every other point
    )
    knob = BatchKnob(batch, option).install()
    watch = TrainingWatch()
    try:
        watch.install()
        with tempfile.TemporaryDirectory(prefix="gpudoctor-batch-") as tmp:
            capture = LiveCapture(Path(tmp), options).install()
            try:
                end = run_script(target, args, module=module)
            finally:
                capture.uninstall()
            captured = capture.result()
    finally:
        watch.uninstall()
        knob.uninstall()
    return _point(batch, end, captured, knob.applied, training=watch.training)


class TrainingWatch:
    """Whether the script trains: it called backward or stepped an optimizer (torch's global step
    post-hook). `Tensor.backward` and `torch.autograd.backward` are wrapped while installed (a flag
    is set, nothing else changes) and put back by `uninstall()`, also after a failure."""

    def __init__(self) -> None:
        from gpudoctor.runner.hooks import Restorer

        self.backward = False
        self.stepped = False
        self._restorer = Restorer()

    @property
    def training(self) -> bool:
        return self.backward or self.stepped

    def install(self) -> TrainingWatch:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        watch = self

        def wrap(original: Any) -> Any:
            def backward(*args: Any, **kwargs: Any) -> Any:
                watch.backward = True
                return original(*args, **kwargs)

            return backward

        try:
            self._restorer.replace(torch.Tensor, "backward", wrap(torch.Tensor.backward))
            self._restorer.replace(torch.autograd, "backward", wrap(torch.autograd.backward))
            handle = register_optimizer_step_post_hook(self._on_step)
            self._restorer.on_restore(handle.remove)
        except BaseException:
            self._restorer.restore()
            raise
        return self

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.stepped = True

    def uninstall(self) -> None:
        self._restorer.restore()


def _out_of_memory(error: BaseException) -> bool:
    """torch's OutOfMemoryError, or the RuntimeError that older torch and other libraries raise for it
    ("CUDA out of memory. Tried to allocate …")."""
    return type(error).__name__ == "OutOfMemoryError" or (
        isinstance(error, RuntimeError) and "out of memory" in str(error).lower()
    )


def _point(
    batch: int, end: Any, captured: dict[str, Any], knob: dict[str, Any] | None, *, training: bool
) -> dict[str, Any]:
    light = captured.get("light")
    times = list(light.times_us) if light is not None else []
    memory = captured.get("memory_run") or {}
    steps = [s for s in memory.get("steps") or () if s.get("phase") == "light"]
    env = captured.get("environment")
    error = None if end.error is None else f"{type(end.error).__name__}: {end.error}"
    samples = (knob or {}).get("samples")
    if isinstance(samples, int) and samples < batch:  # its batches hold the dataset, not `batch` samples
        status, times = "error", []
        error = f"the DataLoader's dataset holds {samples} samples, fewer than batch {batch}"
    elif end.error is not None and _out_of_memory(end.error):
        status = "oom"
    elif times:
        status = "ok"  # the light phase ended (and stopped the script) or the script ended after it
    elif end.error is not None:
        status = "error"
    else:
        status = "no_steps"
    return {
        "schema": POINT_SCHEMA,
        "batch": batch,
        "status": status,
        "step_times_us": times,
        "peak_allocated": max((s["peak_allocated"] for s in steps), default=None),
        "peak_reserved": max((s["peak_reserved"] for s in steps), default=None),
        "capacity": memory.get("capacity"),
        "budget": memory.get("budget"),
        "training": training,
        "device": getattr(env, "gpu_name", None) or getattr(env, "device", None),
        "knob": knob,
        "error": error,
        "steps_seen": captured.get("steps_seen", 0),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpudoctor.runner.batch")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--light-steps", type=int, default=10)
    parser.add_argument("--light-seconds", type=float, default=0.5)
    parser.add_argument("--warmup-seconds", type=float, default=0.0)
    parser.add_argument("--batch-arg", default=None)
    parser.add_argument("-m", dest="module", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not command:
        parser.error("no script given")
    point = measure_batch(
        command[0],
        command[1:],
        ns.batch,
        module=ns.module,
        warmup=ns.warmup,
        light_steps=ns.light_steps,
        light_seconds=ns.light_seconds,
        warmup_seconds=ns.warmup_seconds,
        option=ns.batch_arg,
    )
    from gpudoctor.runner.child import end_within
    from gpudoctor.runner.rundir import write_child_result

    write_child_result(ns.result, point)
    end_within()  # the point is measured: its way out may not cost the sweep
    return 0


if __name__ == "__main__":
    sys.exit(main())
