"""The memory analysis and `gpudoctor batch` on a GPU, against what torch itself measures:

cases (leak, oom, activations, fragmentation, gpt2 — the planted scripts of benchmarks/memory_cases):
  each under `gpudoctor run` in a fresh process, and again plain (no gpudoctor) with the script recording
  its own per-step `torch.cuda.max_memory_allocated()`. Checks: the step peaks gpudoctor reports equal
  the plain run's within 2%; the detail step's categories account for its peak within 5%; the planted
  cause is the first memory finding; on the OOM case the finding names the tensor kinds and the line.
overhead: the activation-heavy LM's step, timed in one process with CUDA events in interleaved rounds:
  plain, with gpudoctor's light-phase recording (runner.memory at every boundary), and with the
  allocator's Python-stack history on (what `--memory-history always` costs). Check: light < 5%.
batch_lm: `gpudoctor batch` on the LM training script: the predicted largest batch against the largest
  that really fits (a bisection in one process to 2%). Check: within 10%.
batch_infer, batch_convnet: `gpudoctor batch` on a batch-1 transformer inference loop (--latency-ms 20)
  and on a conv-net training loop (its DataLoader's batch_size patched); the knee checked against
  throughput measured here, independently, at knee/2, knee and 2×knee. Check: the gain per doubling is
  under 10% (+5 points of noise) past the knee and over 10% (−5) before it.

    PYTHONPATH=src python3 benchmarks/memory_truth.py [--out benchmarks/results/memory_truth.json]
        [--only leak,oom,activations,fragmentation,gpt2,overhead,batch_lm,batch_infer,batch_convnet]
        [--smoke]   (tiny sizes on the CPU: checks the plumbing, no GPU figures)

Results merge into --out (one entry per check, with the device and versions); the sweeps' plots go
beside it (memory_truth_batch_*.html). Estimated on an H100:
cases ~2.5 min, overhead ~0.5 min, batch_lm ~2 min, batch_infer ~2 min, batch_convnet ~1.5 min.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CASES_DIR = REPO / "benchmarks" / "memory_cases"
sys.path.insert(0, str(CASES_DIR))
sys.path.insert(0, str(REPO / "src"))
from cases import CASES, RUN_OPTIONS, command  # noqa: E402

DEFAULT_OUT = REPO / "benchmarks" / "results" / "memory_truth.json"
RESULTS_DIR = [DEFAULT_OUT.parent]  # where the sweeps' batch.html go: beside --out
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
PEAK_TOLERANCE = 0.02
CATEGORY_TOLERANCE = 0.05
OVERHEAD_LIMIT = 0.05
PREDICTION_TOLERANCE = 0.10
KNEE_GAIN, KNEE_NOISE = 0.10, 0.05


def gpudoctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpudoctor", *args], capture_output=True, text=True, env=ENV, check=False
    )


# -- the planted cases ----------------------------------------------------------------------------------
def check_case(name: str, work: Path, smoke: bool) -> dict[str, Any]:
    out = work / name
    t0 = time.perf_counter()
    done = gpudoctor("run", "--out", str(out), *RUN_OPTIONS, *command(name, smoke))
    seconds = time.perf_counter() - t0
    if not (out / "memory.json").is_file():
        return {"pass": False, "error": f"no memory.json (exit {done.returncode}): {done.stderr[-2000:]}"}
    doc = json.loads((out / "memory.json").read_text())
    findings = doc.get("findings") or []
    result: dict[str, Any] = {
        "seconds": round(seconds, 1),
        "first_finding": findings[0]["id"] if findings else None,
        "expected_first": CASES[name][1],
        "findings": [f["id"] for f in findings],
        "peak_allocated": doc.get("peak_allocated"),
        "peak_reserved": doc.get("peak_reserved"),
    }
    result["first_ok"] = result["first_finding"] == result["expected_first"]
    checks = [result["first_ok"]]
    if name == "oom":
        evidence = " ".join(findings[0]["evidence"]) if findings else ""
        oom = doc.get("oom") or {}
        result.update(
            failing_line=oom.get("failing_line"),
            categories={k: v for k, v in (oom.get("categories") or {}).items() if v},
            evidence=findings[0]["evidence"] if findings else [],
        )
        result["names_kinds_and_line"] = bool(oom.get("failing_line")) and "activations" in evidence
        checks.append(result["names_kinds_and_line"])
    else:
        result.update(_categories(doc))
        checks.append(result["categories_ok"])
        result.update(_peaks_against_plain(name, doc, work, smoke))
        checks.append(result["peaks_ok"])
    result["pass"] = all(checks)
    return result


def _categories(doc: dict[str, Any]) -> dict[str, Any]:
    b = doc.get("breakdown")
    if not b:
        return {"categories_ok": False, "categories": None}
    measured = next((s["peak_allocated"] for s in doc["steps"] if s["step"] == b["step"]), None)
    attributed = b["peak"] - b["categories"].get("unattributed", 0)
    share = attributed / measured if measured else None
    return {
        "detail_step_peak": measured,
        "categories": {k: v for k, v in b["categories"].items() if v},
        "categories_share_of_peak": share,
        "categories_ok": share is not None and abs(1 - share) <= CATEGORY_TOLERANCE,
    }


def _peaks_against_plain(name: str, doc: dict[str, Any], work: Path, smoke: bool) -> dict[str, Any]:
    """The script alone, recording max_memory_allocated per step; the same step numbers compared."""
    peaks_file = work / f"{name}.peaks.json"
    subprocess.run(
        [sys.executable, *command(name, smoke), "--peaks", str(peaks_file)],
        env=ENV,
        check=False,
        capture_output=True,
    )
    if not peaks_file.is_file():
        return {"peaks_ok": False, "peaks_error": "the plain run wrote no peaks"}
    plain = json.loads(peaks_file.read_text())
    # Short light-phase steps are read in groups: a row's peak is its group's (the steps after the
    # row before it, up to its own), so it is compared with the plain run's largest over those steps.
    pairs, previous = [], None
    for s in sorted(doc["steps"], key=lambda s: s["step"]):
        first = s["step"] if previous is None else previous + 1
        previous = s["step"]
        if s["phase"] == "light" and s["step"] <= len(plain):
            pairs.append((s["peak_allocated"], max(plain[first - 1 : s["step"]])))
    worst = max((abs(g - p) / p for g, p in pairs if p), default=None)
    return {
        "peak_pairs": len(pairs),
        "peak_gpudoctor_median": statistics.median(g for g, _ in pairs) if pairs else None,
        "peak_plain_median": statistics.median(p for _, p in pairs) if pairs else None,
        "peak_worst_rel_diff": worst,
        "peaks_ok": worst is not None and worst <= PEAK_TOLERANCE,
    }


# -- the recording's overhead ---------------------------------------------------------------------------
def check_overhead(smoke: bool, rounds: int = 6, per_round: int = 10) -> dict[str, Any]:
    import torch
    from lm import LM, batch, lm_loss

    from gpudoctor.runner.memory import MemoryOptions, MemoryRecorder

    device = "cpu" if smoke else "cuda"
    size, seq, layers = (2, 64, 2) if smoke else (16, 1024, 8)
    model = LM(layers=layers, seq=seq).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)

    def step() -> None:
        tokens = batch(size, seq, device=device)
        loss = lm_loss(model(tokens), tokens)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    recorder = MemoryRecorder(MemoryOptions()).install()
    recorder.end_step("warmup", 1)
    recorder.begin_step("light", "warmup")
    counter = [1]

    def light_boundary(mark: Any) -> None:
        counter[0] += 1
        recorder.end_step("light", counter[0])
        mark()
        recorder.begin_step("light", "light")

    def history_on() -> None:
        if device == "cuda":
            torch.cuda.memory._record_memory_history(enabled="state", context="state", stacks="python")

    def history_off() -> None:
        if device == "cuda":
            torch.cuda.memory._record_memory_history(enabled=None)

    modes = {
        "plain": (None, None, None),
        "light_recording": (light_boundary, None, None),
        "history_always": (None, history_on, history_off),
    }
    times: dict[str, list[float]] = {m: [] for m in modes}
    try:
        for r in range(rounds):
            order = list(modes)[r % 3 :] + list(modes)[: r % 3]
            for mode in order:
                boundary, before, after = modes[mode]
                if before:
                    before()
                times[mode] += _timed(step, per_round, device, boundary)
                if after:
                    after()
    finally:
        recorder.uninstall()
    med = {m: statistics.median(t) for m, t in times.items()}
    over = {m: med[m] / med["plain"] - 1 for m in modes if m != "plain"}
    return {
        "median_step_us": med,
        "overhead": over,
        "steps_per_mode": rounds * per_round,
        "pass": over["light_recording"] < OVERHEAD_LIMIT,
        "history_always_under_limit": over["history_always"] < OVERHEAD_LIMIT,
    }


def _timed(step: Any, n: int, device: str, boundary: Any = None) -> list[float]:
    """Step times in µs: CUDA events between consecutive steps (no sync in between), perf_counter on
    the CPU; `boundary(mark)` runs gpudoctor's boundary code around the mark, as the capture does."""
    import torch

    if device == "cuda":
        events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
        marks = iter(events)
        next(marks).record()
        for _ in range(n):
            step()
            event = next(marks)
            if boundary:
                boundary(event.record)
            else:
                event.record()
        events[-1].synchronize()
        return [a.elapsed_time(b) * 1e3 for a, b in itertools.pairwise(events)]
    out = []
    for _ in range(n):
        t = time.perf_counter()
        step()
        if boundary:
            boundary(lambda: None)
        out.append((time.perf_counter() - t) * 1e6)
    return out


