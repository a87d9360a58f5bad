"""Measure torch.profiler's own cost on the GPU: what each option adds to a step, per recorded event, and
the traced − unprofiled difference on well-tuned workloads (gpudoctor's profiler-cost estimate is held to
those: analysis/profiler_cost.py, tests/test_profiler_cost.py).

Parts (each well under 10 minutes on an H100; self-contained: torch, torchvision and transformers only):
  probes      host-bound probes (a small GPT block stack at batch 1, eager and torch.compile'd), each timed
              unprofiled and traced under every option set; per option set the events recorded per step
              (counted from the exported trace) and the traced step. `--fit` turns these into per-event costs.
  acceptance  three well-tuned workloads — compiled GPT-2 training (bf16, SDPA, fused AdamW), compiled
              ViT-B/16 training, ResNet-50 inference replayed from a CUDA graph — timed unprofiled (before and
              after) and traced with with_stack + record_shapes; their traces are kept (gzipped) as fixtures.
  control     the with-stack compiled control: the compiled GPT-2 at batch 16 (GPU-bound unprofiled), traced
              with with_stack + record_shapes over 5 steps and kept; no acceptance bound on its estimate (the
              trace alone must only not give a critical or major host-side finding: test_profiler_cost.py).

    PYTHONPATH=src python tools/measure_profiler_cost.py --part probes --out $OUT/profiler_cost
    PYTHONPATH=src python tools/measure_profiler_cost.py --part acceptance --out $OUT/profiler_cost
    PYTHONPATH=src python tools/measure_profiler_cost.py --part control --active 5 --out $OUT/profiler_cost
    python tools/measure_profiler_cost.py --fit tests/fixtures/profiler_cost   # on any machine, no GPU
    python tools/measure_profiler_cost.py --merge OTHER_RUN --out tests/fixtures/profiler_cost

Everything merges into `<out>/manifest.json`; `--fit` writes benchmarks/results/profiler_cost.json.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import itertools
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "benchmarks" / "results" / "profiler_cost.json"
OPTION_SETS: dict[str, dict[str, bool]] = {
    "default": {},
    "record_shapes": {"record_shapes": True},
    "profile_memory": {"profile_memory": True},
    "with_stack": {"with_stack": True},
    "stack_shapes": {"with_stack": True, "record_shapes": True},
    "all": {"with_stack": True, "record_shapes": True, "profile_memory": True},
}
_STEP = re.compile(r"^ProfilerStep#\d+$")
_TRITON = re.compile(r"^triton_")

Step = Callable[[], None]


# ---- workloads -------------------------------------------------------------------------------------


def _gpt_blocks(compiled: bool) -> Step:
    """Host-bound probe: 6 pre-norm transformer blocks (width 256) trained at batch 1, sequence 32."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True, norm_first=True, dropout=0.0)
    model = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)  # per-parameter: many events
    x = torch.randn(1, 32, 256, device="cuda")
    fwd = torch.compile(model) if compiled else model

    def step() -> None:
        fwd(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _gpt2_expert(batch: int = 8) -> Step:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    torch.set_float32_matmul_precision("high")
    config = GPT2Config(attn_implementation="sdpa")
    model = GPT2LMHeadModel(config).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    model.compile()
    ids = torch.randint(0, config.vocab_size, (batch, 512), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _vit_expert() -> Step:
    import torch
    import torch.nn.functional as F
    import torchvision

    torch.manual_seed(0)
    torch.set_float32_matmul_precision("high")
    model = torchvision.models.vit_b_16().cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    fwd = torch.compile(model)
    images = torch.randn(64, 3, 224, 224, device="cuda")
    labels = torch.randint(0, 1000, (64,), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(fwd(images), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _graph_inference() -> Step:
    """ResNet-50 bf16 inference at batch 32, captured once into a CUDA graph and replayed; each step
    copies a new batch into the static input and reads the predicted classes (on the GPU)."""
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50().cuda().eval().to(torch.bfloat16, memory_format=torch.channels_last)
    batches = [torch.randn(32, 3, 224, 224, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    static_in = batches[0].clone().contiguous(memory_format=torch.channels_last)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.inference_mode():
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.inference_mode():
        static_out = model(static_in).argmax(dim=1)
    i = [0]

    def step() -> None:
        i[0] += 1
        static_in.copy_(batches[i[0] % 4])
        graph.replay()
        _ = static_out  # the result stays on the GPU, as a serving loop batches its reads

    return step


PROBES: dict[str, Callable[[], Step]] = {
    "eager_probe": lambda: _gpt_blocks(compiled=False),
    "compiled_probe": lambda: _gpt_blocks(compiled=True),
}
ACCEPTANCE: dict[str, Callable[[], Step]] = {
    "gpt2_compiled": _gpt2_expert,
    "vit_compiled": _vit_expert,
    "resnet50_graph_inference": _graph_inference,
}
CONTROL: dict[str, Callable[[], Step]] = {"gpt2_compiled_b16": lambda: _gpt2_expert(batch=16)}


# ---- timing and tracing ------------------------------------------------------------------------------


def unprofiled_us(step: Step, n: int) -> list[float]:
    """Step times by CUDA events between consecutive steps, no sync in between (the host runs ahead)."""
    import torch

    events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    events[0].record()
    for e in events[1:]:
        step()
        e.record()
    events[-1].synchronize()
    return [a.elapsed_time(b) * 1e3 for a, b in itertools.pairwise(events)]


def traced(step: Step, options: dict[str, bool], dest: Path | None, active: int) -> dict[str, Any]:
    """Profile wait=1, warmup=1, `active` steps; count what the trace holds per step, keep it at `dest`."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        with profile(
            activities=[ProfilerActivity.CPU]
            + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else []),
            schedule=schedule(wait=1, warmup=1, active=active, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(str(raw)),
            **options,
        ) as prof:
            # Timed as the unprofiled steps are, by CUDA events between steps: a step's host span is not
            # its time where the host runs ahead of the GPU (a CUDA graph's replay returns at once).
            marks = [torch.cuda.Event(enable_timing=True) for _ in range(3 + active)]
            marks[0].record()
            for i in range(2 + active):
                step()
                marks[i + 1].record()
                prof.step()
        torch.cuda.synchronize()
        timed = [a.elapsed_time(b) * 1e3 for a, b in itertools.pairwise(marks[2 : 3 + active])]
        doc = json.loads(raw.read_text())
        if dest is not None:
            dest.parent.mkdir(parents=True, exist_ok=True)
            with raw.open("rb") as src, gzip.GzipFile(dest, "wb", compresslevel=6, mtime=0) as dst:
                shutil.copyfileobj(src, dst, length=1 << 20)
    return {**count_events(doc), "event_step_us": timed, "file": dest.name if dest else None}


def count_events(doc: dict[str, Any]) -> dict[str, Any]:
    """Per profiled step (inside the ProfilerStep#N spans): events by the kinds gpudoctor prices, and
    the step durations as the trace records them."""
    events = doc["traceEvents"]
    steps = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") == "user_annotation" and _STEP.match(str(e.get("name", "")))
    )
    n = max(len(steps), 1)

    def inside(ts: float) -> bool:
        return any(a <= ts < b for a, b in steps)

    kernels = {e["args"].get("correlation"): e["name"] for e in events if e.get("cat") == "kernel"}
    shapes = any("Input Dims" in e.get("args", {}) for e in events if e.get("cat") == "cpu_op")
    counts = dict.fromkeys(("event", "compiled_launch", "shaped_op", "memory_event", "python_frame"), 0)
    for e in events:
        cat, ts = e.get("cat"), e.get("ts")
        if ts is None or not inside(float(ts)):
            continue
        if cat in ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"):
            if not _STEP.match(str(e.get("name", ""))):
                counts["event"] += 1
            if cat == "cpu_op" and shapes:  # every op pays for record_shapes, with or without tensors
                counts["shaped_op"] += 1
            launched = kernels.get(e.get("args", {}).get("correlation"), "")
            if cat in ("cuda_runtime", "cuda_driver") and _TRITON.match(launched):
                counts["compiled_launch"] += 1
        elif cat == "python_function":
            counts["python_frame"] += 1
        elif e.get("name") == "[memory]":
            counts["memory_event"] += 1
    return {
        "counts_per_step": {k: v / n for k, v in counts.items()},
        "traced_step_us": step_windows(events, steps),
        "host_step_us": [b - a for a, b in steps],
    }


def step_windows(events: list[dict[str, Any]], steps: list[tuple[float, float]]) -> list[float]:
    """Each step's time as gpudoctor's trace.steps reads it: a step opens once the host started it and
    the GPU finished the step before, and closes where the next opens (the last once host and GPU are
    done). Where the host runs ahead of the GPU its ProfilerStep span is not the step time."""
    launch_ts = {
        e["args"]["correlation"]: float(e["ts"])
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    gpu_start, gpu_end = [float("inf")] * len(steps), [-float("inf")] * len(steps)
    for e in gpu:
        ts = launch_ts.get(e.get("args", {}).get("correlation"))
        for i, (a, b) in enumerate(steps):
            if ts is not None and a <= ts < b:
                gpu_start[i] = min(gpu_start[i], float(e["ts"]))
                gpu_end[i] = max(gpu_end[i], float(e["ts"]) + float(e.get("dur", 0)))
    # The GPU work queued before the first step (launched earlier, or with no launch recorded, that ran
    # before the first step's own) delays the first step's start.
    first_own = min(gpu_start, default=float("inf"))
    done = max(
        (
            float(e["ts"]) + float(e.get("dur", 0))
            for e in gpu
            if (
                (ts := launch_ts.get(e.get("args", {}).get("correlation"))) is not None
                and steps
                and ts < steps[0][0]
            )
            or (ts is None and float(e["ts"]) < first_own)
        ),
        default=-float("inf"),
    )
    opens = []
    for (a, _), end in zip(steps, gpu_end, strict=True):
        opens.append(max(a, done))
        done = max(done, end)
    closes = [*opens[1:], max(steps[-1][1], done)] if steps else []
    return [b - a for a, b in zip(opens, closes, strict=True)]


def measure(
    name: str, build: Callable[[], Step], sets: list[str], keep: set[str], out: Path, args: Any
) -> dict:
    import torch

    t0 = time.perf_counter()
    step = build()
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    entry: dict[str, Any] = {"build_and_warmup_s": time.perf_counter() - t0, "runs": {}}
    before = unprofiled_us(step, args.timing)
    for option_set in sets:
        dest = out / f"{name}__{option_set}.json.gz" if option_set in keep else None
        entry["runs"][option_set] = traced(step, OPTION_SETS[option_set], dest, args.active)
        entry["runs"][option_set]["options"] = OPTION_SETS[option_set]
        print(
            f"  {name} {option_set}: {statistics.median(entry['runs'][option_set]['traced_step_us']):.0f} µs"
        )
    after = unprofiled_us(step, args.timing)
    entry["unprofiled_step_us"] = {
        "median": statistics.median(before + after),
        "before": statistics.median(before),
        "after": statistics.median(after),
        "samples": before + after,
        "method": "cuda_events",
    }
    print(f"  {name} unprofiled: {entry['unprofiled_step_us']['median']:.0f} µs", flush=True)
    del step
    gc.collect()
    torch.cuda.empty_cache()
    return entry


def environment() -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(0)
    return {
        "device_name": props.name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
    }


def record(args: argparse.Namespace) -> int:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.part == "probes":
        plan = {name: (build, list(OPTION_SETS), set()) for name, build in PROBES.items()}
    else:
        kept = ACCEPTANCE if args.part == "acceptance" else CONTROL
        plan = {name: (build, ["stack_shapes"], {"stack_shapes"}) for name, build in kept.items()}
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"workloads": {}}
    manifest["environment"] = environment()
    failed = []
    for name, (build, sets, keep) in plan.items():
        if args.only and name not in args.only.split(","):
            continue
        try:
            manifest["workloads"][name] = {"part": args.part, **measure(name, build, sets, keep, out, args)}
        except Exception as exc:  # measure the rest; the manifest says what failed
            manifest["workloads"][name] = {"part": args.part, "error": f"{type(exc).__name__}: {exc}"}
            failed.append(name)
        manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    if failed:
        print("FAILED:", ", ".join(failed), file=sys.stderr)
    return 1 if failed else 0


# ---- fitting (CPU) -----------------------------------------------------------------------------------


def fit(folder: Path) -> dict[str, Any]:
    """Per-event costs from the host-bound probes (eager and compiled); but for `event` and
    `compiled_launch`, each a least-squares fit over both (a cost per event of each kind, the same in both):

    - `event` (every op, annotation and runtime call): the eager probe's default-options traced −
      unprofiled step, over its events; `compiled_launch`: what that leaves per Inductor launch on the
      compiled probe (reported raw, priced at no less than 0);
    - each option alone: its traced step less the default-options one beside it in time (the baseline
      drift of a shared host cancels), over the records it adds; `memory_event` from the all-options run
      less the with_stack + record_shapes one;
    - with_stack and record_shapes together cost more than each alone: their records are fitted together
      from that option set's runs (two kinds, two probes), `with_stack_and_shapes`.

    Step times are the medians of each run's steps."""
    doc = json.loads((folder / "manifest.json").read_text())
    w = {n: doc["workloads"][n] for n in PROBES}

    def step(name: str, option_set: str) -> float:
        return statistics.median(w[name]["runs"][option_set]["traced_step_us"])

    def count(name: str, option_set: str, kind: str) -> float:
        return float(w[name]["runs"][option_set]["counts_per_step"][kind])

    def through_zero(xs: list[float], ys: list[float]) -> float:
        return sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)

    excess = {n: step(n, "default") - w[n]["unprofiled_step_us"]["median"] for n in PROBES}
    event = excess["eager_probe"] / count("eager_probe", "default", "event")
    c = "compiled_probe"
    launch_raw = (excess[c] - event * count(c, "default", "event")) / max(
        count(c, "default", "compiled_launch"), 1
    )
    alone = {"event": event, "compiled_launch": max(launch_raw, 0.0)}
    for option_set, base, kind in (
        ("record_shapes", "default", "shaped_op"),
        ("with_stack", "default", "python_frame"),
        ("all", "stack_shapes", "memory_event"),
    ):
        alone[kind] = through_zero(
            [count(n, option_set, kind) for n in PROBES],
            [step(n, option_set) - step(n, base) for n in PROBES],
        )
    # Two kinds from two probes: solve [shaped, frames] x = added time.
    (a1, b1), (a2, b2) = (
        (count(n, "stack_shapes", "shaped_op"), count(n, "stack_shapes", "python_frame")) for n in PROBES
    )
    y1, y2 = (step(n, "stack_shapes") - step(n, "default") for n in PROBES)
    det = a1 * b2 - a2 * b1
    together = {"shaped_op": (y1 * b2 - y2 * b1) / det, "python_frame": (a1 * y2 - a2 * y1) / det}
    return {
        "environment": doc["environment"],
        "costs_us": alone,
        "with_stack_and_shapes_us": together,
        "compiled_launch_raw_us": launch_raw,
        "method": fit.__doc__,
        "inputs": {
            n: {
                "unprofiled_step_us": w[n]["unprofiled_step_us"]["median"],
                "traced_step_us": {o: step(n, o) for o in w[n]["runs"]},
                "counts_per_step": {o: r["counts_per_step"] for o, r in w[n]["runs"].items()},
            }
            for n in PROBES
        },
    }


def merge(source: Path, dest: Path) -> None:
    """Copy `source`'s traces into `dest` and its workloads into `dest/manifest.json` (one recording
    split over several GPU calls)."""
    dest.mkdir(parents=True, exist_ok=True)
    theirs = json.loads((source / "manifest.json").read_text())
    path = dest / "manifest.json"
    ours = json.loads(path.read_text()) if path.exists() else {"workloads": {}}
    ours["environment"] = theirs.get("environment", ours.get("environment"))
    ours["workloads"] = {**ours.get("workloads", {}), **theirs["workloads"]}
    for trace in source.glob("*.json.gz"):
        shutil.copyfile(trace, dest / trace.name)
    for entry in ours["workloads"].values():  # re-read kept traces as count_events reads them now
        for run in entry.get("runs", {}).values():
            if run.get("file") and (dest / run["file"]).exists():
                with gzip.open(dest / run["file"], "rt") as fh:
                    run.update(count_events(json.load(fh)))
    path.write_text(json.dumps(ours, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("probes", "acceptance", "control"))
    p.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "profiler_cost")
    p.add_argument("--only", default="", help="comma-separated workload names")
    p.add_argument("--warmup", type=int, default=15, help="steps before timing (compilation included)")
    p.add_argument("--timing", type=int, default=40, help="unprofiled steps timed, before and after")
    p.add_argument("--active", type=int, default=3, help="profiled steps")
    p.add_argument("--fit", type=Path, default=None, help="fit per-event costs from a recorded folder")
    p.add_argument("--merge", type=Path, default=None, help="merge another recorded folder into --out")
    args = p.parse_args(argv)
    if args.merge is not None:
        merge(args.merge, args.out)
        return 0
    if args.fit is not None:
        result = fit(args.fit)
        RESULT.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({k: result[k] for k in ("costs_us", "with_stack_and_shapes_us")}, indent=1))
        return 0
    if args.part is None:
        p.error("--part or --fit")
    return record(args)


if __name__ == "__main__":
    raise SystemExit(main())