# -- batch sizes ---------------------------------------------------------------------------------------
def _sweep(work: Path, name: str, script: list[str], *options: str) -> tuple[dict[str, Any] | None, str]:
    """`gpudoctor batch` in a fresh process; its batch.json, and its plot kept beside the results."""
    out = work / name
    done = gpudoctor("batch", "--out", str(out), *options, *script)
    path = out / "batch.json"
    if (out / "batch.html").is_file():
        RESULTS_DIR[0].mkdir(parents=True, exist_ok=True)
        (RESULTS_DIR[0] / f"memory_truth_{name}.html").write_text((out / "batch.html").read_text())
    return (json.loads(path.read_text()) if path.is_file() else None), (done.stdout + done.stderr)[-3000:]


def check_batch_lm(work: Path, smoke: bool) -> dict[str, Any]:
    script = command("activations", smoke)
    options = ["--start", "1" if smoke else "8", "--max-runs", "4" if smoke else "10", "--light-steps", "5"]
    sweep, log = _sweep(work, "batch_lm", script, *options)
    if sweep is None:
        return {"pass": False, "error": log}
    truth = None if smoke else _largest_that_fits()
    predicted = sweep.get("prediction_tried") or sweep.get("predicted_max")
    error = abs(predicted - truth) / truth if predicted and truth else None
    final = sweep.get("predicted_max")
    return {
        "prediction_tried": sweep.get("prediction_tried"),
        "predicted_max": final,
        "final_relative_error": abs(final - truth) / truth if final and truth else None,
        "largest_fit_tried": sweep.get("largest_fit"),
        "smallest_oom_tried": sweep.get("smallest_oom"),
        "true_max": truth,
        "relative_error": error,
        "memory_model": sweep.get("memory_model"),
        "budget": sweep.get("budget"),
        "sizes": [p["batch"] for p in sweep["points"]],
        "pass": error is not None and error <= PREDICTION_TOLERANCE,
    }


TRUTH_SEARCH = """\
import gc, json, sys
import torch
sys.path.insert(0, {cases!r})
from lm import LM, batch, lm_loss
seq, lo, hi = 1024, {lo}, {hi}
model = LM(layers=8, seq=seq).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)

def fits(b):
    try:
        for _ in range(2):
            t = batch(b, seq)
            loss = lm_loss(model(t), t)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        opt.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.empty_cache()

while fits(hi) and hi < 1 << 16:  # the upper end must run out of memory
    lo, hi = hi, hi * 2
while hi - lo > max(1, lo // 50):
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if fits(mid) else (lo, mid)
print(json.dumps(lo))
"""


def _largest_that_fits() -> int | None:
    """The largest LM training batch that runs two steps, by bisection in one fresh process (an OOM is
    caught and the cache emptied between tries)."""
    code = TRUTH_SEARCH.format(cases=str(CASES_DIR), lo=1, hi=4096)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, check=False)
    try:
        return int(json.loads(done.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return None


def check_batch_infer(work: Path, smoke: bool) -> dict[str, Any]:
    script = [str(CASES_DIR / "infer_lm.py"), *(["--device", "cpu", "--seq-len", "64"] if smoke else [])]
    options = [
        "--latency-ms",
        "20",
        "--max",
        "256",
        "--max-runs",
        "4" if smoke else "12",
        "--light-steps",
        "5",
    ]
    sweep, log = _sweep(work, "batch_infer", script, *options)
    if sweep is None:
        return {"pass": False, "error": log}
    result = _knee_result(sweep)
    if not smoke and sweep.get("knee"):
        result.update(_knee_against_measured(sweep["knee"]["batch"], _infer_step, result))
    result["latency_pick"] = sweep.get("latency_pick")
    result["pass"] = bool(result.get("knee_ok")) and sweep.get("latency_pick") is not None
    return result


def check_batch_convnet(work: Path, smoke: bool) -> dict[str, Any]:
    script = [
        str(CASES_DIR / "convnet_train.py"),
        *(["--device", "cpu", "--samples", "256", "--size", "32", "--workers", "0"] if smoke else []),
    ]
    options = ["--start", "4" if smoke else "16", "--max", "1024", "--max-runs", "3" if smoke else "8"]
    options += ["--light-steps", "5"]
    sweep, log = _sweep(work, "batch_convnet", script, *options)
    if sweep is None:
        return {"pass": False, "error": log}
    result = _knee_result(sweep)
    result["knob"] = sweep.get("knob")
    if not smoke and sweep.get("knee"):
        result.update(_knee_against_measured(sweep["knee"]["batch"], _convnet_step, result))
    result["pass"] = bool(result.get("knee_ok")) and (sweep.get("knob") or {}).get("kind") == "dataloader"
    return result


def _knee_result(sweep: dict[str, Any]) -> dict[str, Any]:
    return {
        "sizes": [p["batch"] for p in sweep["points"]],
        "step_us": [p["step_us"] for p in sweep["points"]],
        "knee": (sweep.get("knee") or {}).get("batch"),
        "predicted_max": sweep.get("predicted_max"),
        "largest_fit": sweep.get("largest_fit"),
    }


def _knee_against_measured(knee: int, make_step: Any, result: dict[str, Any]) -> dict[str, Any]:
    """Throughput at knee/2, knee and 2×knee measured here, without gpudoctor."""
    sizes = [
        b
        for b in (max(knee // 2, 1), knee, 2 * knee)
        if result["largest_fit"] is None or b <= result["largest_fit"]
    ]
    rate = {}
    for b in sizes:
        step = make_step(b)
        times = _timed(step, 20, "cuda")
        rate[b] = b / statistics.median(times[5:]) * 1e6
        del step
        gc.collect()
        __import__("torch").cuda.empty_cache()
    before = rate[knee] / rate[knee // 2] - 1 if knee // 2 in rate and knee // 2 != knee else None
    after = rate[2 * knee] / rate[knee] - 1 if 2 * knee in rate else None
    ok = (after is None or after < KNEE_GAIN + KNEE_NOISE) and (
        before is None or before > KNEE_GAIN - KNEE_NOISE
    )
    return {"measured_rate": rate, "gain_into_knee": before, "gain_past_knee": after, "knee_ok": ok}


def _infer_step(b: int) -> Any:
    import torch
    from lm import LM, batch

    model = LM(d=1024, layers=12, heads=16, seq=512).cuda().eval()

    def step() -> None:
        with torch.inference_mode():
            model(batch(b, 512))

    return step


def _convnet_step(b: int) -> Any:
    import torch
    import torchvision

    model = torchvision.models.resnet50(num_classes=100).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # the script's batches come pinned from its loader
    host_x = torch.randint(0, 256, (b, 3, 128, 128), dtype=torch.uint8).pin_memory()
    host_y = torch.randint(0, 100, (b,)).pin_memory()

    def step() -> None:
        x = host_x.to("cuda", non_blocking=True).float().div_(255).to(memory_format=torch.channels_last)
        y = host_y.to("cuda", non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


# -- main ---------------------------------------------------------------------------------------------
CHECKS = [
    "leak",
    "oom",
    "activations",
    "fragmentation",
    "gpt2",
    "overhead",
    "batch_lm",
    "batch_infer",
    "batch_convnet",
]


def environment() -> dict[str, Any]:
    import torch

    return {
        "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
    }


def run_check(name: str, work: Path, smoke: bool) -> dict[str, Any]:
    if name in CASES:
        return check_case(name, work, smoke)
    return {
        "overhead": lambda: check_overhead(smoke, *((2, 3) if smoke else ())),
        "batch_lm": lambda: check_batch_lm(work, smoke),
        "batch_infer": lambda: check_batch_infer(work, smoke),
        "batch_convnet": lambda: check_batch_convnet(work, smoke),
    }[name]()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--only", default=",".join(CHECKS))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (the plumbing only)")
    parser.add_argument(
        "--work", type=Path, help="keep the runs' directories here (default: a temporary one)"
    )
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    if unknown := [n for n in names if n not in CHECKS]:
        parser.error(f"unknown checks {unknown}; known: {', '.join(CHECKS)}")
    RESULTS_DIR[0] = args.out.parent
    results = json.loads(args.out.read_text()) if args.out.is_file() else {"checks": {}}
    results.update(environment())
    with contextlib.ExitStack() as stack:
        tmp = args.work or stack.enter_context(tempfile.TemporaryDirectory(prefix="gpudoctor-memory-truth-"))
        for name in names:
            t0 = time.perf_counter()
            try:
                result = run_check(name, Path(tmp), args.smoke)
            except Exception as err:  # one failing check must not lose the others' results
                result = {"pass": False, "error": f"{type(err).__name__}: {err}"}
            result["seconds_total"] = round(time.perf_counter() - t0, 1)
            result["smoke"] = args.smoke
            if args.smoke:  # the plumbing ran; no GPU, nothing to judge
                result["pass"] = None
            results["checks"][name] = result
            print(
                f"{name:14} {VERDICTS[result.get('pass')]:5}  {result['seconds_total']:6.1f} s  "
                + json.dumps({k: v for k, v in result.items() if k in _SHOWN}, default=str)
            )
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=1, default=str))
    return 0 if args.smoke or all(results["checks"][n].get("pass") for n in names) else 1


VERDICTS = {True: "PASS", False: "FAIL", None: "SMOKE"}
_SHOWN = {
    "prediction_tried",
    "first_finding",
    "peak_worst_rel_diff",
    "categories_share_of_peak",
    "failing_line",
    "overhead",
    "predicted_max",
    "true_max",
    "relative_error",
    "knee",
    "gain_into_knee",
    "gain_past_knee",
    "latency_pick",
    "error",
}

if __name__ == "__main__":
    sys.exit(main())
